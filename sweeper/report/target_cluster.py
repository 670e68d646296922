"""An answer for a cluster you do not have (report.target_workers): the micro-batch and accumulation that keep the
recommended global batch at that many workers, their predicted throughput (report/throughput_model.py) and
memory per worker, the fastest that fits the budget. Also the memory a layout the sweep did not run would take,
for the elastic plan. Pure (stdlib; measure.sharded_memory for a sharded model's states).

Memory per worker of a layout not run, from the measured point of its parallelism and recipe nearest to it (the
same kind of accumulation, then the most workers, then the nearest micro-batch), moved by what differs:
- the micro-batch: the activations' bytes per sample, the slope of the group's peaks over their micro-batches at
  that point's workers and accumulation (or its recorded activations per sample);
- DDP: the gradient buckets (the whole model's gradients, with more than one worker) and the gradients held
  across micro-steps (with accumulation), each the model's parameter bytes; nothing else depends on the workers;
- ZeRO-2 and ZeRO-3: measure.sharded_memory.peak's model states (weights, gathered weights, held gradients,
  optimizer state, all-gather buffers) at the new layout minus at the point's, from the model's units that a
  sharded sweep records (param model_units); unknown without them.
Its error is measured the same way: each measured point of the group predicted from its nearest other point;
the worst relative error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sweeper.measure import sharded_memory
from sweeper.report import throughput_model as tm
from sweeper.report.trials import Trial

MAX_PARAM_CHARS = 6000  # an MLflow param's longest value


# ---------------------------------------------------------------------------------------------------
# The model's units, as a sharded sweep records them (param model_units)


def encode_units(units: Sequence[sharded_memory.Unit]) -> str:
    """The units as compact JSON: each unit's shapes, runs of identical units (a transformer's blocks) once with
    their count, the root last: [[count, [[shape...], ...]], ...]."""
    runs: List[List[Any]] = []
    for unit in units:
        shapes = [list(s) for s in unit.shapes]
        if runs and runs[-1][1] == shapes and unit.name != "root":
            runs[-1][0] += 1
        else:
            runs.append([1, shapes])
    return json.dumps(runs, separators=(",", ":"))


def decode_units(text: Optional[str]) -> Optional[List[sharded_memory.Unit]]:
    """encode_units' units back (blocks block0.., the last run the root); None for no text or text not of it."""
    if not text or text == "None":
        return None
    try:
        runs = json.loads(text)
        shapes = [tuple(tuple(int(d) for d in s) for s in run[1]) for run in runs for _ in range(int(run[0]))]
    except (ValueError, TypeError, IndexError):
        return None
    if not shapes:
        return None
    return [sharded_memory.Unit(f"block{i}", s) for i, s in enumerate(shapes[:-1])] + [
        sharded_memory.Unit("root", shapes[-1])]


# ---------------------------------------------------------------------------------------------------
# Memory of a layout the sweep did not run


@dataclass(frozen=True)
class MemoryModel:
    """What a group's memory predictions need: its measured points, the model's bytes and units."""

    parallelism: str
    points: Tuple[Trial, ...]
    parameter_bytes: Optional[float]
    units: Optional[List[sharded_memory.Unit]] = None
    gather_bytes_per_value: Optional[int] = None
    state_values_per_param: int = 2

    def predict(self, micro: int, accumulation: int, workers: int, exclude: str = "") -> Optional[float]:
        """Bytes per worker at this layout (None: no measured point to start from, or a sharded model without
        its units)."""
        ref = _nearest([p for p in self.points if p.key != exclude], micro, accumulation, workers)
        if ref is None:
            return None
        moved = ref.peak_memory_bytes + self._slope(ref, exclude) * (micro - ref.micro_batch_size)
        if self.parallelism == "ddp":
            whole = self.parameter_bytes or 0.0
            moved += whole * ((workers > 1) - (ref.num_workers > 1) + (accumulation > 1) - (ref.accumulation_steps > 1))
            return moved
        if self.units is None:
            return None
        return moved + self._states(micro, accumulation, workers) - self._states(
            ref.micro_batch_size, ref.accumulation_steps, ref.num_workers)

    def error(self) -> Optional[float]:
        """The worst relative error of predicting each measured point from the others (None: none could be)."""
        errors = []
        for p in self.points:
            got = self.predict(p.micro_batch_size, p.accumulation_steps, p.num_workers, exclude=p.key)
            if got is not None and p.peak_memory_bytes:
                errors.append(abs(got / p.peak_memory_bytes - 1))
        return max(errors) if errors else None

    def _states(self, micro: int, accumulation: int, workers: int) -> float:
        # The activations cancel (both sides at zero): what differs is the model's states and buffers.
        return sharded_memory.peak(self.units, self.parallelism, workers, micro, accumulation, 0.0,
                                   gather_bytes_per_value=self.gather_bytes_per_value,
                                   optimizer=sharded_memory.OptimizerCost(4.0 * self.state_values_per_param, 4.0)).total

    def _slope(self, ref: Trial, exclude: str = "") -> float:
        """Activation bytes per sample: the slope of the peaks over micro-batches at the reference's workers and
        accumulation (the point `exclude` left out), else its recorded activations per sample, else 0."""
        same = {p.micro_batch_size: p.peak_memory_bytes for p in self.points if p.key != exclude and p.peak_memory_bytes
                and (p.num_workers, p.accumulation_steps) == (ref.num_workers, ref.accumulation_steps)}
        if len(same) >= 2:
            xs, ys = list(same), list(same.values())
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            return max(slope, 0.0)
        if ref.memory_activations_bytes:
            return ref.memory_activations_bytes / ref.micro_batch_size
        return 0.0


