"""The throughput knee of one series: the size past which a bigger batch stops paying. Pure (stdlib);
the report's knees (report/tradeoffs.py) and the inference roofline's measured knee both read it."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple


def knee(points: Sequence[Tuple[int, float]], min_gain: float = 0.10) -> Optional[int]:
    """The micro-batch size past which a bigger micro-batch stops paying, or None.

    `points` are (micro_batch_size, samples_per_second) of one (accumulation, workers) series. Sorted
    by size, each step from s1 to s2 is scored as a gain per doubling of the micro-batch,
    `(t2 / t1) ** (1 / log2(s2 / s1)) - 1`, so a grid 16, 64 is judged like a grid 16, 32, 64 (a 21 %
    gain over 16 -> 64 is 10 % per doubling). The knee is the first s1 whose next step gains less than
    `min_gain` per doubling (a loss counts too). None when every step gains at least `min_gain`
    (throughput still climbing: try larger micro-batches) or with fewer than two points.
    """
    if min_gain < 0:
        raise ValueError(f"min_gain={min_gain} must be >= 0 (a fraction: 0.10 is 10 % per doubling)")
    ordered = sorted((int(size), float(rate)) for size, rate in points)
    for (s1, t1), (s2, t2) in zip(ordered, ordered[1:]):
        if s1 == s2:
            raise ValueError(f"micro_batch_size {s1} appears twice in one series: pass one throughput per size")
        if s1 <= 0 or t1 <= 0 or t2 <= 0:
            raise ValueError(
                f"knee needs positive sizes and throughputs, got ({s1}, {t1}) -> ({s2}, {t2}): "
                "leave out trials without a measured throughput"
            )
        gain_per_doubling = (t2 / t1) ** (1.0 / math.log2(s2 / s1)) - 1.0
        if gain_per_doubling < min_gain:
            return s1
    return None
