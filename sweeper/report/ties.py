"""Objective accuracy's ties: a point is tied with the best when the one non-inferiority judgement
(report/noninferiority.py: paired by seed, else the spread over seeds, else one seed's validation sets)
certifies its quality within the quality's tie floor of the best's; the best point's tie group, and the
sentence saying why two points count as one result. Pure (stdlib; scipy.stats via sweeper.stats)."""

from __future__ import annotations

from typing import List

from sweeper import stats
from sweeper.report.noninferiority import Gap, judge_gap
from sweeper.report.quality import ACCURACY, Quality
from sweeper.report.trials import PointSummary

# Kept under its old name: the accuracy's tie floor (Quality.tie_floor).
ACCURACY_TIE = ACCURACY.tie_floor


def tie_gap(point: PointSummary, top: PointSummary, level: float, quality: Quality = ACCURACY) -> Gap:
    """`point` against `top` at the tie floor: "eligible" is a tie. A gap the data cannot bound ("unproven",
    "untested") is no tie: a tie is certified, never a failure to separate."""
    return judge_gap(point, top, quality.tie_floor, level, quality)


def tied(point: PointSummary, top: PointSummary, level: float, quality: Quality = ACCURACY) -> bool:
    """Certified within the quality's tie floor of `top` (too small a gap to pay throughput for)."""
    return point is top or tie_gap(point, top, level, quality).outcome == "eligible"


def tie_group(points: List[PointSummary], level: float, quality: Quality = ACCURACY) -> List[PointSummary]:
    """The best of `points` and those tied with it."""
    top = quality.best(points)
    return [p for p in points if tied(p, top, level, quality)]


def tie_sentence(a: PointSummary, top: PointSummary, level: float, quality: Quality = ACCURACY) -> str:
    gap = tie_gap(a, top, level, quality)
    floor = quality.amount(quality.tie_floor) if quality.tie_floor else "0"
    shown = "" if gap.interval is None else f": its gap is {quality.gap_text(gap.interval)}"
    return (f"{a.key} ({quality.text(a, level)}) is certified within {floor} of the best, {top.key} "
            f"({quality.text(top, level)}), at {stats.percent(level)}{shown}: a tie")
