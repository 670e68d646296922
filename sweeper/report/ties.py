"""Objective accuracy's ties: whether the data separate two points' quality (report/quality.py) at a
confidence level, the best point's tie group, and the sentence saying why two points count as one
result. Pure (stdlib; scipy.stats via sweeper.stats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from sweeper import stats
from sweeper.report.quality import ACCURACY, Quality
from sweeper.report.trials import PointSummary

# Kept under its old name: the accuracy's tie floor (Quality.tie_floor).
ACCURACY_TIE = ACCURACY.tie_floor


@dataclass(frozen=True)
class QualityTest:
    """Whether the data separate two points' quality at a confidence level, and how that was decided."""

    separable: bool
    how: str  # e.g. "Welch's t-test over 3 seeds each, p = 0.21 >= 0.05"
    tested: bool  # False: no noise estimate (one seed, no validation-set size or SE), the figures alone decided


AccuracyTest = QualityTest  # the name from before losses


def compare(a: PointSummary, b: PointSummary, level: float = 0.95, quality: Quality = ACCURACY) -> QualityTest:
    """Welch's t-test over seeds (two-sided, separable when p < 1 - level) when both points have at
    least two seeds with the quality measured; else their one-seed confidence intervals
    (Quality.interval: Wilson's for an accuracy, from the loss's SE for a loss) separate them when they
    do not overlap. With no interval at all nothing measures the noise: the figures are taken at face
    value, as separable, and `tested` is False."""
    xa, xb = quality.values(a), quality.values(b)
    if len(xa) >= 2 and len(xb) >= 2:
        p = stats.welch_p(xa, xb)
        seeds = f"{len(xa)} seeds each" if len(xa) == len(xb) else f"{len(xa)} and {len(xb)} seeds"
        separable = p < 1.0 - level
        return QualityTest(separable, f"Welch's t-test over {seeds}, p = {p:.2g} "
                                      f"{'<' if separable else '>='} {1.0 - level:.2g}", True)
    ia, ib = quality.interval(a, level), quality.interval(b, level)
    if ia is not None and ib is not None:
        kinds = [_kind(ia), _kind(ib)]
        how = kinds[0].replace("interval", "intervals", 1) if kinds[0] == kinds[1] else " vs ".join(kinds)
        return QualityTest(not ia.overlaps(ib), how, True)
    return QualityTest(True, "no interval: one seed and no validation-set size or standard error recorded", False)


def compare_accuracy(a: PointSummary, b: PointSummary, level: float = 0.95) -> QualityTest:
    return compare(a, b, level, ACCURACY)


def _kind(interval) -> str:
    if interval.sd is not None:
        return f"t interval over {interval.n} seeds"
    if interval.how.startswith("Wilson"):
        return f"Wilson interval of {interval.n} validation samples, one seed"
    return "normal interval of the validation loss's standard error, one seed"


def tied(point: PointSummary, top: PointSummary, level: float, quality: Quality = ACCURACY) -> bool:
    """Within the quality's tie floor of `top` (too small a gap to matter), or not separable from it."""
    # The epsilon keeps decimal ties exact: 0.962 - 0.005 is not 0.957 in binary floating point.
    if quality.score(point.trial) >= quality.score(top.trial) - quality.tie_floor - 1e-12:
        return True
    return not compare(point, top, level, quality).separable


def tie_group(points: List[PointSummary], level: float, quality: Quality = ACCURACY) -> List[PointSummary]:
    """The best of `points` and those tied with it."""
    top = quality.best(points)
    return [p for p in points if p is top or tied(p, top, level, quality)]


def tie_sentence(a: PointSummary, b: PointSummary, test: QualityTest, level: float, quality: Quality = ACCURACY
                 ) -> str:
    return (f"{a.key} ({quality.text(a, level)}) and {b.key} ({quality.text(b, level)}) cannot be told apart at "
            f"{stats.percent(level)} ({test.how}): treated as a tie")
