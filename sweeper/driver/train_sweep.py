"""The train sweep, start to finish: check everything, connect, record the parent run, find the
frontier (sweep.micro_batch_sizes=auto), measure the points through the sweep's strategy (found by its
name in driver/strategy.py and asked, never named: grid, smart or branch), report.

Takes typed config only; Hydra stays in `__main__`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

from sweeper import plan, tracking
from sweeper.cluster.resources import Resources
from sweeper.config import SweeperConfig, tracking_uri
from sweeper.driver import console, predicted, resume
from sweeper.driver.frontier import search_frontiers
from sweeper.driver.params import accuracy_note, optimizer_name, record_point
from sweeper.driver.preflight import NEEDS_BUDGET, Prepared, build_specs, preflight
from sweeper.driver.skeleton import Phases, Session, session
from sweeper.driver.strategy import strategy_of
from sweeper.errors import EXIT_OK, EXIT_POINT_FAILED, ConfigError, first_line
from sweeper.measure import frontier
from sweeper.plan import GridPoint
from sweeper.report.build import build
from sweeper.report.recorded import settings_params
from sweeper.schema import SweepSummary
from sweeper.strategies.base import Rows
from sweeper.worker.spec import PointSpec
from sweeper.workloads import datasets


def run(cfg: SweeperConfig, resolved_yaml: str) -> int:
    """Run the sweep; the exit status is 0 when every point ended ok or oom, 1 if any failed."""
    phases = Phases()
    strategy = strategy_of(cfg.sweep.strategy)  # grid | smart | branch: it chooses and runs the points
    cfg = strategy.configure(cfg)
    prepared, specs = preflight(cfg)
    phases("setup")
    sizing = prepared.points or [GridPoint(1, 1, w) for w in cfg.sweep.num_workers]
    tracker, interrupted = None, None
    if cfg.sweep.resume:  # the sweep to resume found and checked before Ray starts: a refusal costs no Ray
        tracker = tracking.Tracker(tracking_uri(cfg.tracking), cfg.tracking.experiment_name)
        interrupted = resume.find_interrupted(cfg, tracker, resolved_yaml)
    with session(cfg, phases, sizing, tracker) as s:
        if prepared.auto and cfg.device.memory_budget_gb is None and not s.resources.use_gpu:
            raise ConfigError([NEEDS_BUDGET])  # a cluster without GPUs
        name, parent, done_keys = open_sweep(cfg, s, prepared.auto, resolved_yaml, interrupted)
        s.tracker.dataset = dataset_record(cfg, prepared)
        _opening_params(cfg, s, strategy, prepared)
        phases("tracking")
        console.print_where(s.uri, s.cluster.dashboard_url, s.cluster.token_path, s.cluster.results_dir)
        points, specs, frontier_failed = prepared.points, specs, False
        if prepared.auto:
            points, specs, frontier_failed = grid_from_frontier(cfg, prepared, s, name)
            phases("frontier")
            if not points:
                phases("grid")
                s.end(summary([], phases, Counter()), "FAILED")
                return EXIT_POINT_FAILED
        points, skipped = predicted.skip(cfg, points, prepared.over_budget, done_keys,
                                         lambda p, r: record_point(cfg, s, specs[p], p, r),
                                         {p: specs[p].memory_predicted_bytes for p in points})
        measured = strategy.measure(cfg, s, name, points, specs, done_keys, prepared)
        rows = skipped + measured.rows
        phases("grid")
        spent = measured.spent.metrics() if measured.spent is not None else None
        if spent is not None:  # on the parent before the report, which says what the strategy spent
            s.tracker.log_parent_metrics(spent)
        s.tracker.replay()  # writes the store refused while it was down, before the report reads it
        made = make_report(cfg, s.tracker, parent)
        phases("report")
        statuses = recorded_statuses(s, parent, rows)
        failed = statuses["failed"] > 0 or frontier_failed
        # smart, branch: a composed point has no run of its own; the point-time is their measurement runs'
        closing = summary(rows if measured.spent is None else measured.spent.measured, phases, statuses)
        if spent is not None:
            console.print_ledger(spent)
        if measured.answer is not None:
            console.print_branch_answer(measured.answer)
        s.end(closing, "FAILED" if failed else "FINISHED")
        console.print_summary(rows, s.uri, parent, cfg.tracking.experiment_name, accuracy_note(cfg))
        if made is not None:
            console.print_report(made.html_path, made.text, made.yaml_path)
        # Writes still pending: the record is not complete, whatever the points did.
        return EXIT_POINT_FAILED if failed or s.tracker.pending else EXIT_OK


def _opening_params(cfg: SweeperConfig, s: Session, strategy: Any, prepared: Any) -> None:
    """The parent run's params known before the first point: the strategy's, a sharded sweep's model units (the
    report's memory per worker at worker counts it did not run) and the data-parallel limit (said now too)."""
    opening = {**strategy.opening_params(prepared.batch_coupled), **predicted.units_param(cfg, prepared.num_classes)}
    if not cfg.sweep.resume and opening:
        s.tracker.log_sweep_params(opening)
    if prepared.beyond_data_parallelism:  # said now and in the answer (report/text.py reads the param)
        console.warn(prepared.beyond_data_parallelism)
        if not cfg.sweep.resume:
            s.tracker.log_sweep_params({"data_parallel_limit": prepared.beyond_data_parallelism})


