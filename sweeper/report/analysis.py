"""From a sweep's points to an answer: which are eligible for the objective and the configuration to use,
with the reason in words. Its parts live beside it and are re-exported here: trials.py (runs folded over
seeds), noninferiority.py (the "not worse" rule), front.py (knees, Pareto front), lr.py (the LR table),
output.py (override line, YAML); recipes compared: recipes.py. Pure (stdlib; scipy.stats via report.stats)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, Iterable, List, Optional, Tuple

from sweeper.errors import ConfigError
from sweeper.report import stats
from sweeper.report.front import knee, knees, pareto
from sweeper.report.lr import LrRow, lr_table
from sweeper.report.noninferiority import (  # noqa: F401
    Gap,
    certifying_drop,
    _gap_text,
    _hits,
    _settle_text,
    gap_interval,
    gap_words,
    judge_gap,
    judge_matched,
    one_sided,
)
from sweeper.report.output import override_line, recommendation_yaml
from sweeper.report.settings import OBJECTIVES, ReportConfig, check
from sweeper.report.stats import Interval
from sweeper.report.trials import (  # noqa: F401
    _STATUS_ORDER,
    PointSummary,
    Recommendation,
    Trial,
    accuracy_interval,
    loss_interval,
    replicates,
    seconds_to_train,
    summarize,
    summarize_all,
)

GiB = 2**30
# Objective "accuracy" only: a floor under the accuracy tie: accuracies this close (absolute, as fractions)
# are one result even when the test over seeds separates them, so throughput decides between them. Gaps
# above it are ties only when the data cannot separate them (compare_accuracy). report.max_accuracy_drop
# uses non-inferiority instead (judge_gap): no floor, the gap's interval must be certified.
ACCURACY_TIE = 0.005
MAX_RUNNERS_UP = 3


# ---------------------------------------------------------------------------------------------------
# Telling accuracies apart


@dataclass(frozen=True)
class AccuracyTest:
    """Whether the data separate two points' accuracies at a confidence level, and how that was decided."""

    separable: bool
    how: str  # e.g. "Welch's t-test over 3 seeds each, p = 0.21 >= 0.05"
    tested: bool  # False: no noise estimate (one seed, no val_samples), the figures alone decided


def compare_accuracy(a: PointSummary, b: PointSummary, level: float = 0.95) -> AccuracyTest:
    """Welch's t-test over seeds (two-sided, separable when p < 1 - level) when both points have at
    least two seeds with an accuracy; else their confidence intervals (`PointSummary.accuracy`: the
    Wilson interval with one seed) separate them when they do not overlap. With no interval at all (one
    seed and no recorded val_samples, e.g. a record from before them) nothing measures the noise:
    the accuracies are taken at face value, as separable, and `tested` is False."""
    xa, xb = a.accuracies, b.accuracies
    if len(xa) >= 2 and len(xb) >= 2:
        p = stats.welch_p(xa, xb)
        seeds = f"{len(xa)} seeds each" if len(xa) == len(xb) else f"{len(xa)} and {len(xb)} seeds"
        separable = p < 1.0 - level
        return AccuracyTest(separable, f"Welch's t-test over {seeds}, p = {p:.2g} "
                                       f"{'<' if separable else '>='} {1.0 - level:.2g}", True)
    if a.accuracy is not None and b.accuracy is not None:
        kinds = [_interval_kind(a.accuracy), _interval_kind(b.accuracy)]
        how = kinds[0].replace("interval", "intervals", 1) if kinds[0] == kinds[1] else " vs ".join(kinds)
        return AccuracyTest(not a.accuracy.overlaps(b.accuracy), how, True)
    return AccuracyTest(True, "no interval: one seed and no val_samples recorded", False)


def _interval_kind(interval: Interval) -> str:
    if interval.sd is None:
        return f"Wilson interval of {interval.n} validation samples, one seed"
    return f"t interval over {interval.n} seeds"


def _accuracy_text(point: PointSummary) -> str:
    """'0.780 [0.737, 0.819]' with an interval, else '0.780'."""
    if point.accuracy is not None:
        return point.accuracy.text()
    return "-" if point.trial.val_accuracy is None else f"{point.trial.val_accuracy:.3f}"


def _tie_sentence(a: PointSummary, b: PointSummary, test: AccuracyTest, level: float) -> str:
    return (f"{a.key} ({_accuracy_text(a)}) and {b.key} ({_accuracy_text(b)}) cannot be told apart at "
            f"{stats.percent(level)} ({test.how}): treated as a tie")


# ---------------------------------------------------------------------------------------------------
# Recommendation




