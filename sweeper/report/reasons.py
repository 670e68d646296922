"""The recommendation's reason in words: why the winner won for its objective, with the measured numbers
that decided it, what the quality guard passed over, and what a batch past the critical one costs.
Pure (stdlib)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from sweeper import stats
from sweeper.report import ties
from sweeper.report.eligibility import bytes_text
from sweeper.report.noninferiority import Gap, _settle_text, certifying_drop
from sweeper.report.quality import ACCURACY, Quality
from sweeper.report.trials import PointSummary, Trial, seconds_to_train

MAX_LISTED = 3


def rate(trial: Trial) -> float:
    """What throughput ranks by: tokens/s for a language model (samples/s would rank contexts wrongly),
    else samples/s; -inf when unmeasured."""
    value = trial.tokens_per_second if trial.tokens_per_second is not None else trial.samples_per_second
    return value if value is not None else -math.inf


def rate_text(trial: Trial) -> str:
    """A point's throughput in words, marked emulated where its precision is (never read as the recipe's)."""
    emulated = " (emulated precision: not the recipe's)" if trial.throughput_emulated else ""
    if trial.tokens_per_second is not None:
        return f"{trial.tokens_per_second:.0f} tokens/s{emulated}"
    if trial.samples_per_second is None:
        return "unmeasured throughput"
    return f"{trial.samples_per_second:.1f} samples/s{emulated}"


def winner(best: PointSummary, ranked: List[PointSummary], objective: str, min_accuracy: Optional[float],
           tie_notes: Dict[str, str], level: float, quality: Quality = ACCURACY,
           cls: Optional[Dict[str, PointSummary]] = None) -> str:
    if objective == "throughput":
        decided, notes = _throughput(best, ranked)
    elif objective == "accuracy":
        decided, notes = _quality(best, ranked, tie_notes, level, quality, cls or {})
    elif objective == "time_to_target":
        decided, notes = _target(best, ranked)
    else:
        decided, notes = _time_to_accuracy(best, ranked, min_accuracy, level)
    if best.trial.throughput_emulated:
        notes.insert(0, f"its throughput is not the recipe's: {best.trial.throughput_emulated}; measure it where "
                        "its precision runs natively before relying on it")
    if best.trial.throughput_stable is False:
        notes.insert(0, "its throughput was unstable (the last timing windows disagreed, so the figure is the "
                        "median of all windows): re-measure before relying on it")
    sentences = decided + "."
    if notes:
        sentences += " " + capitalize("; ".join(notes)) + "."
    return sentences


def _eligible_count(ranked: List[PointSummary]) -> str:
    n = len(ranked)
    seeds = {len(p.replicates) for p in ranked}
    over = ""
    if len(seeds) == 1 and max(seeds) > 1:
        over = f", {'each ' if n > 1 else ''}the mean over its {seeds.pop()} seeds"
    return f"{n} eligible point{'s' if n > 1 else ''}{over}"


def _throughput(best: PointSummary, ranked: List[PointSummary]) -> Tuple[str, List[str]]:
    b = best.trial
    decided = f"{best.key} has the highest throughput of {_eligible_count(ranked)}: {rate_text(b)}{_at_memory(b)}"
    notes: List[str] = []
    if len(ranked) > 1:
        other = ranked[1].trial
        decided += f" (next: {other.key}, {rate_text(other)})"
        notes += noise_note(b, other, relative_gap(rate(b), rate(other)), "throughput")
    return decided, notes


def _quality(best: PointSummary, ranked: List[PointSummary], tie_notes: Dict[str, str], level: float,
             quality: Quality, cls: Dict[str, PointSummary]) -> Tuple[str, List[str]]:
    b, metric = best.trial, quality.metric
    judged = {p.key: cls.get(p.key, p) for p in ranked}  # a point's quality is its class's
    top = quality.best({c.key: c for c in judged.values()}.values())
    group = [p for p in ranked if ties.tied(judged[p.key], top, level, quality)]
    for p in group:
        if judged[p.key] is not top:
            tie_notes[p.key] = ties.tie_sentence(judged[p.key], top, level, quality)
    rivals = [p for p in group if p is not best]
    text = lambda p: quality.text(judged.get(p.key, p), level)  # noqa: E731
    highest = "highest" if quality.higher_is_better else "lowest"
    if not rivals or b.samples_per_second is None:
        decided = f"{best.key} has the {highest} {metric} of {_eligible_count(ranked)}: {text(best)} at {rate_text(b)}"
        if len(ranked) > 1:
            decided += f" (next: {ranked[1].key}, {text(ranked[1])})"
        return decided, []
    # The tie was broken by throughput: show it against the fastest of the others it tied with.
    rival = max(rivals, key=lambda p: (rate(p.trial), quality.score(p.trial)))
    floor = quality.amount(quality.tie_floor) if quality.tie_floor else "0"
    if judged[best.key] is not top:
        gap = ties.tie_gap(judged[best.key], top, level, quality)
        shown = "" if gap.interval is None else f" (gap {quality.gap_text(gap.interval)})"
        standing = (f"{best.key} has {metric} {text(best)}, certified within {floor} of the best, {text(top)} "
                    f"({top.key}), at {stats.percent(level)}{shown}, and is the fastest of that tie")
    else:
        standing = (f"{best.key} has the {highest} {metric} ({text(best)}) and is the fastest of the points "
                    f"certified within {floor} of it")
    decided = f"{standing}: {rate_text(b)} vs {rate_text(rival.trial)} for {rival.key} ({text(rival)})"
    notes: List[str] = []
    if rival.trial.samples_per_second is not None:
        notes += noise_note(b, rival.trial, relative_gap(rate(b), rate(rival.trial)), "throughput",
                            "the fastest other of the tie")
    return decided, notes


def _target(best: PointSummary, ranked: List[PointSummary]) -> Tuple[str, List[str]]:
    b = best.trial
    seeds = len(best.replicates)
    over = f" (the mean over the {best.reached} of {seeds} seeds that reached it)" if best.reached < seeds else ""
    figures = ", ".join(f for f in (
        None if b.samples_to_target is None else f"{b.samples_to_target:.0f} samples",
        None if b.steps_to_target is None else f"{b.steps_to_target:.0f} steps") if f)
    decided = (f"{best.key} reaches the target the soonest of {_eligible_count(ranked)}: "
               f"{seconds(b.time_to_target_seconds)}{over}{f', {figures}' if figures else ''}")
    if len(ranked) > 1:
        decided += f" (next: {ranked[1].key}, {seconds(ranked[1].trial.time_to_target_seconds)})"
    notes: List[str] = []
    if not best.reached_in_every_seed:
        notes.append(f"no eligible point reached the target in every seed; {best.key} reached it in "
                     f"{best.reached} of {seeds}")
    # Only those the rule put behind: a partial point slower than the winner would lose anyway.
    partial = [p for p in ranked if not p.reached_in_every_seed and p is not best
               and p.trial.time_to_target_seconds < b.time_to_target_seconds]
    if partial:
        listed = ", ".join(f"{p.key} ({seconds(p.trial.time_to_target_seconds)}, reached in {p.reached} of "
                           f"{len(p.replicates)} seeds)" for p in partial[:MAX_LISTED])
        notes.append(f"ranked behind every point that reached the target in all its seeds, although faster when "
                     f"they did: {listed}")
    return decided, notes


def _time_to_accuracy(best: PointSummary, ranked: List[PointSummary], min_accuracy: Optional[float], level: float
                      ) -> Tuple[str, List[str]]:
    b, n = best.trial, len(ranked)
    decided = (
        f"{best.key} trains its budget the fastest of {n} point{'s' if n > 1 else ''} reaching "
        f"report.min_accuracy={min_accuracy:g}: {seconds_to_train(b):.1f} s{_samples_text(b)}, "
        f"val_accuracy {ACCURACY.text(best, level)}"
    )
    notes: List[str] = []
    if n > 1:
        other = ranked[1].trial
        other_seconds = seconds_to_train(other)
        decided += f" (next: {other.key}, {other_seconds:.1f} s)"
        # Measured against the slower time, this gap is the throughput gap when the budgets match.
        notes += noise_note(b, other, relative_gap(other_seconds, seconds_to_train(b)), "training time")
    return decided, notes


# ---------------------------------------------------------------------------------------------------
# The quality guard's words


def passed_over_note(passed_over: List[PointSummary], max_drop: float, top: PointSummary, level: float,
                     best: PointSummary, gaps: Dict[str, Gap], quality: Quality = ACCURACY) -> str:
    """Why the points the objective alone preferred were not recommended: unproven or shown worse."""
    pct, setting = stats.percent(level), quality.tolerance_text(max_drop)
    worse = [p for p in passed_over if p.key not in gaps or gaps[p.key].outcome == "excluded"]
    unproven = [p for p in passed_over if p.key in gaps and gaps[p.key].outcome == "unproven"]
    untested = [p for p in passed_over if p.key in gaps and gaps[p.key].outcome == "untested"]
    sentences = []
    if untested:
        listed = ", ".join(f"{p.key} ({rate_text(p.trial)})" for p in untested[:MAX_LISTED])
        more = f" and {len(untested) - MAX_LISTED} more" if len(untested) > MAX_LISTED else ""
        sentences.append(f"Not recommended, faster but not tested against the best, {top.key} (one seed and no "
                         f"validation-set size recorded, or seeds that cannot be compared: no interval): "
                         f"{listed}{more}.")
    if unproven:
        shown = unproven[:MAX_LISTED]
        listed = "; ".join(f"{p.key} ({rate_text(p.trial)}, gap to the best {quality.gap_text(gaps[p.key].interval)}: "
                           f"{_settle_text(gaps[p.key].interval, max_drop, level)})" for p in shown)
        more = f"; and {len(unproven) - len(shown)} more" if len(unproven) > len(shown) else ""
        sentences.append(f"Not recommended, faster but unproven (the data neither certify them within "
                         f"{setting} of the best, {top.key}, at {pct} nor show them worse): {listed}{more}.")
    if worse:
        shown = worse[:MAX_LISTED]
        listed = ", ".join(f"{p.key} ({rate_text(p.trial)}, {quality.metric} {quality.text(p, level)})" for p in shown)
        more = f" and {len(worse) - len(shown)} more" if len(worse) > len(shown) else ""
        top_value = quality.value(top.trial)
        lead = (f"Not recommended although faster: {listed}{more}: their {quality.word} is more than {setting} "
                f"{quality.worse()} the best ({'-' if top_value is None else f'{top_value:.3f}'}, {top.key})")
        if any(quality.value(p.trial) is None for p in worse):
            sentences.append(f"{lead} or was not measured.")
        else:
            sentences.append(f"{lead}, shown at {pct} (the interval of the gap lies wholly {quality.outside()} "
                             f"{quality.limit(max_drop)}), so they learn less from the same samples.")
    if best is top:
        fastest = passed_over[0]
        gap = gaps.get(fastest.key)
        what = "class" if top.key.startswith("class ") else "point"
        text = f"No point faster than {top.key} is certified within {setting} of it at {pct}"
        if what == "class":
            text = (f"No point faster than the {quality.most('class')}, {top.key[6:]}, is certified within {setting} "
                    f"of it at {pct}")
        if gap is not None and gap.interval is not None:
            text += f"; {fastest.key} is within {quality.amount(certifying_drop(gap.interval))} of the best at {pct}"
            # The fastest may be shown worse: the fastest point a wider tolerance could still certify
            # is the figure to act on.
            closest = next((p for p in unproven if gaps[p.key].interval is not None), None)
            if closest is not None and closest is not fastest:
                text += (f", {closest.key}, the fastest not shown worse, within "
                         f"{quality.amount(certifying_drop(gaps[closest.key].interval), units=False)}")
        sentences.append(text + ".")
        if unproven:
            # The fallback is this run's best point, not one certified better than the unproven ones:
            # another seed set may rank them the other way (issue 27).
            sentences.append(f"{top.key} is this run's {quality.most(what)}, not certified better than the unproven "
                             f"ones: another seed set may pick {unproven[0].key}.")
    return " ".join(sentences)


def certified_note(best: PointSummary, best_class: PointSummary, top: Optional[PointSummary],
                   max_drop: Optional[float], gaps: Dict[str, Gap], level: float, quality: Quality = ACCURACY
                   ) -> Optional[str]:
    """Where the recommended point's quality stands against the best class's: the layouts it shares a class
    with, or its certified gap."""
    if top is None:
        return None
    metric = quality.metric
    if best_class is top:
        if top.key == best.key:
            return None
        return (f"Its {metric}, {quality.text(top, level)}, is its accuracy class's ({top.key}: layouts that train "
                f"the same model, one quality judged once), the best; {best.key} is the class's fastest layout.")
    gap = gaps.get(best.key)
    mine, theirs = quality.text(best_class, level), quality.text(top, level)
    return (f"Certified not worse: its {metric} {mine} against the best, {theirs} ({top.key}), has a gap of "
            f"{quality.gap_text(gap.interval)}, wholly {quality.inside()} {quality.limit(max_drop)} "
            f"({quality.tolerance_key}).")


def critical_batch_note(best: PointSummary, critical_batch: Any) -> Optional[str]:
    """What a global batch over twice the critical batch size costs in samples to the target: by the
    fit, S(B) B against S(B_crit) B_crit (= 2 E_min), i.e. (B + B_crit) / (2 B_crit) times as many."""
    b_crit, batch = float(critical_batch.critical_batch_size), best.trial.global_batch_size
    if not (math.isfinite(b_crit) and b_crit > 0) or batch <= 2 * b_crit:
        return None
    at_best, at_crit = critical_batch.steps(batch) * batch, critical_batch.steps(b_crit) * b_crit
    measured = "" if best.trial.samples_to_target is None else f" (measured: {best.trial.samples_to_target:.0f})"
    return (f"Its global batch {batch} is {batch / b_crit:.1f}x the critical batch size (~{b_crit:.0f}): the fit "
            f"puts its samples to the target at {at_best:.0f}{measured} against {at_crit:.0f} at a global batch of "
            f"~{b_crit:.0f}, {at_best / at_crit:.1f}x the data for its speed; choose a global batch near "
            f"{b_crit:.0f} when samples or compute cost more than time.")


# ---------------------------------------------------------------------------------------------------
# Figures in words


def relative_gap(larger: float, smaller: float) -> float:
    return (larger - smaller) / larger if larger > 0 else math.inf


def noise_note(best: Trial, other: Trial, gap: float, what: str, who: str = "the next") -> List[str]:
    """'within noise' when the winner's relative margin over `other` is no larger than the
    window-to-window spread (cv) either of them measured: a re-run could swap them."""
    spreads = [cv for cv in (best.samples_per_second_cv, other.samples_per_second_cv) if cv is not None]
    if not spreads:
        return []
    spread = max(spreads)
    if gap > spread:
        return []
    return [f"{who}, {other.key}, is within noise: the {what} gap ({gap:.1%}) is within the measured spread "
            f"(cv {spread:.1%}), so either will do"]


def seconds(value: float) -> str:
    """12.0 s, 0.0777 s: a tenth of a second is no resolution for a small model's time to target."""
    return f"{value:.1f} s" if value >= 1 else f"{value:.3g} s"


def _at_memory(trial: Trial) -> str:
    return f" at peak memory {bytes_text(trial.peak_memory_bytes)}" if trial.peak_memory_bytes is not None else ""


def _samples_text(trial: Trial) -> str:
    if trial.samples_seen is not None and trial.samples_per_second:
        return f" for {trial.samples_seen:.0f} samples at {trial.samples_per_second:.1f} samples/s"
    return " of wall-clock training"


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]
