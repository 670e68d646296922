"""The train sweep, start to finish: check everything, connect, record the parent run, find the
frontier (sweep.micro_batch_sizes=auto), measure the grid in worker groups, report.

Takes typed config only; Hydra stays in `__main__`.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict, replace
from typing import Any, Dict, List, Optional, Tuple

from sweeper import plan, tracking
from sweeper.cluster import recovery, runs, storage
from sweeper.cluster.resources import Resources, concurrent_trials
from sweeper.cluster.resources import in_trial as resources_in_trial
from sweeper.config import SweeperConfig, tracking_uri
from sweeper.driver import console, predicted, resume
from sweeper.driver.frontier import search_frontiers
from sweeper.driver.preflight import NEEDS_BUDGET, Prepared, build_specs, preflight
from sweeper.driver.skeleton import Phases, Session, session
from sweeper.errors import EXIT_OK, EXIT_POINT_FAILED, ConfigError, first_line
from sweeper.measure import frontier
from sweeper.plan import GridPoint, worker_groups
from sweeper.report import build as report_build
from sweeper.schema import PointResult, SweepSummary
from sweeper.strategies import branch_driver, smart_driver
from sweeper.worker.spec import PointSpec
from sweeper.workloads import datasets, models

SYNTHETIC_NOTE = "not measured: synthetic data has random labels, so accuracy would mean nothing"
Rows = List[Tuple[GridPoint, PointResult]]


def run(cfg: SweeperConfig, resolved_yaml: str) -> int:
    """Run the sweep; the exit status is 0 when every point ended ok or oom, 1 if any failed."""
    phases = Phases()
    cfg = branch_driver.with_lr_rule(cfg)
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
        if not cfg.sweep.resume and cfg.sweep.strategy != "smart":  # smart records it with its classes
            # The report's accuracy classes: which layouts train the same model (report/classes.py).
            s.tracker.log_sweep_params({"batch_coupled_layers": ", ".join(prepared.batch_coupled) or "none"})
        if prepared.beyond_data_parallelism:  # said now and in the answer (report/build.py reads the param)
            console.warn(prepared.beyond_data_parallelism)
            if not cfg.sweep.resume:
                s.tracker.log_sweep_params({"data_parallel_limit": prepared.beyond_data_parallelism})
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
        points, skipped = predicted.skip(cfg, points, prepared.over_budget, done_keys, lambda p, r: s.tracker.log_point(
            p, point_params(cfg, specs[p], r), r, replace_failed=cfg.sweep.retry_failed),
            {p: specs[p].memory_predicted_bytes for p in points})
        answer = None
        if cfg.sweep.strategy == "smart":
            rows, ledger = measure_smart(cfg, s, name, points, specs, done_keys, prepared)
        elif cfg.sweep.strategy == "branch":
            rows, ledger, answer = measure_branch(cfg, s, name, points, specs, done_keys)
        else:
            rows, ledger = measure_grid(cfg, s, name, points, specs, done_keys), None
        rows = skipped + rows
        phases("grid")
        spent = ledger.metrics() if ledger is not None else None
        if spent is not None:  # on the parent before the report, which says what the strategy spent
            s.tracker.log_parent_metrics(spent)
        s.tracker.replay()  # writes the store refused while it was down, before the report reads it
        made = make_report(cfg, s.tracker, parent)
        phases("report")
        statuses = recorded_statuses(s, parent, rows)
        failed = statuses["failed"] > 0 or frontier_failed
        # smart: a composed point has no run of its own; the point-time is its measurement runs'
        closing = summary(rows if ledger is None else ledger.measured, phases, statuses)
        if spent is not None:
            console.print_ledger(spent)
        if answer is not None:
            console.print_branch_answer(answer)
        s.end(closing, "FAILED" if failed else "FINISHED")
        console.print_summary(rows, s.uri, parent, cfg.tracking.experiment_name, accuracy_note(cfg))
        if made is not None:
            console.print_report(made.html_path, made.text, made.yaml_path)
        # Writes still pending: the record is not complete, whatever the points did.
        return EXIT_POINT_FAILED if failed or s.tracker.pending else EXIT_OK


def recorded_statuses(s: Session, parent: str, rows: Rows) -> Counter:
    """How the sweep's points ended, counted from MLflow, so a resumed sweep's totals include what was
    recorded before it stopped; this run's own points when the store cannot be read now."""
    try:
        return Counter(child["status"] for child in s.tracker.load_sweep(parent).children)
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
        done = set(s.tracker.recorded_keys()) - (set(s.tracker.failed_keys()) if cfg.sweep.retry_failed else set())
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