_METRIC_NAMES = {
    "throughput": "samples_per_second",
    "accuracy": "val_accuracy",
    "time_to_accuracy": "training time (samples_seen and samples_per_second, or train_seconds)",
    "time_to_target": "time_to_target_seconds",
}
# What to change when points diverge (Goyal et al. 2017: warmup; sqrt scaling grows the LR slower).
TRY_INSTEAD = ("try a lower LR (a lower optim.lr, or sweep.lr_multipliers below 1, e.g. [0.25,0.5]), "
               "a warmup (train.warmup_steps), or another train.lr_scaling rule (sqrt grows the LR "
               "more slowly than linear)")


def _has_metric(trial: Trial, objective: str) -> bool:
    if objective == "throughput":
        return trial.samples_per_second is not None
    if objective == "accuracy":
        return trial.val_accuracy is not None
    if objective == "time_to_target":
        return trial.time_to_target_seconds is not None
    return seconds_to_train(trial) is not None


def _missing_metric(point: PointSummary, objective: str) -> str:
    if objective == "time_to_target":
        n = len(point.replicates)
        if any(t.reached_target is False for t in point.replicates):
            return f"did not reach the target in any of its {n} seed{'s' if n > 1 else ''}"
        return "no time_to_target_seconds (set eval.target_accuracy or eval.target_loss for the sweep)"
    return f"no {_METRIC_NAMES[objective]}"


def _over_budget(trial: Trial, memory_budget_bytes: Optional[float]) -> Optional[str]:
    if memory_budget_bytes is None:
        return None
    if trial.peak_memory_bytes is None:
        # An unmeasured trial cannot be shown to fit, and recommending it could OOM the real run.
        return f"no peak_memory_bytes to check against {_budget_text(memory_budget_bytes)}"
    if trial.peak_memory_bytes > memory_budget_bytes:
        return (
            f"peak_memory_bytes {_bytes(trial.peak_memory_bytes)} over "
            f"{_budget_text(memory_budget_bytes)}"
        )
    return None


def _under_accuracy(trial: Trial, min_accuracy: Optional[float]) -> Optional[str]:
    if min_accuracy is None:
        return None
    if trial.val_accuracy is None:
        return f"no val_accuracy to check against report.min_accuracy={min_accuracy:g}"
    if trial.val_accuracy < min_accuracy:
        return f"val_accuracy {trial.val_accuracy:.3f} under report.min_accuracy={min_accuracy:g}"
    return None


def _check_inputs(
    objective: str,
    min_accuracy: Optional[float],
    memory_budget_bytes: Optional[float],
    max_accuracy_drop: Optional[float],
    level: float,
) -> None:
    budget_gb = None if memory_budget_bytes is None else memory_budget_bytes / GiB
    settings = ReportConfig(objective, min_accuracy, max_accuracy_drop, budget_gb)
    # The objective is named as this function's argument, the limits as the report.* settings users give.
    problems = check(settings, key=lambda name: name if name == "objective" else f"report.{name}")
    if not 0.0 < level < 1.0:
        problems.append(f"level={level}: must be a confidence level between 0 and 1, e.g. 0.95")
    if problems:
        raise ConfigError(problems)


