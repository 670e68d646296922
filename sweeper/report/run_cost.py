"""The run the answer configures, at full length, and what the sweep itself cost: the run's wall time,
device-hours and price at a layout's measured throughput (its evaluations and checkpoints at their measured
cost), the sweep's own device-hours and their share of the run, and the run's time to the target at each global
batch where the sweep measured the samples to it. Pure (stdlib).

Evaluations in the run: as in the sweep, every eval.every_samples rounded up to whole global batches and once at
the end (one at the end without eval.every_samples), each at the recommended point's measured seconds per
evaluation. Checkpoints: one with each evaluation, each at the points' measured write seconds (train.save_state
measures one); none counted, and said so, where no point saved.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from sweeper.report.trials import Trial

HOUR = 3600.0


@dataclass(frozen=True)
class RunCost:
    """The run at one layout: `samples` trained by `workers` at `samples_per_second`."""

    key: str
    samples: float
    workers: int
    samples_per_second: float
    evaluations: int
    eval_seconds: float  # all of them
    checkpoints: int
    checkpoint_seconds: float  # all of them
    price_per_device_hour: Optional[float] = None
    throughput_from: str = "measured"  # or a prediction's words, with its error
    notes: List[str] = field(default_factory=list)  # what is not counted, and why

    @property
    def train_seconds(self) -> float:
        return self.samples / self.samples_per_second

    @property
    def wall_seconds(self) -> float:
        return self.train_seconds + self.eval_seconds + self.checkpoint_seconds

    @property
    def device_hours(self) -> float:
        return self.workers * self.wall_seconds / HOUR

    @property
    def price(self) -> Optional[float]:
        return None if self.price_per_device_hour is None else self.device_hours * self.price_per_device_hour


def evaluations_in(samples: float, global_batch: int, every_samples: Optional[float]) -> int:
    """The run's evaluations: every `every_samples` rounded up to whole global batches, and one at the end
    (none more when the last periodic one falls on it)."""
    if not every_samples:
        return 1
    interval = math.ceil(every_samples / global_batch) * global_batch
    periodic = int(samples // interval)
    return periodic + (0 if periodic * interval == samples else 1)


def seconds_per_evaluation(t: Trial) -> Optional[float]:
    """A point's measured seconds per evaluation (None where it did not evaluate)."""
    if not t.evaluations or t.eval_seconds is None:
        return None
    return t.eval_seconds / t.evaluations


def checkpoint_seconds(trials: Sequence[Trial]) -> Optional[float]:
    """The points' measured seconds per checkpoint write (their median; None where none saved): a checkpoint's
    size is the model's and the optimizer's, not the layout's."""
    found = [t.checkpoint_write_seconds for t in trials if t.checkpoint_write_seconds is not None]
    return statistics.median(found) if found else None


def run_cost(best: Trial, samples: float, every_samples: Optional[float], checkpoint_write: Optional[float],
             price: Optional[float] = None, samples_per_second: Optional[float] = None, workers: Optional[int] = None,
             throughput_from: str = "measured") -> RunCost:
    """The run of `samples` at `best`'s layout: its measured throughput (or `samples_per_second`, a prediction
    at `workers`), its measured seconds per evaluation and `checkpoint_write` seconds per checkpoint."""
    rate = samples_per_second or best.samples_per_second
    if not rate:
        raise ValueError(f"{best.key} has no throughput to time a run with")
    notes = []
    evaluations = evaluations_in(samples, best.global_batch_size, every_samples)
    per_eval = seconds_per_evaluation(best)
    if per_eval is None:
        notes.append("evaluations not counted: the point recorded none")
        evaluations, per_eval = 0, 0.0
    checkpoints = evaluations if evaluations else 1
    if checkpoint_write is None:
        notes.append("checkpoints not counted: no point saved one (train.save_state=true measures a save)")
        checkpoints, checkpoint_write = 0, 0.0
    return RunCost(best.key, float(samples), int(workers or best.num_workers), float(rate), evaluations,
                   evaluations * per_eval, checkpoints, checkpoints * checkpoint_write, price, throughput_from, notes)