def measure_grid(
    cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
    done_keys: frozenset,
) -> Rows:
    """Every point not yet recorded, measured in worker groups and recorded as it arrives. A resume
    first restores the interrupted Ray Tune experiment; then any point still unrecorded (its worker
    group died before reaching it, its record was half-written, or it failed and is retried) runs in
    a fresh round. Each round records at least the point its group died on, so this ends."""
    groups = worker_groups(points, cfg.sweep.points_per_worker_group)
    if not cfg.sweep.resume:
        s.tracker.log_sweep_params({"num_trials": len(points), "num_worker_groups": len(groups)})
    specs = _with_outputs(cfg, s, name, specs)
    _print_start(points, groups)
    rows: Rows = []
    recorded = set(done_keys)
    with console.progress() as bar:
        task = bar.add_task("", total=len(points), completed=len(done_keys))

        def started(group: List[GridPoint]) -> None:
            bar.update(task, description=f"worker group of {len(group)}: {', '.join(p.key for p in group)}")

        def done(point: GridPoint, result: PointResult) -> None:
            result.accuracy.accuracy_note = accuracy_note(cfg)
            s.tracker.log_point(point, point_params(cfg, specs[point], result), result,
                                replace_failed=cfg.sweep.retry_failed)
            rows.append((point, result))
            recorded.add(point.key)
            if result.state.continued_from and cfg.cluster.checkpoint_every_steps:
                console.print_continued(point.key, result.state.start_samples, result.state.continued_from)
            waiting = s.tracker.pending
            pending = f" ({waiting} write(s) pending: the tracking store is unreachable)" if waiting else ""
            bar.update(task, advance=1, description=f"{point.key}: {result.status}{pending}")

        attempt, stamp = 0, time.strftime("%H%M%S")
        remaining = [p for p in points if p.key not in recorded]
        while remaining:
            label = name if attempt == 0 else f"{name}-rerun{attempt}" + (f"-{stamp}" if cfg.sweep.resume else "")
            concurrency = cfg.sweep.max_concurrent_trials or concurrent_trials(
                s.cluster, s.resources, max(p.num_workers for p in remaining)
            )
            restore = cfg.sweep.resume and attempt == 0
            try:
                runs.run_points(
                    label, worker_groups(remaining, cfg.sweep.points_per_worker_group), specs, s.resources,
                    s.cluster, concurrency, started, done, done_keys=frozenset(recorded), resume=restore,
                    note=console.note,
                )
            except Exception as exc:  # noqa: BLE001 - only the restore may fail so; MLflow knows what is left
                if not restore:
                    raise
                console.warn(f"Ray Tune could not restore {name} ({type(exc).__name__}: {first_line(exc)}); "
                             "the points not yet recorded are measured in a fresh round")
            remaining = [p for p in points if p.key not in recorded]
            attempt += 1
    return rows


def _with_outputs(
    cfg: SweeperConfig, s: Session, name: str, specs: Dict[GridPoint, PointSpec],
) -> Dict[GridPoint, PointSpec]:
    """The specs with where each point writes: its profile traces, its training state at the end, and
    its saves on the way (a point whose group is lost goes on from its last)."""
    if cfg.profile:
        traces = os.path.join(s.cluster.results_dir, name, "profile")
        specs = {p: replace(spec, profile_dir=traces) for p, spec in specs.items()}
    root = storage.root(cfg.cluster.storage_path, s.cluster.results_dir, name)
    if cfg.train.save_state:  # every point's training state at its end, where every node reads
        folder = storage.join(root, "checkpoints")
        specs = {p: replace(spec, save_state_to=storage.join(folder, p.key)) for p, spec in specs.items()}
    if cfg.cluster.checkpoint_every_steps:
        specs = {p: recovery.with_saves(spec, root, cfg.cluster.checkpoint_every_steps) for p, spec in specs.items()}
    return specs


def _print_start(points: List[GridPoint], groups: List[List[GridPoint]]) -> None:
    """How many points in how many worker groups, and which groups run in their Ray Tune trial's process."""
    in_trial = sum(resources_in_trial(max(p.num_workers for p in g)) for g in groups)
    if in_trial == len(groups):
        console.print_start(len(points), len(groups), "worker group(s) of one worker, each in its Ray Tune trial")
    elif in_trial:
        console.print_start(len(points), len(groups), f"worker group(s) ({in_trial} of one worker in its Ray Tune "
                                                      "trial, the others Ray Train's)")
    else:
        console.print_start(len(points), len(groups))


def measure_smart(
    cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
    done_keys: frozenset, prepared: Prepared,
) -> Tuple[Rows, smart_driver.Ledger]:
    """sweep.strategy=smart (driver/smart.py): the same points recorded, from fewer measurements."""
    coupled = prepared.batch_coupled
    if not cfg.sweep.resume:
        s.tracker.log_sweep_params({"num_trials": len(points), "strategy": "smart",
                                    "batch_coupled_layers": ", ".join(coupled) or "none"})
    console.note(f"{len(points)} points, composed from measurement runs (sweep.strategy=smart)")
    rows: Rows = []

    def record(point: GridPoint, result: PointResult) -> None:
        result.accuracy.accuracy_note = accuracy_note(cfg)
        s.tracker.log_point(point, point_params(cfg, specs[point], result), result,
                            replace_failed=cfg.sweep.retry_failed)
        rows.append((point, result))

    ledger = smart_driver.measure(cfg, s, name, points, specs, done_keys, bool(coupled), prepared.num_classes, record)
    return rows, ledger


