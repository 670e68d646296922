"""sweep.micro_batch_sizes=auto, the driver's side: a frontier search per worker count on the cluster,
every probe recorded as it ends, each frontier set beside its fake-tensor prediction, and the grid
built from what was found.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Dict, List, Optional, Tuple

from sweeper import plan
from sweeper.cluster import runs
from sweeper.config import SweeperConfig, budget_bytes
from sweeper.driver import console
from sweeper.driver.preflight import Prepared
from sweeper.driver.skeleton import Session
from sweeper.errors import first_line
from sweeper.measure import fake_memory, frontier
from sweeper.plan import GridPoint, frontier_label
from sweeper.report import frontier_files
from sweeper.report.folders import default_folder
from sweeper.schema import FrontierResult, PointResult
from sweeper.worker.spec import FrontierSpec, PointSpec

# A search's template point (micro-batch and accumulation 1: its workers and recipe) -> (largest
# micro-batch, with accumulation or None when not searched).
Frontiers = Dict[GridPoint, Tuple[int, Optional[int]]]


def search_frontiers(cfg: SweeperConfig, prepared: Prepared, session: Session, name: str) -> Frontiers:
    """For each worker count in each parallelism and recipe (precision x checkpointing), the largest
    micro-batch under the budget (under ZeRO-3 more workers leave room for a larger one), without and (when the grid accumulates) with gradient accumulation; a search that
    failed is left out."""
    searches = [GridPoint(1, 1, w, p, c, parallelism=layout) for layout in cfg.sweep.parallelism
                for w in sorted(set(cfg.sweep.num_workers))
                for p in cfg.sweep.precisions for c in cfg.sweep.activation_checkpointing]
    probes: Dict[GridPoint, List[PointResult]] = {s: [] for s in searches}
    found: Dict[GridPoint, FrontierResult] = {}

    def on_probe(search: GridPoint, result: PointResult) -> None:
        params = {
            "model": cfg.model.name,
            "dataset": cfg.data.name,
            "micro_batch_size": result.micro_batch_size,
            "accumulation_steps": result.accumulation_steps,
            "num_workers": search.num_workers,
            "parallelism": search.parallelism,
            "precision": search.precision,
            "activation_checkpointing": search.checkpointing,
            "probe_role": result.probe_role,
        }
        session.tracker.log_probe(params, result)
        probes[search].append(result)
        console.print_probe(search, result)

    console.print_frontier_start(searches, cfg.device.memory_budget_gb)
    runs.run_frontiers(f"{name}-frontier", frontier_specs(cfg, prepared, searches), session.resources,
                       session.cluster, on_probe, found.__setitem__)
    out: Frontiers = {}
    for search in searches:
        result = found.get(search) or FrontierResult(status="failed", error="the frontier search reported nothing")
        if result.status == "ok":
            add_margin(cfg, result)
            add_estimates(cfg, prepared, search, result)
        folder = frontier_files.write(default_folder(session.uri, name), search, probes[search], result)
        session.tracker.log_frontier(frontier_label(search), result, folder)
        console.print_frontier(search, result)
        if result.status == "ok" and result.plain is not None:  # a failed search leaves its points unmeasured
            accumulating = result.accumulating.safe_micro_batch_size if result.accumulating else None
            out[search] = (int(result.plain.safe_micro_batch_size), None if accumulating is None else int(accumulating))
    return out


def frontier_specs(cfg: SweeperConfig, prepared: Prepared, searches: List[GridPoint]) -> List[FrontierSpec]:
    measure = cfg.measure
    fspecs = []
    for search in searches:
        w = search.num_workers
        template = PointSpec(
            model=cfg.model, data=cfg.data, train=cfg.train, measure=measure, point=search,
            lr=cfg.optim.lr, steps=measure.warmup_steps, optim=cfg.optim, loss=cfg.loss,
        )
        # A frontier the points could not time is no use: cap it where a point still gets its
        # warm-up and stability windows from the data (one micro-batch per worker per step).
        budget = plan.sample_budget(prepared.num_train, cfg.train.epochs, cfg.train.samples)
        upper = budget // (w * (measure.warmup_steps + measure.stable_windows))
        fspecs.append(FrontierSpec(
            # No budget on GPU: the device's whole memory, read by the worker.
            template, budget_bytes(cfg.device), search_knobs(cfg), max(1, upper),
            accumulation_steps=list(cfg.sweep.accumulation_steps),
            global_batch_sizes=list(cfg.sweep.global_batch_sizes) if cfg.sweep.global_batch_sizes else None,
            verify_steps=cfg.frontier.verify_steps,
        ))
    return fspecs


def search_knobs(cfg: SweeperConfig) -> Dict[str, int]:
    """frontier.* as measure.frontier.FrontierSearch takes them (the margin and the verification's
    length are the driver's and the probes' business)."""
    return {k: v for k, v in asdict(cfg.frontier).items() if k not in ("margin", "verify_steps")}


def add_margin(cfg: SweeperConfig, result: FrontierResult) -> None:
    for found in (result.plain, result.accumulating):
        if found is not None and found.micro_batch_size is not None:
            found.safe_micro_batch_size = frontier.with_margin(found.micro_batch_size, cfg.frontier.margin,
                                                               cfg.frontier.multiple_of)


def add_estimates(cfg: SweeperConfig, prepared: Prepared, search: GridPoint, result: FrontierResult) -> None:
    """What a laptop would have predicted (fake tensors), set beside what the device measured."""
    try:
        for accumulation, found in ((1, result.plain), (2, result.accumulating)):
            if found is None:
                continue
            predicted = fake_memory.predicted_frontier(
                cfg, prepared.num_classes, search.num_workers, int(result.memory_budget_bytes), accumulation,
                *search.recipe,
            )
            found.estimated_micro_batch_size = predicted.micro_batch_size
    except Exception as exc:  # noqa: BLE001 - the estimate is extra
        console.warn(f"frontier not estimated on fake tensors: {first_line(exc)}")
