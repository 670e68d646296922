"""Memory per worker predicted before launch, for a sweep with a sharded parallelism: each point's peak
(measure.sharded_memory, from the model's parameter shapes and the fitted activation slope), and the points
over device.memory_budget_gb recorded as out of memory (sweeper.oom=predicted) instead of launched.

A sweep of DDP alone is measured as before (its budget enforced on the point's tracked step); the frontier
search's grid (sweep.micro_batch_sizes=auto) is built from measured probes and never skipped by prediction.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from sweeper.config import SweeperConfig, budget_bytes
from sweeper.config.sweep import SHARDED
from sweeper.driver import console
from sweeper.errors import first_line
from sweeper.measure import sharded_memory
from sweeper.plan import GridPoint
from sweeper.schema import PointResult

Record = Tuple[GridPoint, PointResult]


def predict(cfg: SweeperConfig, points: Sequence[GridPoint], num_classes: int,
            at_context: Callable[[SweeperConfig, Optional[int]], SweeperConfig] = lambda cfg, context: cfg
            ) -> Dict[GridPoint, sharded_memory.Prediction]:
    """Each point's predicted peak per worker when the sweep has a sharded parallelism ({} otherwise, or with a
    warning when the model cannot be traced on fake tensors); `at_context`: the sweep as a point of a context
    sees it (preflight's)."""
    if not any(p in SHARDED for p in cfg.sweep.parallelism):
        return {}
    from sweeper.measure import fake_memory

    out: Dict[GridPoint, sharded_memory.Prediction] = {}
    try:
        for context in sorted({p.context for p in points}, key=lambda c: c or 0):
            out.update(fake_memory.sharded_predictions(at_context(cfg, context),
                                                    [p for p in points if p.context == context], num_classes))
    except Exception as exc:  # noqa: BLE001 - a prediction is extra: the points are measured regardless
        console.warn(f"memory per worker not predicted for model {cfg.model.name!r}: {first_line(exc)}")
        return {}
    return out


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
    """The points whose predicted peak is over `budget` bytes per worker (None: no budget, none), each with
    its one line (the prediction and its largest parts)."""
    if budget is None:
        return {}
    lines = {point: sharded_memory.over_budget(prediction, budget, point.key)
             for point, prediction in predictions.items()}
    return {point: line for point, line in lines.items() if line is not None}


def skip(cfg: SweeperConfig, points: Sequence[GridPoint], lines: Mapping[GridPoint, str], done_keys: frozenset,
         record) -> Tuple[List[GridPoint], List[Record]]:
    """(the points to launch, the records of those skipped): each point in `lines` recorded once through
    `record(point, result)` as out of memory by prediction (status oom, tag sweeper.oom=predicted, the line
    as its error), unless the sweep already holds it (a resumed sweep); the others left to launch."""
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
        console.note(lines[point])
        record(point, result)
        skipped.append((point, result))
    return launched, skipped
