"""The recommendation's one rule for "not worse": a point's accuracy gap to a reference as a confidence
interval (paired over shared seeds, Newcombe with one) judged against a tolerance: eligible, unproven or
excluded, and the words for each. Pure (stdlib; scipy.stats via report.stats)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Dict, Optional, Tuple

from sweeper.report import stats
from sweeper.report.stats import Interval
from sweeper.report.trials import PointSummary, Trial, _finite


class Gap:
    """A point's accuracy gap to the most accurate point (point minus best) and what it shows against
    report.max_accuracy_drop: "eligible" (certified not worse: the interval wholly above -drop),
    "excluded" (shown worse: wholly below), "unproven" (neither)."""

    def __init__(self, interval: Optional[Interval], outcome: str):
        self.interval = interval
        self.outcome = outcome


def gap_interval(point: PointSummary, top: PointSummary, level: float = 0.95) -> Optional[Interval]:
    """The confidence interval of `point`'s accuracy minus `top`'s: a paired t interval over the seeds
    both measured (at least 2: the same seed sees the same samples in the same order), else Newcombe's
    interval of the pooled validation hits (val_accuracy * val_samples). None when neither exists
    (one seed and no val_samples recorded)."""
    def by_seed(p: PointSummary) -> Dict[int, float]:
        return {t.seed: float(t.val_accuracy) for t in p.replicates
                if t.status == "ok" and t.seed is not None and _finite(t.val_accuracy)}
    mine, theirs = by_seed(point), by_seed(top)
    common = sorted(set(mine) & set(theirs))
    if len(common) >= 2:
        return stats.paired_difference([mine[s] for s in common], [theirs[s] for s in common], level)
    pooled = [_hits(point), _hits(top)]
    if pooled[0] is None or pooled[1] is None:
        return None
    (ha, na), (hb, nb) = pooled
    return stats.newcombe_difference(ha, na, hb, nb, level)


def _hits(point: PointSummary) -> Optional[Tuple[float, int]]:
    """(validation hits, validation samples) pooled over the point's ok seeds; None when unrecorded."""
    measured = [t for t in point.replicates if t.status == "ok" and _finite(t.val_accuracy)]
    if not measured or any(not t.val_samples for t in measured):
        return None
    return sum(t.val_accuracy * t.val_samples for t in measured), sum(int(t.val_samples) for t in measured)


def one_sided(level: float) -> float:
    """The two-sided level whose bounds are each one-sided at `level`: 0.95 -> 0.90."""
    return 2.0 * level - 1.0


def judge_gap(point: PointSummary, top: PointSummary, max_drop: float, level: float = 0.95) -> Gap:
    """Non-inferiority of `point` against `top` (the most accurate point) at `max_drop` and `level`."""
    if point is top:
        return Gap(None, "eligible")
    # Non-inferiority is one-sided: each bound of the two-sided interval at 2 x level - 1 is a one-sided
    # bound at `level` (a 90 % interval's lower end is the 95 % lower confidence bound).
    interval = gap_interval(point, top, one_sided(level))
    if interval is not None:
        interval = replace(interval, how=interval.how.replace(
            stats.percent(one_sided(level)), f"one-sided {stats.percent(level)} bounds"))
    if interval is None:
        # Nothing measures the noise: the figures are taken at face value.
        gap = point.trial.val_accuracy - top.trial.val_accuracy
        return Gap(None, "eligible" if gap >= -max_drop - 1e-12 else "excluded")
    # The epsilon keeps decimal edges exact: 0.93 - 0.95 is not -0.02 in binary floating point.
    if interval.low >= -max_drop - 1e-12:
        return Gap(interval, "eligible")
    if interval.high < -max_drop:
        return Gap(interval, "excluded")
    return Gap(interval, "unproven")


def certifying_drop(interval: Interval) -> float:
    """The smallest max_accuracy_drop at which a gap with this interval is certified not worse."""
    return max(0.0, -interval.low)


def _gap_text(interval: Interval) -> str:
    return f"{interval.mean:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}] ({interval.how})"


def _settle_text(interval: Interval, max_drop: float, level: float) -> str:
    n = stats.seeds_to_settle(interval, -max_drop, one_sided(level))
    if interval.sd is None:
        return "more seeds (sweep.seeds) would settle it"
    if n is None:
        return "more than 1000 seeds would be needed to settle it"
    return f"about {n} seeds would settle it"


def judge_matched(candidate: Dict[Any, Trial], reference: Dict[Any, Trial], max_drop: float,
                  level: float = 0.95) -> Optional[Gap]:
    """judge_gap for two sets of runs matched by key (e.g. (layout, seed): a recipe against fp32 at the
    same layouts and seeds, an LR multiplier against the best one): the paired interval over the keys
    both ran ok with a val_accuracy (a matched key shares the samples, their order and the layout),
    Newcombe's interval of the pooled hits with one such key. None when no key is shared."""
    def measured(t: Optional[Trial]) -> bool:
        return t is not None and t.status == "ok" and _finite(t.val_accuracy)
    common = sorted((k for k in candidate if measured(candidate[k]) and measured(reference.get(k))), key=repr)
    if not common:
        return None

    def fold(runs: Dict[Any, Trial], name: str) -> PointSummary:
        # The match key stands in for the seed, so gap_interval pairs exactly the matched runs.
        members = tuple(replace(runs[k], seed=i, point_key=name) for i, k in enumerate(common))
        mean = statistics.fmean(t.val_accuracy for t in members)
        return PointSummary(replace(members[0], key=name, val_accuracy=mean), members)
    return judge_gap(fold(candidate, "candidate"), fold(reference, "reference"), max_drop, level)


def gap_words(what: str, against: str, gap: Gap, max_drop: float, level: float, faster: bool = False) -> str:
    """The outcome of `gap` (judge_gap / judge_matched) in the recommendation's words."""
    pct = stats.percent(level)
    if gap.interval is None:
        shown = "(one seed and no validation-set size recorded: no interval tested the gap)"
    else:
        shown = f"its val_accuracy gap to {against} is {_gap_text(gap.interval)}"
    if gap.outcome == "eligible":
        return (f"{what} is certified not worse than {against} at {pct}: {shown}, wholly above "
                f"-{max_drop:g} (report.max_accuracy_drop)")
    if gap.outcome == "excluded":
        return (f"{what} is not recommended: its accuracy is more than report.max_accuracy_drop={max_drop:g} "
                f"below {against}'s, shown at {pct}: {shown}")
    return (f"{what} is not recommended, {'faster but ' if faster else ''}unproven against {against}: {shown}, "
            f"neither wholly above nor wholly below -{max_drop:g} (report.max_accuracy_drop); "
            f"{_settle_text(gap.interval, max_drop, level)}")