def recorded_statuses(s: Session, parent: str, rows: Rows) -> Counter:
    """How the sweep's points ended, counted from MLflow, so a resumed sweep's totals include what was
    recorded before it stopped; this run's own points when the store cannot be read now."""
    try:
        return Counter(child["status"] for child in tracking.SweepReader(s.tracker.store, parent).load().children)
    except Exception as exc:  # noqa: BLE001 - the store is down: its writes wait in the journal
        console.warn(f"the sweep's record cannot be read now ({type(exc).__name__}: {first_line(exc)}); "
                     "counting this run's points")
        return Counter(result.status for _, result in rows)


def open_sweep(cfg: SweeperConfig, s: Session, auto: bool, resolved_yaml: str,
               interrupted: Optional[Tuple[str, str]] = None) -> Tuple[str, str, frozenset]:
    """The sweep's name, its parent run (a new one, or `interrupted`: the unfinished one sweep.resume
    found and checked, as (name, parent run id)) and the keys of the points it already holds complete
    (failed ones left out with sweep.retry_failed, so they are measured again)."""
    if interrupted is not None:
        name, parent = interrupted
        replayed, half_written = s.tracker.resume_sweep(parent)
        reader = s.tracker.reader
        done = set(reader.recorded_keys()) - (set(reader.failed_keys()) if cfg.sweep.retry_failed else set())
        console.print_resume(name, len(done), replayed, half_written)
        return name, parent, frozenset(done)
    name = resume.sweep_name("sweep", cfg.model.name, cfg.data.name)
    params = sweep_params(cfg, auto, s.resources)
    parent = s.tracker.start_sweep(name, params, resolved_yaml, config_hash=resume.config_hash(resolved_yaml))
    return name, parent, frozenset()


def grid_from_frontier(
    cfg: SweeperConfig, prepared: Prepared, s: Session, name: str
) -> Tuple[List[GridPoint], Dict[GridPoint, PointSpec], bool]:
    """sweep.micro_batch_sizes=auto: the grid built from each search's frontier, recipe by recipe;
    whether a search failed."""
    frontiers = search_frontiers(cfg, prepared, s, name)
    points: List[GridPoint] = []
    for layout, recipe in dict.fromkeys((search.parallelism, search.recipe) for search in frontiers):
        found = {search.num_workers: sizes for search, sizes in frontiers.items()
                 if (search.parallelism, search.recipe) == (layout, recipe)}
        made, skipped = frontier.grid_from_frontiers(found, cfg.sweep.accumulation_steps,
                                                     cfg.sweep.global_batch_sizes, recipe, layout)
        points += plan.replicate(plan.with_gradient_syncs(made, cfg.sweep.gradient_sync), cfg.sweep.lr_multipliers,
                                 cfg.sweep.seeds)
        for line in skipped:
            console.warn(f"not measured ({', '.join((layout, *recipe))}): {line}")
    if not points:
        console.warn("the frontier search left no grid point to measure")
        return [], {}, True
    searched = len(set(cfg.sweep.num_workers)) * len(cfg.sweep.precisions) * len(cfg.sweep.activation_checkpointing) \
        * len(cfg.sweep.parallelism)
    return points, build_specs(cfg, prepared, points), len(frontiers) < searched