def recommend(
    trials: Iterable[Trial],
    objective: str = "throughput",
    min_accuracy: Optional[float] = None,
    memory_budget_bytes: Optional[float] = None,
    max_accuracy_drop: Optional[float] = None,
    level: float = 0.95,
    critical_batch: Optional[Any] = None,
) -> Recommendation:
    """The best point for `objective` among the eligible ones, up to three runners-up, and why
    (docs/recommendation.md states the rules in full).

    Points, not runs: a point's seed replicates are one candidate with their mean figures and its
    worst replicate's status (`summarize`), so one that diverged in some seeds is not eligible.
    Eligible: ok, the objective's metric measured, within `memory_budget_bytes` and `min_accuracy`.
    `max_accuracy_drop` (throughput, time_to_accuracy, time_to_target) is non-inferiority: a point other than the
    most accurate one stays eligible only when the `level` interval of its accuracy gap to it
    (`gap_interval`: paired t over common seeds, else Newcombe) lies wholly above -max_accuracy_drop;
    wholly below is excluded, neither is "unproven" (`Recommendation.unproven`), never recommended.
    An ok point whose pooled validation hits are not separated from chance (1 / `Trial.num_classes`,
    when known) is not eligible, as a `did_not_learn` one. Objectives:
    "throughput" (mean samples/s); "accuracy" (mean val_accuracy, points not separable from the
    best or within ACCURACY_TIE a tie that throughput breaks); "time_to_accuracy" (time to train
    the budget among points reaching `min_accuracy`, required); "time_to_target" (mean
    time_to_target_seconds; missing the target in some seeds ranks behind reaching it in all).
    `critical_batch` (as report.critical_batch.CriticalBatch: `critical_batch_size`, `steps(B)`)
    makes a time_to_target winner over twice the critical batch size say what it costs in samples.
    """
    _check_inputs(objective, min_accuracy, memory_budget_bytes, max_accuracy_drop, level)
    points = summarize_all(trials, level)
    eligible, excluded = _eligible(list(points.values()), objective, min_accuracy, memory_budget_bytes, level)
    diverged = {p.key: _diverged_text(p) for p in points.values()
                if any(t.status == "diverged" for t in p.replicates)}
    done = partial(Recommendation, excluded=excluded, objective=objective, points=points, diverged=diverged,
                   level=level)
    if not eligible:
        reason = _nobody_reason(list(points.values()), objective, min_accuracy, memory_budget_bytes, level)
        if diverged and not reason.startswith("every point diverged"):
            reason += ". " + _diverged_note(diverged)
        return done(best=None, runners_up=[], reason=reason)

    dropped: List[PointSummary] = []
    top: Optional[PointSummary] = None
    ties: Dict[str, str] = {}
    unproven: Dict[str, str] = {}
    gaps: Dict[str, Gap] = {}
    if max_accuracy_drop is not None and objective in ("throughput", "time_to_accuracy", "time_to_target"):
        eligible, dropped, top, gaps = _within_accuracy_drop(eligible, max_accuracy_drop, excluded, unproven, level)
    ranked = _rank(eligible, objective, level)
    best = ranked[0]
    reason = _winner_reason(best, ranked, objective, min_accuracy, ties, level)
    # The points the objective alone would have preferred: the reason says why they lost.
    in_order = _rank([*dropped, best], objective, level)
    passed_over = in_order[: in_order.index(best)]
    if passed_over:
        reason += " " + _accuracy_drop_note(passed_over, max_accuracy_drop, top, level, best, gaps)
    extra = [_certified_note(best, top, max_accuracy_drop, gaps, level),
             _diverged_note(diverged) if diverged else None]
    if objective == "time_to_target" and critical_batch is not None:
        extra.append(_critical_batch_note(best.trial, critical_batch))
    reason = " ".join([reason, *(e for e in extra if e)])
    return done(best=best.trial, runners_up=[p.trial for p in ranked[1: 1 + MAX_RUNNERS_UP]], reason=reason,
                ties=ties, unproven=unproven)


def _eligible(
    points: List[PointSummary], objective: str, min_accuracy: Optional[float], memory_budget_bytes: Optional[float],
    level: float = 0.95,
) -> Tuple[List[PointSummary], Dict[str, str]]:
    """(eligible points, point key -> why not) before the accuracy guard."""
    excluded: Dict[str, str] = {}
    eligible: List[PointSummary] = []
    for point in points:
        trial = point.trial
        if trial.status != "ok":
            excluded[point.key] = _not_ok_text(point)
            continue
        if _not_learned(point, level):
            excluded[point.key] = _chance_text(point)
            continue
        problems = [] if _has_metric(trial, objective) else [_missing_metric(point, objective)]
        for problem in (_over_budget(trial, memory_budget_bytes), _under_accuracy(trial, min_accuracy)):
            if problem:
                problems.append(problem)
        if problems:
            excluded[point.key] = "; ".join(problems)
        else:
            eligible.append(point)
    return eligible, excluded


DID_NOT_LEARN_TRY = "try a lower or higher LR, another optimizer (optim=adamw), more epochs (train.epochs)"


def _chance_text(point: PointSummary) -> str:
    accuracy = "-" if point.trial.val_accuracy is None else f"{point.trial.val_accuracy:.3f}"
    classes = point.trial.num_classes
    chance = f"1/{classes}" if classes else "1/classes"
    return f"did not learn (val accuracy {accuracy} at chance {chance}): {DID_NOT_LEARN_TRY}"


def _not_learned(point: PointSummary, level: float) -> bool:
    """An ok point whose validation hits pooled over its seeds are not separated from chance
    (1 / num_classes) at `level`; False when the class count or the hits are unknown."""
    classes = point.trial.num_classes
    pooled = _hits(point)
    if not classes or classes < 2 or pooled is None:
        return False
    hits, samples = pooled
    return not stats.above_chance(int(round(hits)), samples, 1.0 / classes, level)


def _not_ok_text(point: PointSummary) -> str:
    if point.trial.status == "diverged":
        return _diverged_text(point)
    if point.trial.status == "did_not_learn":
        return _chance_text(point)
    status, members = point.trial.status, point.replicates
    worst = [t for t in members if t.status == status]
    why = " (sweep.strategy=smart stopped its accuracy class early: see its sweeper.stopped tag)" \
        if status == "stopped" else ""
    if len(worst) == len(members):
        return f"status {status}{why}"
    seeds = ", ".join(f"s{t.seed}" for t in worst if t.seed is not None)
    return (f"status {status} in {len(worst)} of {len(members)} seeds{f' ({seeds})' if seeds else ''}{why}: "
            "a point is eligible only when every seed ended ok")


