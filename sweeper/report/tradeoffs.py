"""Throughput knees and the throughput/memory Pareto front of a sweep's trials. Pure (stdlib)."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from sweeper.measure.knee import knee
from sweeper.report.trials import Trial


def knees(trials: Iterable[Trial], min_gain: float = 0.10) -> Dict[Tuple[int, int], Optional[int]]:
    """`knee` of every (accumulation_steps, num_workers) series, over ok trials with a throughput.
    A series with a single measured size maps to None (no knee can be seen)."""
    series: Dict[Tuple[int, int], List[Tuple[int, float]]] = {}
    for trial in trials:
        if trial.status == "ok" and trial.samples_per_second is not None:
            series.setdefault((trial.accumulation_steps, trial.num_workers), []).append(
                (trial.micro_batch_size, trial.samples_per_second)
            )
    return {group: knee(points, min_gain) for group, points in sorted(series.items())}


def pareto(trials: Iterable[Trial]) -> List[Trial]:
    """Ok trials that no other ok trial beats on both throughput (higher) and peak memory (lower),
    sorted by peak memory. Trials missing either figure cannot be placed and are left out."""
    measured = [
        t
        for t in trials
        if t.status == "ok" and t.samples_per_second is not None and t.peak_memory_bytes is not None
    ]

    def dominated(t: Trial) -> bool:
        return any(
            o.samples_per_second >= t.samples_per_second
            and o.peak_memory_bytes <= t.peak_memory_bytes
            and (o.samples_per_second > t.samples_per_second or o.peak_memory_bytes < t.peak_memory_bytes)
            for o in measured
        )

    front = [t for t in measured if not dominated(t)]
    return sorted(front, key=lambda t: (t.peak_memory_bytes, -t.samples_per_second, t.key))
