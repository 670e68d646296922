"""Throughput from timed windows of whole optimizer steps: median, spread, and which steps to time.

Pure arithmetic (standard library only); the training loop decides where the clock is read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import List, Sequence


@dataclass(frozen=True)
class Throughput:
    samples_per_second: float  # median over windows
    samples_per_second_cv: float  # population stdev / mean over windows (0 with one window)
    step_time_seconds: float  # median window time / steps per window
    window_samples_per_second: List[float]
    steps_per_window: int
    noisy: bool  # spread above the threshold: report, do not trust blindly


def window_ends(total_steps: int, warmup_steps: int, windows: int) -> List[int]:
    """Indices of the optimizer steps after which each timing window closes.

    Steps [0, warmup_steps) are not timed; the rest are cut into `windows` equal windows (fewer if
    there are fewer steps); a remainder is trained but not timed. Empty when nothing can be timed.
    """
    measured = total_steps - warmup_steps
    if measured <= 0:
        return []
    windows = min(windows, measured)
    length = measured // windows
    return [warmup_steps + (i + 1) * length - 1 for i in range(windows)]


def summarize(
    window_seconds: Sequence[float],
    steps_per_window: int,
    global_batch_size: int,
    cv_threshold: float = 0.05,
) -> Throughput:
    rates = [steps_per_window * global_batch_size / s for s in window_seconds]
    mean = statistics.fmean(rates)
    cv = statistics.pstdev(rates) / mean if len(rates) > 1 else 0.0
    return Throughput(
        samples_per_second=statistics.median(rates),
        samples_per_second_cv=cv,
        step_time_seconds=statistics.median(window_seconds) / steps_per_window,
        window_samples_per_second=rates,
        steps_per_window=steps_per_window,
        noisy=cv > cv_threshold,
    )
