"""How far the global batch can grow before each sample buys less progress: the critical batch size
fitted to the sweep's steps to a target (McCandlish et al. 2018: S = S_min (1 + B_crit / B), so
(S/S_min - 1)(E/E_min - 1) = 1), with a bootstrap interval. Pure (standard library only).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class CriticalBatch:
    critical_batch_size: float  # B_crit
    s_min: float  # the fewest optimizer steps to the target, at an infinite batch
    e_min: float  # the fewest samples to it, at a batch of one: S_min x B_crit
    r_squared: float  # of the fit, linear in 1/B
    low: Optional[float] = None  # the bootstrap's 95 % interval of B_crit
    high: Optional[float] = None
    points: int = 0  # global batch sizes fitted

    def steps(self, global_batch: float) -> float:
        """The fit's steps to the target at `global_batch`."""
        return self.s_min * (1 + self.critical_batch_size / global_batch)

    def saving_of_doubling(self, global_batch: float) -> float:
        """The share of the steps that doubling `global_batch` saves: 1 - S(2B)/S(B)."""
        return 1 - self.steps(2 * global_batch) / self.steps(global_batch)

    def in_words(self, context: Optional[int] = None) -> str:
        """Where the returns fall off: at B_crit doubling the batch saves a quarter of the steps; above
        it, less (half a linear speed-up and falling), below it, up to a half (perfect scaling). With a
        language model's `context`, the batch in tokens too (sequences x context)."""
        b = self.critical_batch_size
        interval = f" (95 % interval {self.low:.0f}-{self.high:.0f})" if self.low is not None else ""
        if context:
            interval = f" sequences of {context} tokens, ~{b * context:.0f} tokens per step" + (
                f"; 95 % interval {self.low:.0f}-{self.high:.0f} sequences" if self.low is not None else "")
        return (f"the critical batch size is ~{b:.0f}{interval}: below it, doubling the global batch nearly halves "
                f"the steps to the target; at it, doubling saves a quarter of them; at {2 * b:.0f}, "
                f"{self.saving_of_doubling(2 * b):.0%} (S_min {self.s_min:.0f} steps, E_min {self.e_min:.0f} samples)")


def fit(observations: Sequence[Tuple[float, float]]) -> Optional[CriticalBatch]:
    """Least squares of S = S_min + (S_min B_crit) / B over (global batch, steps to target) pairs;
    repeated global batches are averaged first. None with fewer than two global batches, or when the
    fit is not of that shape (S_min or B_crit not positive: no diminishing return measured)."""
    by_batch: Dict[float, List[float]] = {}
    for batch, steps in observations:
        by_batch.setdefault(float(batch), []).append(float(steps))
    if len(by_batch) < 2:
        return None
    xs = [1.0 / b for b in by_batch]
    ys = [statistics.fmean(v) for v in by_batch.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    s_min = my - slope * mx
    if s_min <= 0 or slope <= 0:
        return None
    total = sum((y - my) ** 2 for y in ys)
    residual = sum((y - (s_min + slope * x)) ** 2 for x, y in zip(xs, ys))
    b_crit = slope / s_min
    return CriticalBatch(b_crit, s_min, s_min * b_crit, 1 - residual / total if total else 1.0, points=len(xs))


def fit_with_interval(observations: Sequence[Tuple[float, float]], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = 0) -> Optional[CriticalBatch]:
    """`fit`, with the 2.5th and 97.5th percentiles of B_crit over bootstrap resamples of the
    observations (resamples that cover fewer than two global batches or fit no shape are skipped)."""
    found = fit(observations)
    if found is None:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        again = fit([observations[rng.randrange(len(observations))] for _ in observations])
        if again is not None:
            values.append(again.critical_batch_size)
    if len(values) < resamples // 2:
        return found
    values.sort()
    low, high = values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]
    return CriticalBatch(found.critical_batch_size, found.s_min, found.e_min, found.r_squared, low, high, found.points)
