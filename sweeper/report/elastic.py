"""The answer as an elastic plan: Ray Train resizes a run between a minimum and a maximum of workers
(`ScalingConfig(num_workers=(min, max))`) and leaves the global batch to the user. For each worker count from
the fewest to the most the grid measured, the micro-batch and accumulation that keep the recommended global
batch and fit memory, with their throughput: measured where the sweep ran that point, predicted (and said so)
from the nearest measured points where it did not. Pure (stdlib).

Memory: a point fits when its measured peak (the largest worker's) is within the budget; with no budget, a point
that ran ok fitted. A layout the sweep did not run takes its memory from a point of the same micro-batch, recipe
and accumulation class (accumulating or not: accumulating holds gradients beside the activations, DDP's and
FSDP2's, so a point without accumulation never stands for one with it): measured when the sweep ran one, else
the sharded model's prediction recorded on a point of that layout (one skipped by prediction too); between
measured worker counts the larger of the two neighbours' (sharding only lowers it as workers grow). A layout
whose memory is neither measured nor predicted does not fit a budget. Throughput between measured counts: per
worker, interpolated linearly in the worker count.
With the report's throughput model (`predict`: report/projection.elastic_predictor), a predicted row's throughput
and memory are the model's instead, each with its measured error (report/throughput_model.py,
report/target_cluster.py).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from sweeper.report import parallelism
from sweeper.report.trials import Trial


def _recipe(t: Trial) -> Tuple[Any, ...]:
    """What must match for a point's throughput and memory to stand for the recommended layout's (the LR
    multiplier does not: neither depends on the LR)."""
    return (t.precision or "fp32", t.activation_checkpointing or "none", t.optimizer, bool(t.compiled), t.context,
            parallelism.of(t))


# (micro-batch, accumulation, workers) -> the model's figures for that layout: samples_per_second,
# samples_per_second_error (None: unbounded), error_rule, peak_memory_bytes, peak_memory_error; None: no prediction.
Predictor = Callable[[int, int, int], Optional[Dict[str, Any]]]


def plan(trials: Sequence[Trial], best: Trial, budget_bytes: Optional[float] = None,
         predict: Optional[Predictor] = None) -> Optional[Dict[str, Any]]:
    """{"global_batch_size", "num_workers": [min, max] of the elastic range (None when no two neighbouring
    counts both have a layout), "rows": one per worker count from the fewest to the most measured}. None
    when the recommended recipe was measured at one worker count only (nothing to resize between). `predict`:
    the throughput model's figures for a row the sweep did not run."""
    recorded = [t for t in trials if _recipe(t) == _recipe(best)]
    same = [t for t in recorded if t.status == "ok" and t.samples_per_second]
    counts = sorted({t.num_workers for t in same} | {best.num_workers})
    if len(counts) < 2:
        return None
    batch = int(best.global_batch_size)
    memory = _Memory(recorded, best.gradient_sync)
    rows = []
    for workers in range(counts[0], counts[-1] + 1):
        if batch % workers:
            rows.append(_none(workers, batch, f"global batch {batch} is not a multiple of {workers} workers"))
        elif workers in counts:
            rows.append(_at_measured(same, workers, batch, budget_bytes, memory))
        else:
            low = max(c for c in counts if c < workers)
            high = min(c for c in counts if c > workers)
            rows.append(_between(same, workers, batch, budget_bytes, low, high, memory))
    if predict is not None:
        rows = [_modelled(r, predict) if r["source"] == "predicted" else r for r in rows]
    return {"global_batch_size": batch, "num_workers": _span(rows, best.num_workers), "rows": rows}


def _modelled(row: Dict[str, Any], predict: Predictor) -> Dict[str, Any]:
    """A predicted row with the throughput model's figures and their errors, where it has them."""
    found = predict(row["micro_batch_size"], row["accumulation_steps"], row["num_workers"])
    if not found:
        return row
    kept = {k: v for k, v in found.items() if v is not None or k.endswith("_error")}
    why = f"{row['why']}; throughput from the throughput model ({found.get('error_rule')})"
    return {**row, **kept, "why": why}


def _fits(peak: Optional[float], budget_bytes: Optional[float]) -> bool:
    return budget_bytes is None or (peak is not None and peak <= budget_bytes)


class _Memory:
    """The peak of a layout (workers, micro-batch, accumulating or not) of the recommended recipe: a measured
    point's (the largest such), else a recorded prediction (measure.sharded_memory's, on any record of it)."""

    def __init__(self, recorded: Sequence[Trial], sync: Optional[str]):
        self.recorded, self.sync = recorded, sync

    def of(self, workers: int, micro: int, accumulates: bool) -> Tuple[Optional[float], List[str], str]:
        """(peak, the keys it comes from, "measured" | "predicted" | "unknown")."""
        like = [t for t in self.recorded if (t.num_workers, t.micro_batch_size) == (workers, micro)
                and (t.accumulation_steps > 1) == accumulates
                and (not accumulates or self.sync is None or t.gradient_sync in (None, self.sync))]
        measured = [t for t in like if t.status == "ok" and t.peak_memory_bytes is not None]
        if measured:
            t = max(measured, key=lambda t: t.peak_memory_bytes)
            return t.peak_memory_bytes, [t.key], "measured"
        predicted = [t for t in like if t.memory_predicted_bytes is not None]
        if predicted:
            t = max(predicted, key=lambda t: t.memory_predicted_bytes)
            return t.memory_predicted_bytes, [t.key], "predicted"
        return None, [], "unknown"