def dataset_record(cfg: SweeperConfig, prepared: Prepared) -> tracking.DatasetRecord:
    """The data every point trains on, for each point's MLflow dataset input."""
    source = datasets.source(cfg.data) + (f", {prepared.data_identity}" if prepared.data_identity else "")
    config = {**asdict(cfg.data), "identity": prepared.data_identity}
    return tracking.DatasetRecord.of(cfg.data.name, source, config, prepared.num_train, prepared.num_val)


def sweep_params(cfg: SweeperConfig, auto: bool, resources: Resources) -> Dict[str, Any]:
    """The parent run's params: what was asked for and how it was run."""
    return {
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "micro_batch_sizes": cfg.sweep.micro_batch_sizes if auto else list(cfg.sweep.micro_batch_sizes),
        "accumulation_steps": list(cfg.sweep.accumulation_steps),
        "num_workers": list(cfg.sweep.num_workers),
        "parallelism": list(cfg.sweep.parallelism),
        "gradient_sync": list(cfg.sweep.gradient_sync),
        "global_batch_sizes": cfg.sweep.global_batch_sizes,
        "points_per_worker_group": cfg.sweep.points_per_worker_group,
        "profile": cfg.profile,
        "lr_scaling": cfg.train.lr_scaling,
        "base_batch_size": cfg.train.base_batch_size,
        "base_lr": cfg.optim.lr,
        "optimizer": optimizer_name(cfg),
        "precisions": list(cfg.sweep.precisions),
        "activation_checkpointing": list(cfg.sweep.activation_checkpointing),
        "compiled": cfg.train.compile,
        "lr_multipliers": list(cfg.sweep.lr_multipliers),
        "seeds": cfg.sweep.seeds if cfg.sweep.seeds is not None else [cfg.train.seed],
        "warmup_steps": cfg.train.warmup_steps,
        "eval_every_samples": cfg.eval.every_samples,
        "eval_target_accuracy": cfg.eval.target_accuracy,
        "eval_target_loss": cfg.eval.target_loss,
        "eval_batch_size": cfg.eval.batch_size,
        "eval_max_samples": cfg.eval.max_samples,
        "eval_metrics_fn": cfg.eval.metrics_fn,
        "use_gpu": resources.use_gpu,
        "cpus_per_worker": resources.cpus_per_worker,
        "device_memory_budget_gb": cfg.device.memory_budget_gb,
        # The loader the points ran with: the report names them beside a data-bound point (report/data_bound.py).
        "loader_workers": cfg.data.loader_workers,
        "pin_memory": cfg.data.pin_memory,
        "prefetch_factor": cfg.data.prefetch_factor,
        # the report's throughput model divides each parallelism's bytes by it (null: fitted from the points)
        "interconnect_gbps": cfg.cluster.interconnect_gbps,
        # The question the report answers, so `python -m sweeper.report` rebuilds the same answer.
        **settings_params(cfg.report),
    }


def summary(rows: Rows, phases: Phases, statuses: Counter) -> SweepSummary:
    """The parent run's closing figures: how the points ended, and the harness's cost: where the
    sweep's wall time went against its points' own time, each point's model build, training and
    evaluation (`trial_seconds`), and its optimizer steps alone (`train_seconds`)."""
    wall = phases.wall
    out = SweepSummary(sweep_wall_seconds=wall)
    out.count(statuses)
    out.update({f"sweep_{name}_seconds": seconds for name, seconds in phases.seconds.items()})
    for name in ("trial", "train"):
        total = sum(r.cost.get(f"{name}_seconds", 0.0) for _, r in rows)
        out.update({f"sum_{name}_seconds": total})
        if total > 0:
            out.update({f"sweep_wall_over_{name}_seconds": wall / total})
    return out


def make_report(cfg: SweeperConfig, tracker: tracking.Tracker, parent: str):
    """The report, or None with a warning: what is recorded in MLflow is never lost to a failing
    plot; `python -m sweeper.report` can rebuild it later."""
    try:
        return build(tracker.store, parent, cfg.report)
    except Exception as exc:  # noqa: BLE001 - reported, and the points stay recorded
        console.warn(f"the report could not be built ({type(exc).__name__}: {first_line(exc)}); "
                     f"rebuild it with: python -m sweeper.report {parent}")
        return None
