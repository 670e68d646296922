"""sweep.strategy=branch, the arithmetic: where the trunk saves its state, how long a branch trains, the
local critical batch size from a trunk's and its branches' losses on the same samples, the batch-size
schedule it implies, and the wall time that schedule and the best constant layout are predicted to take.

Pure functions on plain values (standard library), tested on fixed loss curves. The driver runs what they
decide (sweeper/strategies/branch_driver.py); docs/strategy.md tells the whole story.

The measurement (Merrill et al. 2025, arXiv:2505.23971): from a checkpoint of a trunk trained at global
batch B, branch to a larger global batch G with the LR scaled by the run's rule, for a short window of
samples; the branch reads the very samples the trunk reads over that window (the sample stream goes on
from the checkpoint's position whatever the layout), so the two losses are paired. The local critical
batch size is the largest G whose loss rise over the trunk's at the window's end is certified within a
margin (a one-sided interval counting the trunk's and the branch's noise), every smaller G certified
too; it lies between that G and the next one tried.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from sweeper.strategies.branch_reading import Local, monotone


def positions(fractions: Sequence[float], budget: int, base: int, window: int) -> List[int]:
    """The trunk's checkpoints in samples: each fraction of the `budget` rounded down to whole trunk steps
    (`base` samples each), at least one step in, at most a window before the budget's end (a branch must
    fit in the budget), without repeats, in order."""
    last = (budget - window) // base * base
    out = sorted({min(max(base, int(f * budget) // base * base), last) for f in fractions})
    return [s for s in out if 0 < s <= last]


def window_samples(window: Optional[int], budget: int, batches: Sequence[int]) -> int:
    """branch.window in samples (null: a twentieth of the budget, at least two steps of the largest global
    batch), rounded up to a multiple of every global batch compared, so each run ends on a whole step at
    the same sample."""
    step = 1
    for b in batches:
        step = step * b // math.gcd(step, b)
    wanted = window if window is not None else max(budget // 20, 2 * max(batches))
    return max(step, -(-wanted // step) * step)


def schedule(locals_: Sequence[Local], base: int, batches: Sequence[int]) -> List[Tuple[int, int]]:
    """The batch-size schedule [(samples seen, global batch), ...] from (0, base): from each checkpoint on, the
    largest of `batches` at or below the monotone fit of the critical batch size there (so the batch never
    shrinks), each change moved to the first step boundary of the span before it (a whole number of its steps
    after its start); spans of one global batch merged."""
    out = [(0, base)]
    for local, fitted in zip(locals_, monotone(locals_)):
        fitting = [b for b in batches if base <= b <= fitted + 1e-9]
        g = max(fitting) if fitting else base
        start, current = out[-1]
        if g <= current:
            continue
        # a whole number of the span before's steps after its start (train.batch_schedule's rule)
        at = start + max(1, -(-(local.samples - start) // current)) * current
        out.append((at, g))
    return out


def span_accumulations(unit: int, base: int, measured: Dict[int, float], batches: Sequence[int]
                       ) -> Dict[int, Tuple[int, int]]:
    """The global batches a schedule can change to and how each is timed. `train.batch_schedule` keeps the
    first span's micro-batch and workers (their product `unit`) and raises the accumulation, so a global
    batch of `batches` at or above `base` is reachable when `unit` divides it; `measured` maps the
    accumulation steps measured at that micro-batch and workers to their samples/s. For each reachable
    global batch: (the accumulation it runs at, the measured accumulation whose samples/s times it) - its
    own when measured, else the largest measured below it: a lower bound on its rate, since more
    accumulation spreads the same optimizer step over more samples. One with no measured accumulation at
    or below its own is left out (its rate would be a guess)."""
    out = {}
    for g in batches:
        if g < base or g % unit:
            continue
        steps = g // unit
        below = [a for a in measured if a <= steps]
        if below:
            out[g] = (steps, max(below))
    return out


def samples_factor(global_batch: int, base: int, critical: float) -> float:
    """How many samples a stretch of training takes at `global_batch` for what it takes at `base`, with the
    critical batch size `critical` (McCandlish et al. 2018's E = E_min (1 + B / B_crit))."""
    return (1 + global_batch / critical) / (1 + base / critical)


def predicted_seconds(spans: Sequence[Tuple[int, int]], budget: int, locals_: Sequence[Local], base: int,
                      rate: Dict[int, float]) -> Tuple[float, int]:
    """The predicted wall seconds (and samples) to the trunk's final loss when training follows `spans`
    [(samples of the trunk's progress, global batch), ...] at `rate[global batch]` samples/s: each stretch
    of the trunk's progress between checkpoints costs its samples x samples_factor at the stretch's
    critical batch size (the monotone fit at the checkpoint the stretch starts from, the first checkpoint's for
    the stretch before it: each reading fitted at the middle of its interval, `Local.estimate`)."""
    edges = [0] + [c.samples for c in locals_] + [budget]
    fitted = monotone(locals_)
    crit = [fitted[0]] + fitted if locals_ else [float(base)]
    seconds, samples = 0.0, 0.0
    for (a, b), critical in zip(zip(edges, edges[1:]), crit):
        for start, end, g in _pieces(spans, budget):
            lo, hi = max(a, start), min(b, end)
            if hi > lo:
                cost = (hi - lo) * samples_factor(g, base, max(critical, base))
                samples += cost
                seconds += cost / rate[g]
    return seconds, int(round(samples))


# The answer, of the schedule and the best constant layout: SCHEDULE only when predicted faster beyond the
# predictions' noise; TIE when the two are not told apart (the constant is then the answer: one layout, no
# accumulation changes mid-run); CONSTANT when it is predicted faster, or there is no schedule.
SCHEDULE, CONSTANT, TIE = "schedule", "constant", "tie"


def rate_noise(cv: Optional[float], windows: Optional[int]) -> Optional[float]:
    """A measured samples/s's relative standard error: its timed windows' coefficient of variation over
    sqrt(windows) (None when either is unrecorded)."""
    if cv is None or not windows or not math.isfinite(cv):
        return None
    return cv / math.sqrt(windows)


def choose(schedule_seconds: float, constant_seconds: float, spans: int, schedule_noise: Sequence[Optional[float]],
           constant_noise: Sequence[Optional[float]], z: float) -> Tuple[str, Optional[float]]:
    """(SCHEDULE | CONSTANT | TIE, the share of the constant's predicted time the two must differ by). A
    prediction is samples / a measured samples/s, so its noise is the rates' relative standard errors
    (`rate_noise`; the noisiest of the layouts timing it), the two combined in quadrature, times `z`. The
    model's own error (the critical batch size between the largest global batch that kept up and the next
    one tried) is not counted: the share is a floor on what can be told apart. An unmeasured noise tells
    nothing apart (TIE, None). One span: no schedule, CONSTANT."""
    if spans < 2:
        return CONSTANT, None
    noises = [max(n, default=None) if None not in n else None for n in (schedule_noise, constant_noise)]
    if None in noises:
        return TIE, None
    share = z * math.hypot(*noises)
    difference = (constant_seconds - schedule_seconds) / constant_seconds
    if abs(difference) <= share:
        return TIE, share
    return (SCHEDULE if difference > 0 else CONSTANT), share


def _pieces(spans: Sequence[Tuple[int, int]], budget: int) -> List[Tuple[int, int, int]]:
    starts = [s for s, _ in spans] + [budget]
    return [(starts[i], starts[i + 1], g) for i, (_, g) in enumerate(spans) if starts[i + 1] > starts[i]]