def _diverged_text(point: PointSummary) -> str:
    """'diverged (nonfinite at step 12) at lr 0.8', or which seeds diverged when not all did."""
    bad = [t for t in point.replicates if t.status == "diverged"]
    several = len(point.replicates) > 1
    what = ", ".join(
        (t.diverged_reason or "unknown reason")
        + ("" if t.diverged_at_step is None else f" at step {t.diverged_at_step}")
        + (f" in seed {t.seed}" if several and t.seed is not None else "")
        for t in bad
    )
    lr = "" if point.trial.lr is None else f" at lr {point.trial.lr:.4g}"
    if len(bad) < len(point.replicates):
        return (f"diverged in {len(bad)} of {len(point.replicates)} seeds ({what}){lr}: a layout that diverges "
                "in some seeds is not eligible")
    return f"diverged ({what}){lr}"


def _diverged_note(diverged: Dict[str, str]) -> str:
    shown = list(diverged.items())[:MAX_RUNNERS_UP]
    listed = "; ".join(f"{key} {text}" for key, text in shown)
    more = f"; and {len(diverged) - len(shown)} more" if len(diverged) > len(shown) else ""
    return f"Not eligible because they diverged: {listed}{more}. To train at such a batch, {TRY_INSTEAD}."


def _within_accuracy_drop(
    eligible: List[PointSummary], max_drop: float, excluded: Dict[str, str], unproven: Dict[str, str], level: float
) -> Tuple[List[PointSummary], List[PointSummary], Optional[PointSummary], Dict[str, Gap]]:
    """(kept, dropped, the most accurate, gaps by key): non-inferiority. The most accurate point is
    kept; another only when the interval of its gap to it (`gap_interval`) lies wholly above
    -`max_drop` (certified not worse). Shown worse (wholly below) goes to `excluded`, neither to
    `unproven`. All kept when none measured accuracy."""
    measured = [p for p in eligible if p.trial.val_accuracy is not None]
    if not measured:
        return eligible, [], None, {}
    top = max(measured, key=lambda p: (p.trial.val_accuracy, p.key))
    kept, dropped, gaps = [], [], {}
    pct = stats.percent(level)
    for point in eligible:
        if point.trial.val_accuracy is None:
            excluded[point.key] = "no val_accuracy to compare with the best (report.max_accuracy_drop)"
            dropped.append(point)
            continue
        gap = gaps[point.key] = judge_gap(point, top, max_drop, level)
        if gap.outcome == "eligible":
            kept.append(point)
            continue
        dropped.append(point)
        if gap.outcome == "unproven":
            unproven[point.key] = (
                f"faster but unproven: its val_accuracy gap to the best ({top.key}) is {_gap_text(gap.interval)}, "
                f"neither wholly above nor wholly below -{max_drop:g} (report.max_accuracy_drop); "
                f"{_settle_text(gap.interval, max_drop, level)}")
            excluded[point.key] = unproven[point.key]
            continue
        shown = (f", shown at {pct}: its gap is {_gap_text(gap.interval)}" if gap.interval is not None
                 else " (one seed and no validation-set size recorded: no interval tested the gap)")
        excluded[point.key] = (
            f"val_accuracy {_accuracy_text(point)} is more than report.max_accuracy_drop={max_drop:g} "
            f"below the best, {_accuracy_text(top)} ({top.key}){shown}"
        )
    return kept, dropped, top, gaps