def _at_measured(same: Sequence[Trial], workers: int, batch: int, budget: Optional[float], memory: _Memory
                 ) -> Dict[str, Any]:
    """The fastest measured point of this global batch that fits; else the largest measured micro-batch at
    this worker count that divides the worker's share and whose layout's memory fits, its throughput predicted
    from the fastest point of that micro-batch (of the same accumulation class when there is one)."""
    here = [t for t in same if t.num_workers == workers]
    exact = [t for t in here if t.global_batch_size == batch and _fits(t.peak_memory_bytes, budget)]
    if exact:
        t = max(exact, key=lambda t: (t.samples_per_second, -t.micro_batch_size))
        return _row(workers, t.micro_batch_size, batch, t.samples_per_second, t.peak_memory_bytes, "measured",
                    [t.key], f"measured: {t.key}")
    share = batch // workers
    for micro in sorted({t.micro_batch_size for t in here if share % t.micro_batch_size == 0}, reverse=True):
        accumulates = share > micro
        peak, basis, how = memory.of(workers, micro, accumulates)
        if not _fits(peak, budget):
            continue
        runs = [t for t in here if t.micro_batch_size == micro]
        t = max(runs, key=lambda t: ((t.accumulation_steps > 1) == accumulates, t.samples_per_second))
        said = f"; memory {how} on {basis[0]}" if basis and basis[0] != t.key else ""
        return _row(workers, micro, batch, t.samples_per_second, peak, "predicted",
                    list(dict.fromkeys([t.key, *basis])),
                    f"not run: micro-batch {micro}'s throughput from {t.key}{said}")
    return _none(workers, batch, f"no micro-batch measured at {workers} workers divides {share} and fits"
                 + (" (a layout's memory neither measured nor predicted does not)" if budget is not None else ""))


def _between(same: Sequence[Trial], workers: int, batch: int, budget: Optional[float], low: int, high: int,
             memory: _Memory) -> Dict[str, Any]:
    """A worker count the grid skipped: the largest micro-batch measured at both neighbours that divides the
    share and whose layout fits at both (memory of the row's accumulation class, known on at least one side:
    the larger); samples/s per worker interpolated."""
    share = batch // workers
    for micro in sorted({t.micro_batch_size for t in same if share % t.micro_batch_size == 0}, reverse=True):
        sides = [[t for t in same if t.num_workers == n and t.micro_batch_size == micro] for n in (low, high)]
        if not all(sides):
            continue
        known = [memory.of(n, micro, share > micro)[0] for n in (low, high)]
        peaks = [p for p in known if p is not None]
        if budget is not None and (not peaks or not all(_fits(p, budget) for p in peaks)):
            continue
        fastest = [max(side, key=lambda t: t.samples_per_second) for side in sides]
        per_worker = [t.samples_per_second / t.num_workers for t in fastest]
        rate = per_worker[0] + (per_worker[1] - per_worker[0]) * (workers - low) / (high - low)
        return _row(workers, micro, batch, rate * workers, max(peaks) if peaks else None, "predicted",
                    [t.key for t in fastest], f"not run: between {fastest[0].key} and {fastest[1].key}")
    return _none(workers, batch, f"no micro-batch measured at both {low} and {high} workers divides {share}")


def _row(workers: int, micro: int, batch: int, rate: Optional[float], peak: Optional[float], source: str,
         basis: List[str], why: str) -> Dict[str, Any]:
    return {"num_workers": workers, "micro_batch_size": int(micro),
            "accumulation_steps": batch // (workers * int(micro)), "global_batch_size": batch,
            "samples_per_second": None if rate is None else float(rate),
            "peak_memory_bytes": None if peak is None else int(peak), "source": source, "from": basis, "why": why}


def _none(workers: int, batch: int, why: str) -> Dict[str, Any]:
    return {"num_workers": workers, "micro_batch_size": None, "accumulation_steps": None, "global_batch_size": batch,
            "samples_per_second": None, "peak_memory_bytes": None, "source": None, "from": [], "why": why}


def _span(rows: Sequence[Dict[str, Any]], workers: int) -> Optional[List[int]]:
    """The run of consecutive worker counts, each with a layout, around the recommended one: Ray Train may
    start the run at any size within (min, max). None when that run is the recommended count alone."""
    have = {r["num_workers"] for r in rows if r["micro_batch_size"]}
    if workers not in have:
        return None
    low = high = workers
    while low - 1 in have:
        low -= 1
    while high + 1 in have:
        high += 1
    return [low, high] if high > low else None

