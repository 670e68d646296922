"""Throughput from timed windows of whole optimizer steps: which steps to time, the stability rule,
the spread, and the per-phase split of a step. Pure arithmetic (standard library only)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Throughput:
    samples_per_second: float  # median window rate of the stable run, or of all windows if unstable
    # Sample stdev / mean of the rates the figure comes from (the stable run, or all windows): the
    # spread of the number reported. A slow start the rule left out shows in the window rates.
    samples_per_second_cv: float
    step_time_seconds: float  # seconds per optimizer step at `samples_per_second`
    window_samples_per_second: List[float]
    stable: bool  # perf_analyzer's rule met: trust the figure; else report it marked unstable
    stable_window_count: int  # windows the figure comes from (0 when unstable)


def window_bounds(total_steps: int, first_timed_step: int, windows: int) -> List[Tuple[int, int]]:
    """The timed windows as [start, stop) step ranges covering every step from `first_timed_step` on.

    Steps before `first_timed_step` are warm-up (and profiling) and are not timed. Windows differ in
    length by at most one step; there are fewer windows when there are fewer steps. Empty when
    nothing can be timed.
    """
    measured = total_steps - first_timed_step
    if measured <= 0:
        return []
    windows = min(windows, measured)
    length, extra = divmod(measured, windows)
    bounds, start = [], first_timed_step
    for i in range(windows):
        stop = start + length + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def stable_run(rates: Sequence[float], run: int, tolerance: float) -> Optional[Tuple[int, int]]:
    """perf_analyzer's stability rule: the last `run` windows, if their rates all lie within
    `tolerance` (a fraction) of their own mean, as a [start, stop) index range; else None. Only the
    latest windows count: an earlier steady stretch would hide a slowdown at the end."""
    if len(rates) < run:
        return None
    window = rates[-run:]
    mean = statistics.fmean(window)
    if all(abs(r - mean) <= tolerance * mean for r in window):
        return len(rates) - run, len(rates)
    return None


def summarize(
    window_seconds: Sequence[float],
    window_steps: Sequence[int],
    global_batch_size: int,
    stable_windows: int = 3,
    tolerance: float = 0.05,
) -> Throughput:
    """The throughput of timed windows: the median rate of the last `stable_windows` windows when
    they agree within `tolerance` (perf_analyzer's rule), else the median of all windows, marked
    unstable. The median, so one disturbed window cannot move the figure."""
    rates = [steps * global_batch_size / s for steps, s in zip(window_steps, window_seconds)]
    found = stable_run(rates, stable_windows, tolerance)
    used = rates[found[0] : found[1]] if found is not None else rates
    rate = statistics.median(used)
    cv = statistics.stdev(used) / statistics.fmean(used) if len(used) > 1 else 0.0
    return Throughput(
        samples_per_second=rate,
        samples_per_second_cv=cv,
        step_time_seconds=global_batch_size / rate,
        window_samples_per_second=rates,
        stable=found is not None,
        stable_window_count=0 if found is None else found[1] - found[0],
    )


PHASES = ("data", "forward_backward", "optimizer")


def phase_split(per_step: Sequence[Tuple[float, float, float]]) -> Dict[str, float]:
    """Mean seconds per optimizer step in each phase, over the timed steps.

    data: waiting for the loader and copying to the device; forward_backward: forward, loss and
    backward of every micro-batch (DDP's gradient all-reduce overlaps the last backward and is
    inside it); optimizer: optimizer.step() and zero_grad().
    """
    if not per_step:
        return {}
    return {
        f"{name}_seconds_per_step": statistics.fmean(step[i] for step in per_step)
        for i, name in enumerate(PHASES)
    }


def data_wait_fraction(phases: Dict[str, float]) -> Optional[float]:
    """The share of a step spent waiting for data: data_seconds_per_step over the three phases' sum (what
    the step's marks cover), from phase_split's figures (None without them). A loader that keeps up hands
    over a batch already made (a few % here: the copy); one that cannot leaves the device idle while the
    next batch is made (report/data_bound.py names such a point)."""
    seconds = [phases.get(f"{name}_seconds_per_step") for name in PHASES]
    if any(s is None for s in seconds) or sum(seconds) <= 0:
        return None
    return seconds[0] / sum(seconds)


WARMUP, TRACKED, PROFILED, TIMED = "warmup", "tracked", "profiled", "timed"


@dataclass(frozen=True)
class StepRole:
    """What one optimizer step of a point is for, decided before the first step runs."""

    kind: str  # warmup | tracked (the memory-tracked warm-up step) | profiled | timed
    opens_window: Optional[int] = None  # the timed window this step starts
    closes_window: Optional[int] = None  # the timed window this step ends
    starts_profiler: bool = False
    stops_profiler: bool = False


def step_roles(
    total_steps: int, warmup_steps: int, profile_steps: int, windows: int, track_memory: bool
) -> List[StepRole]:
    """Every step's role: `warmup_steps` untimed steps, the last of them memory-tracked when
    `track_memory`; with `profile_steps` > 0, one profiler warm-up step and the profiled steps
    (untimed); then the timed steps, cut into `windows` windows (window_bounds)."""
    first_timed = warmup_steps + (profile_steps + 1 if profile_steps else 0)
    opens = {start: i for i, (start, _) in enumerate(window_bounds(total_steps, first_timed, windows))}
    closes = {stop - 1: i for i, (_, stop) in enumerate(window_bounds(total_steps, first_timed, windows))}
    roles = []
    for step in range(total_steps):
        if step >= first_timed:
            kind = TIMED
        elif step >= warmup_steps:
            kind = PROFILED
        elif track_memory and step == warmup_steps - 1:
            kind = TRACKED
        else:
            kind = WARMUP
        roles.append(StepRole(
            kind,
            opens_window=opens.get(step),
            closes_window=closes.get(step),
            starts_profiler=kind == PROFILED and step == warmup_steps,
            stops_profiler=kind == PROFILED and step == first_timed - 1,
        ))
    return roles