def _accuracy_drop_note(
    passed_over: List[PointSummary], max_drop: float, top: PointSummary, level: float, best: PointSummary,
    gaps: Dict[str, Gap],
) -> str:
    pct = stats.percent(level)
    worse = [p for p in passed_over if p.key not in gaps or gaps[p.key].outcome == "excluded"]
    unproven = [p for p in passed_over if p.key in gaps and gaps[p.key].outcome == "unproven"]
    sentences = []
    if unproven:
        shown = unproven[:MAX_RUNNERS_UP]
        listed = "; ".join(f"{p.key} ({_rate_text(p.trial)}, gap to the best {_gap_text(gaps[p.key].interval)}: "
                           f"{_settle_text(gaps[p.key].interval, max_drop, level)})" for p in shown)
        more = f"; and {len(unproven) - len(shown)} more" if len(unproven) > len(shown) else ""
        sentences.append(f"Not recommended, faster but unproven (the data neither certify them within "
                         f"report.max_accuracy_drop={max_drop:g} of the best, {top.key}, at {pct} nor show them "
                         f"worse): {listed}{more}.")
    if worse:
        shown = worse[:MAX_RUNNERS_UP]
        listed = ", ".join(f"{p.key} ({_rate_text(p.trial)}, val_accuracy {_accuracy_text(p)})" for p in shown)
        more = f" and {len(worse) - len(shown)} more" if len(worse) > len(shown) else ""
        lead = (f"Not recommended although faster: {listed}{more}: their accuracy is more than "
                f"report.max_accuracy_drop={max_drop:g} below the best ({top.trial.val_accuracy:.3f}, {top.key})")
        if any(p.trial.val_accuracy is None for p in worse):
            sentences.append(f"{lead} or was not measured.")
        elif all(gaps[p.key].interval is not None for p in shown):
            sentences.append(f"{lead}, shown at {pct} (the interval of the gap lies wholly below "
                             f"-{max_drop:g}), so they learn less from the same samples.")
        else:
            sentences.append(f"{lead}, so they learn less from the same samples (one seed and no validation-set "
                             "size recorded: no interval tested the gap).")
    if best is top:
        fastest = passed_over[0]
        gap = gaps.get(fastest.key)
        text = (f"No point faster than {top.key} is certified within report.max_accuracy_drop={max_drop:g} of "
                f"it at {pct}")
        if gap is not None and gap.interval is not None:
            text += (f"; {fastest.key} is within {certifying_drop(gap.interval) * 100:.1f} points of the best at "
                     f"{pct}")
            # The fastest may be shown worse: the fastest point a wider tolerance could still certify
            # is the figure to act on.
            closest = next((p for p in unproven if gaps[p.key].interval is not None), None)
            if closest is not None and closest is not fastest:
                text += (f", {closest.key}, the fastest not shown worse, within "
                         f"{certifying_drop(gaps[closest.key].interval) * 100:.1f}")
        sentences.append(text + ".")
        if unproven:
            # The fallback is this run's most accurate point, not one certified better than the
            # unproven ones: another seed set may rank them the other way (issue 27).
            sentences.append(f"{top.key} is this run's most accurate point, not certified better than the "
                             f"unproven ones: another seed set may pick {unproven[0].key}.")
    return " ".join(sentences)


def _certified_note(best: PointSummary, top: Optional[PointSummary], max_drop: Optional[float],
                    gaps: Dict[str, Gap], level: float) -> Optional[str]:
    """Where the recommended point's accuracy stands against the most accurate one's."""
    if top is None or best is top:
        return None
    gap = gaps.get(best.key)
    if gap is None or gap.interval is None:
        return (f"Its val_accuracy {_accuracy_text(best)} is within report.max_accuracy_drop={max_drop:g} of the "
                f"best, {_accuracy_text(top)} ({top.key}) (one seed and no validation-set size recorded: no "
                "interval tested the gap).")
    return (f"Certified not worse: its val_accuracy {_accuracy_text(best)} against the best, {_accuracy_text(top)} "
            f"({top.key}), has a gap of {_gap_text(gap.interval)}, wholly above "
            f"-{max_drop:g} (report.max_accuracy_drop).")


def _rank(eligible: List[PointSummary], objective: str, level: float) -> List[PointSummary]:
    # The key is the last sort criterion everywhere, so equal figures give the same answer every run.
    if objective == "throughput":
        return sorted(eligible, key=lambda p: (-p.trial.samples_per_second, p.key))
    if objective == "time_to_accuracy":
        return sorted(eligible, key=lambda p: (seconds_to_train(p.trial), p.key))
    if objective == "time_to_target":
        # A point that missed the target in some seeds ranks behind every one that reached it in all.
        return sorted(eligible, key=lambda p: (not p.reached_in_every_seed, p.trial.time_to_target_seconds, p.key))
    # A tie is not transitive, so the order is built greedily: take the most accurate remaining
    # point's tie group, pick its fastest member, repeat.
    remaining = sorted(eligible, key=lambda p: p.key)
    ranked: List[PointSummary] = []
    while remaining:
        pick = min(_tie_group(remaining, level), key=lambda p: (-_rate(p.trial), -p.trial.val_accuracy, p.key))
        ranked.append(pick)
        remaining.remove(pick)
    return ranked


def _tie_group(points: List[PointSummary], level: float) -> List[PointSummary]:
    """The most accurate of `points` and those tied with it (`_tied`)."""
    top = max(points, key=lambda p: (p.trial.val_accuracy, p.key))
    return [p for p in points if p is top or _tied(p, top, level)]


def _tied(point: PointSummary, top: PointSummary, level: float) -> bool:
    """Within ACCURACY_TIE of `top` (a floor: too small a gap to matter), or not separable from it."""
    # The epsilon keeps decimal ties exact: 0.962 - 0.005 is not 0.957 in binary floating point.
    if point.trial.val_accuracy >= top.trial.val_accuracy - ACCURACY_TIE - 1e-12:
        return True
    return not compare_accuracy(point, top, level).separable


