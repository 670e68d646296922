"""From a sweep's points to an answer: which are eligible for the objective and the configuration to use,
with the reason in words. Its parts live beside it and are re-exported here: quality.py (what "better"
means: accuracy or a loss, its intervals), trials.py (runs folded over seeds), eligibility.py (which
points may be recommended at all), noninferiority.py (the "not worse" rule), ties.py (objective
accuracy's ties), reasons.py (the words), tradeoffs.py (knees, Pareto front), lr.py (the LR table),
output.py (override line, YAML); recipes compared: recipe_comparison.py. Pure (stdlib; scipy.stats via
sweeper.stats)."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from sweeper.errors import ConfigError
from sweeper import stats
from sweeper.report import classes, eligibility, reasons, ties
from sweeper.report.tradeoffs import knee, knees, pareto
from sweeper.report.lr import LrRow, lr_table
from sweeper.report import noninferiority
from sweeper.report.noninferiority import (  # noqa: F401
    Gap,
    _settle_text,
    certifying_drop,
    gap_interval,
    gap_words,
    judge_gap,
    judge_matched,
    one_sided,
)
from sweeper.report.output import override_line, recommendation_yaml
from sweeper.report.quality import ACCURACY, AUTO, Quality, resolve, tolerance, unrecorded
from sweeper.config.report import OBJECTIVES, QUALITY_CHOICES, ReportConfig, check
from sweeper.report.ties import ACCURACY_TIE  # noqa: F401
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
MAX_RUNNERS_UP = 3


def _check_inputs(objective: str, min_accuracy: Optional[float], memory_budget_bytes: Optional[float],
                  max_accuracy_drop: Optional[float], level: float, quality: Union[str, Quality],
                  max_loss_rise: Optional[float]) -> None:
    budget_gb = None if memory_budget_bytes is None else memory_budget_bytes / GiB
    name = quality.metric if isinstance(quality, Quality) else quality
    builtin = name in QUALITY_CHOICES  # else a metric of eval.metrics_fn's: report.quality_metric
    settings = ReportConfig(objective, min_accuracy, max_accuracy_drop, budget_gb, quality=name if builtin else AUTO,
                            max_loss_rise=max_loss_rise, quality_metric=None if builtin else name)
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
    quality: Union[str, Quality] = AUTO,
    max_loss_rise: Optional[float] = None,
    batch_limit: Optional[eligibility.BatchLimit] = None,
    coupled: Optional[bool] = None,
) -> Recommendation:
    """The best point for `objective` among the eligible ones, up to three runners-up, and why
    (docs/recommendation.md states the rules in full).

    Points, not runs: a point's seed replicates are one candidate with their mean figures and its worst
    replicate's status (`summarize`), so one that diverged in some seeds is not eligible. Eligible: ok,
    learned (eligibility.not_learned), the objective's metric measured, within `memory_budget_bytes`
    and `min_accuracy`; with `batch_limit` (sweep.strategy=branch: the critical batch size the branches
    measured where it flattens, and why), at or below its global batch.

    `quality` (report.quality_metric or report.quality, resolved by report/quality.resolve; a name no run
    recorded is judged by auto's, and the reason says so) is what "better" means; its tolerance is
    `max_accuracy_drop` where higher is better, `max_loss_rise` where lower is, in its units. With a
    tolerance (objectives throughput, time_to_accuracy, time_to_target) it is non-inferiority: a point
    other than the best one stays eligible only when the `level` interval of its quality gap to it
    (`Quality.gap`: paired over common seeds, else the spread over seeds, else the validation sets) lies
    wholly on the right side of the tolerance; wholly on the wrong side is excluded, neither is
    "unproven" (`Recommendation.unproven`), never recommended. Objectives: "throughput" (mean tokens/s
    for a language model, else samples/s); "accuracy" (the best mean quality; a point certified within its
    tie floor ties, and throughput breaks the tie); "time_to_accuracy" (time to train the budget among
    points reaching `min_accuracy`, required); "time_to_target" (mean time_to_target_seconds; missing the
    target in some seeds ranks behind reaching it in all). `critical_batch` (report.critical_batch's
    CriticalBatch) makes a time_to_target winner over twice the critical batch size say what it costs.
    `coupled` (the model has batch-coupled layers; None: unknown) makes the points that train the same model
    one accuracy class (report/classes.py), judged once; the class's fastest layout is the one recommended.
    """
    _check_inputs(objective, min_accuracy, memory_budget_bytes, max_accuracy_drop, level, quality, max_loss_rise)
    trials = list(trials)
    note = None if isinstance(quality, Quality) else unrecorded(quality, trials)
    quality = quality if isinstance(quality, Quality) else resolve(quality, trials)
    # A branch sweep's one trunk measured the quality, not every point: its limit is the rule, not a margin.
    max_drop = None if batch_limit is not None else tolerance(quality, max_accuracy_drop, max_loss_rise)
    points = summarize_all(trials, level)
    eligible, excluded = eligibility.eligible(list(points.values()), objective, min_accuracy, memory_budget_bytes,
                                              level, quality.metric, batch_limit)
    diverged = {p.key: eligibility.diverged_text(p) for p in points.values()
                if any(t.status == "diverged" for t in p.replicates)}
    done = partial(Recommendation, excluded=excluded, objective=objective, points=points, diverged=diverged,
                   level=level, quality=quality.metric)
    if not eligible:
        reason = eligibility.nobody_reason(list(points.values()), objective, min_accuracy, memory_budget_bytes,
                                           level, quality.metric)
        if diverged and not reason.startswith("every point diverged"):
            reason += ". " + eligibility.diverged_note(diverged)
        return done(best=None, runners_up=[], reason=f"{note} {reason}" if note else reason)
    rec = _choose(done, eligible, excluded, objective, min_accuracy, level, quality, max_drop, critical_batch,
                  coupled, diverged)
    return replace(rec, reason=f"{note} {rec.reason}") if note else rec


def _choose(done: Callable[..., Recommendation], eligible: List[PointSummary], excluded: Dict[str, str],
            objective: str, min_accuracy: Optional[float], level: float, quality: Quality, max_drop: Optional[float],
            critical_batch: Optional[Any], coupled: Optional[bool], diverged: Dict[str, str]) -> Recommendation:
    """The recommendation among the eligible points: the quality guard per accuracy class (non-inferiority,
    with a tolerance and an objective that ranks by speed), the ranking, and the reason in words."""
    unproven: Dict[str, str] = {}
    dropped: List[PointSummary] = []
    top: Optional[PointSummary] = None
    gaps: Dict[str, Gap] = {}
    cls = classes.of([p for p in eligible if quality.value(p.trial) is not None], coupled, quality)
    if max_drop is not None and objective in ("throughput", "time_to_accuracy", "time_to_target"):
        eligible, dropped, top, gaps = _within_drop(eligible, max_drop, excluded, unproven, level, quality, cls)
    ranked = _rank(eligible, objective, level, quality, cls)
    best, tie_notes = ranked[0], {}
    reason = reasons.winner(best, ranked, objective, min_accuracy, tie_notes, level, quality, cls)
    # The points the objective alone would have preferred: the reason says why they lost.
    in_order = _rank([*dropped, best], objective, level, quality, cls)
    passed_over = in_order[: in_order.index(best)]
    best_class = cls.get(best.key, best)
    if passed_over:
        reason += " " + reasons.passed_over_note(passed_over, max_drop, top, level, best_class, gaps, quality)
    extra = [reasons.certified_note(best, best_class, top, max_drop, gaps, level, quality),
             eligibility.diverged_note(diverged) if diverged else None]
    if objective == "time_to_target" and critical_batch is not None:
        extra.append(reasons.critical_batch_note(best, critical_batch))
    reason = " ".join([reason, *(e for e in extra if e)])
    return done(best=best.trial, runners_up=[p.trial for p in ranked[1: 1 + MAX_RUNNERS_UP]], reason=reason,
                ties=tie_notes, unproven=unproven, gaps=gaps, classes=cls, top=_best_class(top, eligible, cls, quality),
                tolerance=max_drop if gaps else None)


def _within_drop(
    eligible: List[PointSummary], max_drop: float, excluded: Dict[str, str], unproven: Dict[str, str], level: float,
    quality: Quality = ACCURACY, cls: Optional[classes.Classes] = None,
) -> Tuple[List[PointSummary], List[PointSummary], Optional[PointSummary], Dict[str, Gap]]:
    """(kept, dropped, the best class's quality, gaps by point key): non-inferiority, judged once per
    accuracy class (`cls`: point key -> its class's quality; a point alone is its own class). The best
    class's points are kept; another class's only when the interval of its gap to the best class
    (`Quality.gap`) lies wholly above -`max_drop` in score space (certified not worse). Shown worse (wholly
    below) goes to `excluded`, neither or no interval ("not tested") to `unproven` too. All kept when none
    measured the quality."""
    cls = cls or {}
    measured = [p for p in eligible if quality.value(p.trial) is not None]
    if not measured:
        return eligible, [], None, {}
    judged = {cls.get(p.key, p).key: cls.get(p.key, p) for p in measured}
    top = quality.best(judged.values())
    kept, dropped, gaps, verdicts = [], [], {}, {}
    pct, metric, setting = stats.percent(level), quality.metric, quality.tolerance_text(max_drop)
    # "faster" only of a point faster than every layout of the best class
    top_rate = max((reasons.rate(p.trial) for p in measured if cls.get(p.key, p).key == top.key), default=-math.inf)
    for point in eligible:
        if quality.value(point.trial) is None:
            excluded[point.key] = f"no {metric} to compare with the best ({quality.tolerance_key})"
            dropped.append(point)
            continue
        mine = cls.get(point.key, point)
        if mine.key not in verdicts:
            verdicts[mine.key] = judge_gap(mine, top, max_drop, level, quality)
        gap = gaps[point.key] = verdicts[mine.key]
        if gap.outcome == "eligible":
            kept.append(point)
            continue
        dropped.append(point)
        if gap.outcome == "untested":
            unproven[point.key] = excluded[point.key] = (
                f"not tested against the best ({top.key}): {noninferiority.UNTESTED}, so nothing certifies its "
                f"{metric} within {setting}")
            continue
        if gap.outcome == "unproven":
            faster = "faster but " if reasons.rate(point.trial) > top_rate else ""
            unproven[point.key] = (
                f"{faster}unproven: its {metric} gap to the best ({top.key}) is {quality.gap_text(gap.interval)}, "
                f"neither wholly {quality.inside()} nor wholly {quality.outside()} {quality.limit(max_drop)} "
                f"({quality.tolerance_key}); {_settle_text(gap.interval, max_drop, level)}")
            excluded[point.key] = unproven[point.key]
            continue
        excluded[point.key] = (f"{metric} {quality.text(mine, level)} is more than {setting} {quality.worse()} "
                               f"the best, {quality.text(top, level)} ({top.key}), shown at {pct}: its gap is "
                               f"{quality.gap_text(gap.interval)}")
    return kept, dropped, top, gaps


def _best_class(top: Optional[PointSummary], eligible: List[PointSummary], cls: classes.Classes,
                quality: Quality) -> Optional[str]:
    """The key of the best class's quality: the guard's reference, else the best among the eligible."""
    if top is not None:
        return top.key
    measured = {cls.get(p.key, p).key: cls.get(p.key, p) for p in eligible if quality.value(p.trial) is not None}
    return quality.best(measured.values()).key if measured else None


def _rank(eligible: List[PointSummary], objective: str, level: float, quality: Quality = ACCURACY,
          cls: Optional[classes.Classes] = None) -> List[PointSummary]:
    # The key is the last sort criterion everywhere, so equal figures give the same answer every run.
    if objective == "throughput":
        return sorted(eligible, key=lambda p: (-reasons.rate(p.trial), p.key))
    if objective == "time_to_accuracy":
        return sorted(eligible, key=lambda p: (seconds_to_train(p.trial), p.key))
    if objective == "time_to_target":
        # A point that missed the target in some seeds ranks behind every one that reached it in all.
        return sorted(eligible, key=lambda p: (not p.reached_in_every_seed, p.trial.time_to_target_seconds, p.key))
    # A tie is not transitive, so the order is built greedily: take the best remaining class's tie group
    # (classes certified within the tie floor of it), pick the fastest point of those classes, repeat.
    cls = cls or {}
    remaining = sorted(eligible, key=lambda p: p.key)
    ranked: List[PointSummary] = []
    while remaining:
        judged = {cls.get(p.key, p).key: cls.get(p.key, p) for p in remaining}
        group = {c.key for c in ties.tie_group(list(judged.values()), level, quality)}
        pick = min((p for p in remaining if cls.get(p.key, p).key in group),
                   key=lambda p: (-reasons.rate(p.trial), -quality.score(cls.get(p.key, p).trial), p.key))
        ranked.append(pick)
        remaining.remove(pick)
    return ranked


__all__ = [
    "ACCURACY_TIE",
    "OBJECTIVES",
    "LrRow",
    "PointSummary",
    "Recommendation",
    "Trial",
    "Gap",
    "Quality",
    "accuracy_interval",
    "gap_interval",
    "judge_gap",
    "judge_matched",
    "gap_words",
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
