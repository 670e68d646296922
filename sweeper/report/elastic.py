"""The answer as an elastic plan: Ray Train resizes a run between a minimum and a maximum of workers
(`ScalingConfig(num_workers=(min, max))`) and leaves the global batch to the user. For each worker count from
the fewest to the most the grid measured, the micro-batch and accumulation that keep the recommended global
batch and fit memory, with their throughput: measured where the sweep ran that point, predicted (and said so)
from the nearest measured points where it did not. Pure (stdlib).

Memory: a point fits when its measured peak (the largest worker's) is within the budget; with no budget, a point
that ran ok fitted. A layout the sweep did not run takes its memory from a measured point of the same micro-batch
and recipe: at its worker count (accumulation > 1 preferred when the plan accumulates: DDP's and FSDP2's held
gradients), or between measured worker counts the larger of the two neighbours' (sharding only lowers it as
workers grow). Throughput between measured counts: per worker, interpolated linearly in the worker count.
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
    same = [t for t in trials if t.status == "ok" and t.samples_per_second and _recipe(t) == _recipe(best)]
    counts = sorted({t.num_workers for t in same} | {best.num_workers})
    if len(counts) < 2:
        return None
    batch = int(best.global_batch_size)
    rows = []
    for workers in range(counts[0], counts[-1] + 1):
        if batch % workers:
            rows.append(_none(workers, batch, f"global batch {batch} is not a multiple of {workers} workers"))
        elif workers in counts:
            rows.append(_at_measured(same, workers, batch, budget_bytes))
        else:
            low = max(c for c in counts if c < workers)
            high = min(c for c in counts if c > workers)
            rows.append(_between(same, workers, batch, budget_bytes, low, high))
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


def _fits(t: Trial, budget_bytes: Optional[float]) -> bool:
    return budget_bytes is None or (t.peak_memory_bytes is not None and t.peak_memory_bytes <= budget_bytes)


def _at_measured(same: Sequence[Trial], workers: int, batch: int, budget: Optional[float]) -> Dict[str, Any]:
    """The fastest measured point of this global batch that fits; else the largest measured micro-batch at
    this worker count that divides the worker's share and fits, its throughput predicted from that point."""
    here = [t for t in same if t.num_workers == workers and _fits(t, budget)]
    exact = [t for t in here if t.global_batch_size == batch]
    if exact:
        t = max(exact, key=lambda t: (t.samples_per_second, -t.micro_batch_size))
        return _row(workers, t.micro_batch_size, batch, t.samples_per_second, t.peak_memory_bytes, "measured",
                    [t.key], f"measured: {t.key}")
    share = batch // workers
    usable = [t for t in here if share % t.micro_batch_size == 0]
    if not usable:
        return _none(workers, batch, f"no micro-batch measured at {workers} workers divides {share} and fits")
    accumulates = share > min(t.micro_batch_size for t in usable)
    t = max(usable, key=lambda t: (t.micro_batch_size, (t.accumulation_steps > 1) == accumulates,
                                   t.samples_per_second))
    return _row(workers, t.micro_batch_size, batch, t.samples_per_second, t.peak_memory_bytes, "predicted",
                [t.key], f"not run: micro-batch {t.micro_batch_size}'s throughput and memory from {t.key}")


def _between(same: Sequence[Trial], workers: int, batch: int, budget: Optional[float], low: int, high: int
             ) -> Dict[str, Any]:
    """A worker count the grid skipped: the largest micro-batch measured (and fitting) at both neighbours
    that divides the share; memory the larger neighbour's, samples/s per worker interpolated."""
    share = batch // workers
    for micro in sorted({t.micro_batch_size for t in same if share % t.micro_batch_size == 0}, reverse=True):
        sides = [[t for t in same if t.num_workers == n and t.micro_batch_size == micro] for n in (low, high)]
        if not all(sides) or not all(_fits(t, budget) for side in sides for t in side):
            continue
        fastest = [max(side, key=lambda t: t.samples_per_second) for side in sides]
        per_worker = [t.samples_per_second / t.num_workers for t in fastest]
        rate = per_worker[0] + (per_worker[1] - per_worker[0]) * (workers - low) / (high - low)
        peaks = [t.peak_memory_bytes for side in sides for t in side if t.peak_memory_bytes is not None]
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