def _rate(trial: Trial) -> float:
    return trial.samples_per_second if trial.samples_per_second is not None else -math.inf


def _winner_reason(
    best: PointSummary, ranked: List[PointSummary], objective: str, min_accuracy: Optional[float],
    ties: Dict[str, str], level: float,
) -> str:
    if objective == "throughput":
        decided, notes = _throughput_reason(best, ranked)
    elif objective == "accuracy":
        decided, notes = _accuracy_reason(best, ranked, ties, level)
    elif objective == "time_to_target":
        decided, notes = _target_reason(best, ranked)
    else:
        decided, notes = _time_to_accuracy_reason(best, ranked, min_accuracy)
    if best.trial.throughput_stable is False:
        notes.insert(0, "its throughput was unstable (the last timing windows disagreed, so the figure is the "
                        "median of all windows): re-measure before relying on it")
    sentences = decided + "."
    if notes:
        sentences += " " + _capitalize("; ".join(notes)) + "."
    return sentences


def _eligible_count(ranked: List[PointSummary]) -> str:
    n = len(ranked)
    seeds = {len(p.replicates) for p in ranked}
    over = ""
    if len(seeds) == 1 and max(seeds) > 1:
        over = f", {'each ' if n > 1 else ''}the mean over its {seeds.pop()} seeds"
    return f"{n} eligible point{'s' if n > 1 else ''}{over}"


def _throughput_reason(best: PointSummary, ranked: List[PointSummary]) -> Tuple[str, List[str]]:
    b = best.trial
    decided = (f"{best.key} has the highest throughput of {_eligible_count(ranked)}: "
               f"{b.samples_per_second:.1f} samples/s{_at_memory(b)}")
    notes: List[str] = []
    if len(ranked) > 1:
        other = ranked[1].trial
        decided += f" (next: {other.key}, {other.samples_per_second:.1f} samples/s)"
        notes += _noise_note(b, other, _relative_gap(b.samples_per_second, other.samples_per_second), "throughput")
    return decided, notes


def _accuracy_reason(
    best: PointSummary, ranked: List[PointSummary], ties: Dict[str, str], level: float
) -> Tuple[str, List[str]]:
    b = best.trial
    top = max(ranked, key=lambda p: (p.trial.val_accuracy, p.key))
    group = [p for p in ranked if p is top or _tied(p, top, level)]
    for p in group:
        if p is not top and p.trial.val_accuracy < top.trial.val_accuracy - ACCURACY_TIE - 1e-12:
            ties[p.key] = _tie_sentence(p, top, compare_accuracy(p, top, level), level)
    rivals = [p for p in group if p is not best]
    if not rivals or b.samples_per_second is None:
        decided = (f"{best.key} has the highest val_accuracy of {_eligible_count(ranked)}: "
                   f"{_accuracy_text(best)} at {_rate_text(b)}")
        if len(ranked) > 1:
            decided += f" (next: {ranked[1].key}, {_accuracy_text(ranked[1])})"
        return decided, []
    # The tie was broken by throughput: show it against the fastest of the others it tied with.
    rival = max(rivals, key=lambda p: (_rate(p.trial), p.trial.val_accuracy))
    if best is not top and best.key in ties:
        test = compare_accuracy(best, top, level)
        standing = (f"{best.key} has val_accuracy {_accuracy_text(best)}, which the data cannot tell apart from the "
                    f"best, {_accuracy_text(top)} ({top.key}), at {stats.percent(level)} ({test.how}), and is the "
                    "fastest of that tie")
    elif best is not top:
        standing = (f"{best.key} has val_accuracy {_accuracy_text(best)}, within {ACCURACY_TIE} of the best "
                    f"({top.trial.val_accuracy:.3f}, {top.key}), and is the fastest of that tie")
    else:
        noise = any(p.key in ties for p in rivals)
        standing = (f"{best.key} has the highest val_accuracy ({_accuracy_text(best)}) and is the fastest of the "
                    f"points {'the data cannot separate from it' if noise else f'within {ACCURACY_TIE} of it'}")
    decided = f"{standing}: {_rate_text(b)} vs {_rate_text(rival.trial)} for {rival.key} ({_accuracy_text(rival)})"
    notes: List[str] = []
    if rival.trial.samples_per_second is not None:
        gap = _relative_gap(b.samples_per_second, rival.trial.samples_per_second)
        notes += _noise_note(b, rival.trial, gap, "throughput", "the fastest other of the tie")
    return decided, notes


