"""The recommendation's one rule for "not worse": a point's quality gap to a reference (report/quality.py:
accuracy, or a loss) as a confidence interval (paired over shared seeds, else from the validation sets)
judged against a tolerance in the quality's units: eligible, unproven or excluded, and the words for
each. Pure (stdlib; scipy.stats via sweeper.stats)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Dict, Optional

from sweeper import stats
from sweeper.report.quality import ACCURACY, Quality, hits
from sweeper.stats import Interval
from sweeper.report.trials import PointSummary, Trial


class Gap:
    """A point's quality gap to the best point (its score minus the best's: positive is better, a loss
    negated; Quality.gap) and what it shows against the tolerance: "eligible" (certified not worse: the
    interval wholly above -drop), "excluded" (shown worse: wholly below), "unproven" (neither)."""

    def __init__(self, interval: Optional[Interval], outcome: str):
        self.interval = interval
        self.outcome = outcome


def gap_interval(point: PointSummary, top: PointSummary, level: float = 0.95,
                 quality: Quality = ACCURACY) -> Optional[Interval]:
    """The confidence interval of `point`'s quality score minus `top`'s (Quality.gap): a paired t interval
    over the seeds both measured, else one from the validation sets (Newcombe's of the pooled hits for an
    accuracy). None when neither exists."""
    return quality.gap(point, top, level)


_hits = hits  # the accuracy's pooled validation hits (report/quality.py); the chance check reads them


def one_sided(level: float) -> float:
    """The two-sided level whose bounds are each one-sided at `level`: 0.95 -> 0.90."""
    return 2.0 * level - 1.0


def judge_gap(point: PointSummary, top: PointSummary, max_drop: float, level: float = 0.95,
              quality: Quality = ACCURACY) -> Gap:
    """Non-inferiority of `point` against `top` (the best point by `quality`) at `max_drop` (in the
    quality's units) and `level`."""
    if point is top:
        return Gap(None, "eligible")
    # Non-inferiority is one-sided: each bound of the two-sided interval at 2 x level - 1 is a one-sided
    # bound at `level` (a 90 % interval's lower end is the 95 % lower confidence bound).
    interval = gap_interval(point, top, one_sided(level), quality)
    if interval is not None:
        interval = replace(interval, how=interval.how.replace(
            stats.percent(one_sided(level)), f"one-sided {stats.percent(level)} bounds"))
    if interval is None:
        # Nothing measures the noise: the figures are taken at face value.
        gap = quality.score(point.trial) - quality.score(top.trial)
        return Gap(None, "eligible" if gap >= -max_drop - 1e-12 else "excluded")
    # The epsilon keeps decimal edges exact: 0.93 - 0.95 is not -0.02 in binary floating point.
    if interval.low >= -max_drop - 1e-12:
        return Gap(interval, "eligible")
    if interval.high < -max_drop:
        return Gap(interval, "excluded")
    return Gap(interval, "unproven")


def certifying_drop(interval: Interval) -> float:
    """The smallest tolerance at which a gap (in score space) with this interval is certified not worse."""
    return max(0.0, -interval.low)


def _gap_text(interval: Interval, quality: Quality = ACCURACY) -> str:
    return quality.gap_text(interval)


def _settle_text(interval: Interval, max_drop: float, level: float) -> str:
    n = stats.seeds_to_settle(interval, -max_drop, one_sided(level))
    if interval.sd is None:
        return "more seeds (sweep.seeds) would settle it"
    if n is None:
        return "more than 1000 seeds would be needed to settle it"
    return f"about {n} seeds would settle it"


def judge_matched(candidate: Dict[Any, Trial], reference: Dict[Any, Trial], max_drop: float,
                  level: float = 0.95, quality: Quality = ACCURACY) -> Optional[Gap]:
    """judge_gap for two sets of runs matched by key (e.g. (layout, seed): a recipe against fp32 at the
    same layouts and seeds, an LR multiplier against the best one): the paired interval over the keys
    both ran ok with the quality measured (a matched key shares the samples, their order and the
    layout), one from the validation sets with one such key. None when no key is shared."""
    def measured(t: Optional[Trial]) -> bool:
        return t is not None and t.status == "ok" and quality.value(t) is not None
    common = sorted((k for k in candidate if measured(candidate[k]) and measured(reference.get(k))), key=repr)
    if not common:
        return None

    def fold(runs: Dict[Any, Trial], name: str) -> PointSummary:
        # The match key stands in for the seed, so the gap pairs exactly the matched runs.
        members = tuple(replace(runs[k], seed=i, point_key=name) for i, k in enumerate(common))
        mean = statistics.fmean(quality.value(t) for t in members)
        return PointSummary(replace(members[0], key=name, **{quality.metric: mean}), members)
    return judge_gap(fold(candidate, "candidate"), fold(reference, "reference"), max_drop, level, quality)


def gap_words(what: str, against: str, gap: Gap, max_drop: float, level: float, faster: bool = False,
              quality: Quality = ACCURACY) -> str:
    """The outcome of `gap` (judge_gap / judge_matched) in the recommendation's words."""
    pct, key, limit = stats.percent(level), quality.tolerance_key, quality.limit(max_drop)
    if gap.interval is None:
        shown = "(one seed and no validation-set size recorded: no interval tested the gap)"
    else:
        shown = f"its {quality.metric} gap to {against} is {quality.gap_text(gap.interval)}"
    if gap.outcome == "eligible":
        return (f"{what} is certified not worse than {against} at {pct}: {shown}, wholly {quality.inside()} "
                f"{limit} ({key})")
    if gap.outcome == "excluded":
        return (f"{what} is not recommended: its {quality.word} is more than {quality.tolerance_text(max_drop)} "
                f"{quality.worse()} {against}'s, shown at {pct}: {shown}")
    return (f"{what} is not recommended, {'faster but ' if faster else ''}unproven against {against}: {shown}, "
            f"neither wholly {quality.inside()} nor wholly {quality.outside()} {limit} ({key}); "
            f"{_settle_text(gap.interval, max_drop, level)}")