def sweep_device_seconds(rows: Sequence[Dict[str, Any]]) -> Optional[float]:
    """What the sweep itself used: over every run that trained or probed (tracking's SweepReader.spent), its
    workers x its wall time in its workers (`trial_seconds`, the point's build, training and evaluation) plus
    its worker group's start-up where the run paid it. A point sweep.strategy=smart or branch composed from its
    measurement runs has no run of its own: where measurement runs exist, the points are not counted again.
    None when no run recorded its time."""
    measured = any(r.get("role") not in ("trial", "probe") for r in rows)
    total, found = 0.0, False
    for r in rows:
        if measured and r.get("role") == "trial":
            continue
        seconds = _number(r.get("trial_seconds"))
        if seconds is None:
            continue
        found = True
        startup = (_number(r.get("worker_group_startup_seconds")) or 0.0) + (
            _number(r.get("between_points_seconds")) or 0.0)
        total += (_number(r.get("num_workers")) or 1.0) * (seconds + startup)
    return total if found else None


def _number(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class TargetAtFullLength:
    """One global batch's time to the target in the run: from its fastest point that reached the target in
    every seed (None: none did, so unknown)."""

    global_batch: int
    key: Optional[str]
    samples: Optional[float]
    seconds: Optional[float]
    device_hours: Optional[float]


def to_target(points: Sequence[Any], every_samples: Optional[float]) -> List[TargetAtFullLength]:
    """Per global batch the sweep measured (`points`: report.trials.PointSummary), the run's time to the target:
    the fastest point that reached it in every seed, its mean samples to the target at its measured throughput,
    with the evaluations on the way at its measured cost; unknown (None) where no point reached it in every
    seed. Empty when the sweep set no target."""
    if not any(p.trial.reached_target is not None for p in points):
        return []
    by_batch: Dict[int, List[Any]] = {}
    for p in points:
        if p.trial.status == "ok" and (p.trial.samples_per_second or p.trial.time_to_target_seconds):
            by_batch.setdefault(int(p.trial.global_batch_size), []).append(p)
    out = []
    for batch, members in sorted(by_batch.items()):
        reached = [p for p in members if p.reached_in_every_seed and p.trial.samples_to_target]
        if not reached:
            out.append(TargetAtFullLength(batch, None, None, None, None))
            continue
        fastest = max(reached, key=lambda p: (rate_to_target(p.trial) or 0.0, p.key)).trial
        samples = float(fastest.samples_to_target)
        seconds = _seconds_to_target(fastest, samples, batch, every_samples)
        out.append(TargetAtFullLength(batch, fastest.key, samples, seconds, fastest.num_workers * seconds / HOUR))
    return out


def rate_to_target(t: Trial) -> Optional[float]:
    """A point's samples per second on its way to the target: its timed throughput, else (a point that stopped at
    the target before a window was timed: eval.stop_at_target) its samples to the target over its measured time to
    it, evaluations included."""
    if t.samples_per_second:
        return float(t.samples_per_second)
    if t.samples_to_target and t.time_to_target_seconds:
        return float(t.samples_to_target) / float(t.time_to_target_seconds)
    return None


def _seconds_to_target(t: Trial, samples: float, batch: int, every_samples: Optional[float]) -> float:
    """The samples to the target at the point's timed throughput with the evaluations on the way at their measured
    cost; without a timed throughput, its measured time to the target (which holds those evaluations)."""
    if not t.samples_per_second:
        return float(t.time_to_target_seconds)
    per_eval = seconds_per_evaluation(t) or 0.0
    interval = math.ceil(every_samples / batch) * batch if every_samples else None
    evals = int(samples // interval) if interval else 0
    return samples / t.samples_per_second + evals * per_eval


def hours_text(seconds: float) -> str:
    """'45 s', '12 min', '3.4 h', '5.2 days'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * HOUR:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * HOUR:
        return f"{seconds / HOUR:.1f} h"
    return f"{seconds / (24 * HOUR):.1f} days"


def figure(value: float) -> str:
    """Two significant figures without an exponent: 0.0012, 3.4, 1,200."""
    if value <= 0:
        return "0"
    digits = max(0, 1 - math.floor(math.log10(value)))
    return f"{value:,.{digits}f}" if digits else f"{round(value, -int(math.floor(math.log10(value))) + 1):,.0f}"