def _target_reason(best: PointSummary, ranked: List[PointSummary]) -> Tuple[str, List[str]]:
    b = best.trial
    seeds = len(best.replicates)
    over = f" (the mean over the {best.reached} of {seeds} seeds that reached it)" \
        if best.reached < seeds else ""
    figures = ", ".join(f for f in (
        None if b.samples_to_target is None else f"{b.samples_to_target:.0f} samples",
        None if b.steps_to_target is None else f"{b.steps_to_target:.0f} steps") if f)
    decided = (f"{best.key} reaches the target the soonest of {_eligible_count(ranked)}: "
               f"{_seconds(b.time_to_target_seconds)}{over}{f', {figures}' if figures else ''}")
    if len(ranked) > 1:
        decided += f" (next: {ranked[1].key}, {_seconds(ranked[1].trial.time_to_target_seconds)})"
    notes: List[str] = []
    if not best.reached_in_every_seed:
        notes.append(f"no eligible point reached the target in every seed; {best.key} reached it in "
                     f"{best.reached} of {seeds}")
    # Only those the rule put behind: a partial point slower than the winner would lose anyway.
    partial = [p for p in ranked if not p.reached_in_every_seed and p is not best
               and p.trial.time_to_target_seconds < b.time_to_target_seconds]
    if partial:
        listed = ", ".join(f"{p.key} ({_seconds(p.trial.time_to_target_seconds)}, reached in {p.reached} of "
                           f"{len(p.replicates)} seeds)" for p in partial[:MAX_RUNNERS_UP])
        notes.append(f"ranked behind every point that reached the target in all its seeds, although faster when "
                     f"they did: {listed}")
    return decided, notes


def _time_to_accuracy_reason(
    best: PointSummary, ranked: List[PointSummary], min_accuracy: Optional[float]
) -> Tuple[str, List[str]]:
    b, n = best.trial, len(ranked)
    decided = (
        f"{best.key} trains its budget the fastest of {n} point{'s' if n > 1 else ''} reaching "
        f"report.min_accuracy={min_accuracy:g}: {seconds_to_train(b):.1f} s{_samples_text(b)}, "
        f"val_accuracy {_accuracy_text(best)}"
    )
    notes: List[str] = []
    if n > 1:
        other = ranked[1].trial
        other_seconds = seconds_to_train(other)
        decided += f" (next: {other.key}, {other_seconds:.1f} s)"
        # Measured against the slower time, this gap is the throughput gap when the budgets match.
        notes += _noise_note(b, other, _relative_gap(other_seconds, seconds_to_train(b)), "training time")
    return decided, notes


def _critical_batch_note(best: Trial, critical_batch: Any) -> Optional[str]:
    """What a global batch over twice the critical batch size costs in samples to the target: by the
    fit, S(B) B against S(B_crit) B_crit (= 2 E_min), i.e. (B + B_crit) / (2 B_crit) times as many."""
    b_crit, batch = float(critical_batch.critical_batch_size), best.global_batch_size
    if not (math.isfinite(b_crit) and b_crit > 0) or batch <= 2 * b_crit:
        return None
    at_best, at_crit = critical_batch.steps(batch) * batch, critical_batch.steps(b_crit) * b_crit
    measured = "" if best.samples_to_target is None else f" (measured: {best.samples_to_target:.0f})"
    return (f"Its global batch {batch} is {batch / b_crit:.1f}x the critical batch size (~{b_crit:.0f}): the fit "
            f"puts its samples to the target at {at_best:.0f}{measured} against {at_crit:.0f} at a global batch of "
            f"~{b_crit:.0f}, {at_best / at_crit:.1f}x the data for its speed; choose a global batch near "
            f"{b_crit:.0f} when samples or compute cost more than time.")


def _relative_gap(larger: float, smaller: float) -> float:
    return (larger - smaller) / larger if larger > 0 else math.inf


def _noise_note(best: Trial, other: Trial, gap: float, what: str, who: str = "the next") -> List[str]:
    """'within noise' when the winner's relative margin over `other` is no larger than the
    window-to-window spread (cv) either of them measured: a re-run could swap them."""
    spreads = [cv for cv in (best.samples_per_second_cv, other.samples_per_second_cv) if cv is not None]
    if not spreads:
        return []
    spread = max(spreads)
    if gap > spread:
        return []
    return [
        f"{who}, {other.key}, is within noise: the {what} gap ({gap:.1%}) is within the measured spread "
        f"(cv {spread:.1%}), so either will do"
    ]


