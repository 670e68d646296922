"""What is predicted before launch for a sweep with a sharded parallelism: each point's peak per worker
(measure.sharded_memory, from the model's parameter shapes, the fitted activation slope and the optimizer's
measured cost; CUDA's margin on CUDA workers), the points over device.memory_budget_gb by more than the
prediction's error recorded as out of memory (sweeper.oom=predicted) instead of launched, and whether data
parallelism can hold the model at all. Each point's communication per step (measure.communication) for every
sweep whose model's units can be read.

A sweep of DDP alone is measured as before (its budget enforced on the point's tracked step); the frontier
search's grid (sweep.micro_batch_sizes=auto) is built from measured probes and never skipped by prediction.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from sweeper.config import SweeperConfig, budget_bytes
from sweeper.config.sweep import SHARDED
from sweeper.driver import console
from sweeper.errors import first_line
from sweeper.measure import communication, sharded_memory
from sweeper.measure.layouts import LAYOUTS
from sweeper.plan import GridPoint
from sweeper.schema import PointResult

Record = Tuple[GridPoint, PointResult]
AtContext = Callable[[SweeperConfig, Optional[int]], SweeperConfig]


def device_type(cfg: SweeperConfig) -> str:
    """The workers' device as far as it is known before Ray starts: cuda with cluster.use_gpu=true, or auto on
    a local machine with a GPU; cpu otherwise (a joined cluster with use_gpu=auto is predicted for CPU workers:
    set cluster.use_gpu=true for CUDA's margin)."""
    if cfg.cluster.use_gpu == "true":
        return "cuda"
    if cfg.cluster.use_gpu == "auto" and cfg.cluster.address is None:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


def predict(cfg: SweeperConfig, points: Sequence[GridPoint], num_classes: int,
            at_context: AtContext = lambda cfg, context: cfg, device: str = "cpu"
            ) -> Dict[GridPoint, sharded_memory.Prediction]:
    """Each point's predicted peak per worker on `device` workers when the sweep has a sharded parallelism ({}
    otherwise, or with a warning when the model cannot be traced on fake tensors or the optimizer measured);
    `at_context`: the sweep as a point of a context sees it (preflight's)."""
    if not any(p in SHARDED for p in cfg.sweep.parallelism):
        return {}
    from sweeper.measure import fake_memory

    out: Dict[GridPoint, sharded_memory.Prediction] = {}
    try:
        for context in sorted({p.context for p in points}, key=lambda c: c or 0):
            out.update(fake_memory.sharded_predictions(at_context(cfg, context),
                                                       [p for p in points if p.context == context], num_classes,
                                                       device))
    except Exception as exc:  # noqa: BLE001 - a prediction is extra: the points are measured regardless
        console.warn(f"memory per worker not predicted for model {cfg.model.name!r}: {first_line(exc)}")
        return {}
    if points and not out:
        console.warn(f"memory per worker not predicted: the optimizer {cfg.optim._target_ or cfg.optim.name!r} "
                     "could not be measured on fake tensors (its factory refused them)")
    return out


def communication_per_step(cfg: SweeperConfig, points: Sequence[GridPoint], num_classes: int) -> Dict[GridPoint, int]:
    """Each point's predicted bytes sent per worker per optimizer step ({} when the model's units cannot be read
    on the meta device)."""
    from sweeper.measure import fake_memory

    try:
        units = fake_memory.model_units(cfg, num_classes)
    except Exception as exc:  # noqa: BLE001 - a prediction is extra
        console.warn(f"communication per step not predicted for model {cfg.model.name!r}: {first_line(exc)}")
        return {}
    return {p: communication.per_step(units, p.parallelism, p.num_workers, p.accumulation_steps, p.gradient_sync,
                                      gather_bytes_per_value=2 if (p.precision != "fp32" and p.parallelism in SHARDED)
                                      else None).bytes
            for p in points if p.parallelism in LAYOUTS}  # zero1's and hsdp's: worker/sharding.traffic, once placed
def units_param(cfg: SweeperConfig, num_classes: int) -> Dict[str, str]:
    """{"model_units": the model's units as report/target_cluster.encode_units writes them} for a sweep with a
    sharded parallelism: the report predicts a sharded layout's memory at worker counts the sweep did not run from
    them. {} for a DDP sweep, a model that cannot be built here, or units too long for an MLflow param."""
    if not any(p in SHARDED for p in cfg.sweep.parallelism):
        return {}
    from sweeper import recipe
    from sweeper.report import target_cluster
    from sweeper.workloads import models

    try:
        model = models.build_on_meta(cfg.model, num_classes)
        text = target_cluster.encode_units(sharded_memory.units_of(model, recipe.blocks(model,
                                                                                        cfg.model.checkpoint_modules)))
    except Exception as exc:  # noqa: BLE001 - the report says memory unknown without them; the sweep goes on
        console.warn(f"the model's units were not recorded ({first_line(exc)}): memory at other worker counts unknown")
        return {}
    return {"model_units": text} if len(text) <= target_cluster.MAX_PARAM_CHARS else {}


def over_budget(predictions: Mapping[GridPoint, sharded_memory.Prediction], budget: Optional[int]
                ) -> Dict[GridPoint, str]:
    """The points whose predicted peak is over `budget` bytes per worker by more than the prediction's error
    (sharded_memory.PREDICTION_ERROR_BAND; None: no budget, none), each with its one line (the prediction, its
    phase and its largest parts). Those over it within the error are launched, said once each."""
    if budget is None:
        return {}
    out: Dict[GridPoint, str] = {}
    for point, prediction in predictions.items():
        line = sharded_memory.over_budget(prediction, budget, point.key)
        if line is not None:
            out[point] = line
        elif (near := sharded_memory.near_budget(prediction, budget, point.key)) is not None:
            console.note(near)
    return out


def beyond_data_parallelism(cfg: SweeperConfig, points: Sequence[GridPoint], num_classes: int,
                            at_context: AtContext = lambda cfg, context: cfg, device: str = "cpu") -> Optional[str]:
    """One line when even ZeRO-3 at the sweep's largest worker count, the smallest micro-batch, one micro-step
    and its cheapest recipe is predicted over the budget beyond the prediction's error: data parallelism alone
    cannot hold the model on these workers. None when it can, or when nothing is predicted."""
    budget = budget_bytes(cfg.device)
    if budget is None or not points or not any(p in SHARDED for p in cfg.sweep.parallelism):
        return None
    workers = max(p.num_workers for p in points)
    least = min(points, key=lambda p: (p.micro_batch_size, p.context or 0))
    probes = [replace(least, num_workers=workers, accumulation_steps=1, parallelism="zero3", gradient_sync="final",
                      precision=precision, checkpointing=checkpointing, seed=None, lr_multiplier=1.0)
              for precision in cfg.sweep.precisions if precision != "fp16"
              for checkpointing in cfg.sweep.activation_checkpointing]
    found = predict(cfg, probes, num_classes, at_context, device)
    if len(found) < len(probes) or not found:
        return None
    best = min(found, key=lambda p: found[p].total)
    if sharded_memory.over_budget(found[best], budget, best.key) is None:
        return None
    return (f"even ZeRO-3 at {workers} workers ({best.key}, the smallest layout swept) is predicted at "
            f"{found[best].total / 2 ** 20:.1f} MiB per worker, over device.memory_budget_gb "
            f"({budget / 2 ** 20:.1f} MiB): data parallelism alone cannot hold this model here. More workers shard "
            "it further; tensor or pipeline parallelism, which split each layer or the layers themselves, are "
            "outside sweeper's scope")


def skip(cfg: SweeperConfig, points: Sequence[GridPoint], lines: Mapping[GridPoint, str], done_keys: frozenset,
         record, predicted_bytes: Optional[Mapping[GridPoint, Optional[int]]] = None
         ) -> Tuple[List[GridPoint], List[Record]]:
    """(the points to launch, the records of those skipped): each point in `lines` recorded once through
    `record(point, result)` as out of memory by prediction (status oom, tag sweeper.oom=predicted, the line
    as its error, its predicted peak from `predicted_bytes`), unless the sweep already holds it (a resumed
    sweep); the others left to launch."""
    launched: List[GridPoint] = []
    skipped: List[Record] = []
    budget = budget_bytes(cfg.device)
    for point in points:
        if point not in lines:
            launched.append(point)
            continue
        if point.key in done_keys:
            continue
        result = PointResult(trial_key=point.key, status="oom", oom_predicted=True, error=lines[point])
        result.memory.memory_budget_bytes = budget
        result.memory.memory_predicted_bytes = (predicted_bytes or {}).get(point)
        console.note(lines[point])
        record(point, result)
        skipped.append((point, result))
    return launched, skipped