def _nearest(points: Sequence[Trial], micro: int, accumulation: int, workers: int) -> Optional[Trial]:
    usable = [p for p in points if p.peak_memory_bytes]
    if not usable:
        return None
    return min(usable, key=lambda p: ((p.accumulation_steps > 1) != (accumulation > 1),
                                      (p.num_workers > 1) != (workers > 1), -p.num_workers,
                                      abs(p.micro_batch_size - micro), p.key))


def memory_model(model: tm.GroupModel, members: Sequence[Trial], units: Optional[List[sharded_memory.Unit]]
                 ) -> MemoryModel:
    """The memory model of a throughput model's group (`members`: its measured layouts)."""
    optimizer = model.group[3]
    # SGD keeps its momentum; AdamW two moments, and an optimizer of your own is counted as AdamW (the larger).
    values = 1 if optimizer == "sgd" else 2
    gather = None if model.group[1] == "fp32" else 2
    return MemoryModel(model.parallelism, tuple(t for t in members if t.status == "ok"), model.parameter_bytes,
                       units, gather, values)


# ---------------------------------------------------------------------------------------------------
# The answer at report.target_workers


@dataclass(frozen=True)
class Option:
    layout: tm.Layout
    prediction: Optional[tm.Prediction]
    memory_bytes: Optional[float]
    fits: Optional[bool]  # None: no budget, or memory unknown


def options(best: Trial, workers: int, model: tm.GroupModel, memory: MemoryModel, micro_sizes: Sequence[int],
            budget_bytes: Optional[float]) -> List[Option]:
    """Every micro-batch (of `micro_sizes`, or the whole share) that divides the share of the recommended global
    batch at `workers`, with its accumulation, predicted throughput and memory: the fastest that fits first."""
    batch = int(best.global_batch_size)
    if batch % workers:
        return []
    share = batch // workers
    out = []
    for micro in sorted({m for m in micro_sizes if share % m == 0} | {share}):
        layout = tm.Layout(micro, share // micro, workers)
        peak = memory.predict(micro, share // micro, workers)
        fits = None if budget_bytes is None or peak is None else peak <= budget_bytes
        out.append(Option(layout, model.predict(layout), peak, fits))
    return sorted(out, key=lambda o: (o.fits is False, o.prediction is None,
                                      -(o.prediction.samples_per_second if o.prediction else 0.0),
                                      o.layout.micro_batch_size))


def at_target(best: Trial, workers: int, model: Optional[tm.GroupModel], memory: Optional[MemoryModel],
              micro_sizes: Sequence[int], budget_bytes: Optional[float]) -> Dict[str, Any]:
    """The answer for `workers` as a plain dict (recommendation.yaml's `target_workers`): the chosen layout, its
    predicted figures with their errors, and every option considered; or why there is none."""
    batch = int(best.global_batch_size)
    head: Dict[str, Any] = {"num_workers": workers, "global_batch_size": batch, "prediction": True}
    if batch % workers:
        return {**head, "why": f"global batch {batch} is not a multiple of {workers} workers: no layout keeps it"}
    if model is None or memory is None:
        return {**head, "why": f"no throughput model for {best.key}'s parallelism and recipe (too few measured points)"}
    found = options(best, workers, model, memory, micro_sizes, budget_bytes)
    chosen = next((o for o in found if o.prediction is not None and o.fits is not False), None)
    rows = [_option_row(o) for o in found]
    if chosen is None:
        why = ("no micro-batch that divides the share fits the budget" if any(o.prediction for o in found) else
               f"no throughput predicted at {workers} workers: no point with more than one worker measured the "
               "communication, and cluster.interconnect_gbps is not set")
        return {**head, "why": why, "options": rows}
    return {**head, **_option_row(chosen), "memory_error": memory.error(), "options": rows}


def _option_row(o: Option) -> Dict[str, Any]:
    p = o.prediction
    return {"micro_batch_size": o.layout.micro_batch_size, "accumulation_steps": o.layout.accumulation_steps,
            "samples_per_second": None if p is None else float(p.samples_per_second),
            "throughput_error": None if p is None else p.error, "throughput_error_rule": None if p is None else p.rule,
            "peak_memory_bytes": None if o.memory_bytes is None else int(o.memory_bytes), "fits_budget": o.fits}