def _nobody_reason(
    points: List[PointSummary], objective: str, min_accuracy: Optional[float], memory_budget_bytes: Optional[float],
    level: float = 0.95,
) -> str:
    # The constraints are applied in a fixed order; the reason names the one that removed the last
    # candidates, with the closest miss, since that is the constraint a user would relax.
    if not points:
        return "no points to choose from"
    ok = [p.trial for p in points if p.trial.status == "ok" and not _not_learned(p, level)]
    if not ok:
        return _nothing_ok_reason(points, level)
    measured = [t for t in ok if _has_metric(t, objective)]
    if not measured:
        hint = {"accuracy": " (synthetic data has none)",
                "time_to_target": " (set eval.target_accuracy or eval.target_loss; or no point reached it)"}
        return f"no ok point has {_METRIC_NAMES[objective]}{hint.get(objective, '')}"
    fitting = [t for t in measured if _over_budget(t, memory_budget_bytes) is None]
    if not fitting:
        with_memory = [t for t in measured if t.peak_memory_bytes is not None]
        if not with_memory:
            return f"no ok point has a peak_memory_bytes to check against {_budget_text(memory_budget_bytes)}"
        smallest = min(with_memory, key=lambda t: (t.peak_memory_bytes, t.key))
        return (
            f"no ok point fits {_budget_text(memory_budget_bytes)}: "
            f"the smallest peak was {_bytes(smallest.peak_memory_bytes)} ({smallest.key})"
        )
    within = " within report.memory_budget_gb" if memory_budget_bytes is not None else ""
    with_accuracy = [t for t in fitting if t.val_accuracy is not None]
    if not with_accuracy:
        return f"no ok point{within} has a val_accuracy to check against report.min_accuracy={min_accuracy:g}"
    closest = max(with_accuracy, key=lambda t: (t.val_accuracy, t.key))
    return (
        f"no ok point{within} reached report.min_accuracy={min_accuracy:g} "
        f"(best was {closest.val_accuracy:.3f}, {closest.key})"
    )


def _nothing_ok_reason(points: List[PointSummary], level: float = 0.95) -> str:
    counts = Counter("did_not_learn" if p.trial.status == "ok" and _not_learned(p, level) else p.trial.status
                     for p in points)
    if "did_not_learn" in counts and set(counts) <= {"did_not_learn", "diverged"}:
        listed = "; ".join(f"{p.key} {_diverged_text(p) if p.trial.status == 'diverged' else _chance_text(p)}"
                           for p in points[:MAX_RUNNERS_UP])
        more = f"; and {len(points) - MAX_RUNNERS_UP} more" if len(points) > MAX_RUNNERS_UP else ""
        what = ("every point did not learn" if set(counts) == {"did_not_learn"}
                else f"no point learned ({counts['did_not_learn']} did not learn, {counts['diverged']} diverged)")
        return f"{what}, so there is nothing to recommend: {listed}{more}"
    if set(counts) == {"diverged"}:
        listed = "; ".join(f"{p.key} {_diverged_text(p)}" for p in points[:MAX_RUNNERS_UP])
        more = f"; and {len(points) - MAX_RUNNERS_UP} more" if len(points) > MAX_RUNNERS_UP else ""
        return (f"every point diverged ({len(points)} of {len(points)}), so there is nothing to recommend: "
                f"{listed}{more}. {_capitalize(TRY_INSTEAD)}")
    listed = ", ".join(f"{count} {status}" for status, count in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
    return f"no point finished ok: {listed}"


def _seconds(value: float) -> str:
    """12.0 s, 0.0777 s: a tenth of a second is no resolution for a small model's time to target."""
    return f"{value:.1f} s" if value >= 1 else f"{value:.3g} s"


def _at_memory(trial: Trial) -> str:
    return f" at peak memory {_bytes(trial.peak_memory_bytes)}" if trial.peak_memory_bytes is not None else ""


def _rate_text(trial: Trial) -> str:
    if trial.samples_per_second is None:
        return "unmeasured throughput"
    return f"{trial.samples_per_second:.1f} samples/s"


def _samples_text(trial: Trial) -> str:
    if trial.samples_seen is not None and trial.samples_per_second:
        return f" for {trial.samples_seen:.0f} samples at {trial.samples_per_second:.1f} samples/s"
    return " of wall-clock training"


def _budget_text(memory_budget_bytes: float) -> str:
    # The key's own value so it can be copied back, then the size in bytes' units.
    return f"report.memory_budget_gb={memory_budget_bytes / 2**30:g} ({_bytes(memory_budget_bytes)})"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


__all__ = [
    "ACCURACY_TIE",
    "OBJECTIVES",
    "AccuracyTest",
    "LrRow",
    "PointSummary",
    "Recommendation",
    "Trial",
    "Gap",
    "accuracy_interval",
    "gap_interval",
    "judge_gap",
    "judge_matched",
    "gap_words",
    "compare_accuracy",
    "knee",
    "knees",
    "loss_interval",
    "lr_table",
    "override_line",
    "pareto",
    "recommend",
    "recommendation_yaml",
    "replicates",
    "seconds_to_train",
    "summarize",
    "summarize_all",
]
