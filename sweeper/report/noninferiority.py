"""The recommendation's one rule for "not worse", "tie" and "certified": a point's quality gap to a reference
(report/quality.py: accuracy, or a loss) as a confidence interval (paired over shared seeds, else the
spread over seeds, else from one seed's validation sets) judged against a tolerance in the quality's
units: eligible, unproven, excluded or untested (no interval), and the words for each. Layouts, LR
multipliers and recipes are never counted as seeds. Pure (stdlib; scipy.stats via sweeper.stats)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional

from sweeper import stats
from sweeper.report.classes import fold_by_seed
from sweeper.report.quality import ACCURACY, Quality, hits
from sweeper.stats import Interval
from sweeper.report.trials import PointSummary, Trial


class Gap:
    """A point's quality gap to the best point (its score minus the best's: positive is better, a loss
    negated; Quality.gap) and what it shows against the tolerance: "eligible" (certified not worse: the
    interval wholly above -drop; or the reference itself, or a layout of its accuracy class), "excluded"
    (shown worse: wholly below), "unproven" (neither), "untested" (no interval: nothing measured the noise,
    so no verdict)."""

    def __init__(self, interval: Optional[Interval], outcome: str):
        self.interval = interval
        self.outcome = outcome

    def __repr__(self) -> str:
        return f"Gap({self.outcome}, {None if self.interval is None else self.interval.text()})"


UNTESTED = "one seed and no validation-set size recorded, or seeds that cannot be compared: no interval"


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
        # Nothing measures the noise: no verdict, whatever the figures say.
        return Gap(None, "untested")
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
    """judge_gap for two sets of runs keyed by (unit, seed), e.g. ((layout, recipe), seed): a recipe against
    fp32 at the same layouts, an LR multiplier against the best one. Paired by seed, never by key: per seed,
    each side is the mean quality over the units both ran ok at that seed, so three layouts of one seed are
    one observation, not three (the layouts of a global batch train one model, and every seed is scored on
    one validation set). The interval is then judge_gap's over those per-seed means: paired t over two or
    more seeds, else one seed's validation-set interval (one run's validation samples, not their sum).
    None when no (unit, seed) is shared."""
    def measured(t: Optional[Trial]) -> bool:
        return t is not None and t.status == "ok" and quality.value(t) is not None
    common = [k for k in candidate if measured(candidate[k]) and measured(reference.get(k))]
    if not common:
        return None
    by_seed = lambda runs: {seed: [runs[k] for k in common if k[-1] == seed]  # noqa: E731
                            for seed in sorted({k[-1] for k in common}, key=repr)}
    return judge_gap(fold_by_seed(by_seed(candidate), "candidate", quality),
                     fold_by_seed(by_seed(reference), "reference", quality), max_drop, level, quality)


def gap_words(what: str, against: str, gap: Gap, max_drop: float, level: float, faster: bool = False,
              quality: Quality = ACCURACY) -> str:
    """The outcome of `gap` (judge_gap / judge_matched) in the recommendation's words."""
    pct, key, limit = stats.percent(level), quality.tolerance_key, quality.limit(max_drop)
    if gap.outcome == "untested":
        return f"{what} is not tested against {against}: {UNTESTED} to judge its {quality.word} by"
    if gap.interval is None:
        return f"{what} trains the same model as {against}: one quality, judged once"
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