def measure_branch(
    cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
    done_keys: frozenset,
) -> Tuple[Rows, branch_driver.Ledger, Any]:
    """sweep.strategy=branch (driver/branch.py): every point's throughput and memory, the critical batch size
    over training from one trunk per seed and its branches, and the schedule it implies."""
    if not cfg.sweep.resume:
        s.tracker.log_sweep_params({"num_trials": len(points), "strategy": "branch",
                                    "branch_lr_scaling": branch_driver.branch_lr_rule(cfg)})
    console.note(f"{len(points)} points, their quality measured by a trunk and its branches (sweep.strategy=branch)")
    rows: Rows = []

    def record(point: GridPoint, result: PointResult) -> None:
        s.tracker.log_point(point, point_params(cfg, specs[point], result), result,
                            replace_failed=cfg.sweep.retry_failed)
        rows.append((point, result))

    ledger, answer = branch_driver.measure(cfg, s, name, points, specs, done_keys, record)
    return rows, ledger, answer


def dataset_record(cfg: SweeperConfig, prepared: Prepared) -> tracking.DatasetRecord:
    """The data every point trains on, for each point's MLflow dataset input."""
    source = datasets.source(cfg.data) + (f", {prepared.data_identity}" if prepared.data_identity else "")
    config = {**asdict(cfg.data), "identity": prepared.data_identity}
    return tracking.DatasetRecord.of(cfg.data.name, source, config, prepared.num_train, prepared.num_val)


def accuracy_note(cfg: SweeperConfig):
    return SYNTHETIC_NOTE if cfg.data.name == "synthetic" and not cfg.data._target_ else None


def point_params(cfg: SweeperConfig, spec: PointSpec, result: Optional[PointResult] = None) -> Dict[str, Any]:
    """The point's MLflow params: what it is, and (`result`) how its worker trained it."""
    point = spec.point
    # How accumulation reduced, as the worker read it back from its model (final | every | none); absent for a
    # point no worker trained (skipped by prediction, failed before its first step).
    done = {"gradient_sync": result.gradient_sync} if result is not None and result.gradient_sync else {}
    return {
        # the point its replicates share (every axis but the seed): group runs by it to compare points
        "point": point.point_key,
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "micro_batch_size": point.micro_batch_size,
        "accumulation_steps": point.accumulation_steps,
        "num_workers": point.num_workers,
        # how the workers hold the model (absent in older records: ddp) and how accumulation reduced
        "parallelism": point.parallelism,
        **done,
        "global_batch_size": point.global_batch_size,
        "lr": spec.lr,
        "lr_scaling": cfg.train.lr_scaling,
        "epochs": cfg.train.epochs if cfg.train.samples is None else None,
        "train_samples": cfg.train.samples if cfg.train.samples is None or point.context is None
        else plan.sample_budget(0, 0, cfg.train.samples, point.context, cfg.model.context),
        # a language model's sequences: tokens per sample and per optimizer step
        **({"context": models.positions(spec.model),
            "tokens_per_step": point.global_batch_size * models.positions(spec.model)}
           if models.is_language_model(cfg.model) else {}),
        "seed": spec.seed,
        "lr_multiplier": point.lr_multiplier,
        "warmup_steps": cfg.train.warmup_steps,
        "batch_schedule": cfg.train.batch_schedule,
        "bn_recalibration_samples": cfg.train.bn_recalibration_samples,
        # the recipe, as trained
        "precision": point.precision,
        "activation_checkpointing": point.checkpointing,
        "optimizer": optimizer_name(cfg),
        "compiled": cfg.train.compile,
        "label_smoothing": cfg.loss.label_smoothing if not cfg.loss._target_ else None,
        "loss": cfg.loss._target_ or cfg.loss.name,
    }


def optimizer_name(cfg: SweeperConfig) -> str:
    return cfg.optim._target_ or cfg.optim.name


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
        "use_gpu": resources.use_gpu,
        "cpus_per_worker": resources.cpus_per_worker,
        "device_memory_budget_gb": cfg.device.memory_budget_gb,
        # The question the report answers, so `python -m sweeper.report` rebuilds the same answer.
        **report_build.settings_params(cfg.report),
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
        return report_build.build(tracker, parent, cfg.report)
    except Exception as exc:  # noqa: BLE001 - reported, and the points stay recorded
        console.warn(f"the report could not be built ({type(exc).__name__}: {first_line(exc)}); "
                     f"rebuild it with: python -m sweeper.report {parent}")
        return None
