"""The sweep, start to finish: check everything, connect, record the parent run, run the grid, report.

Takes typed config only; Hydra stays in `__main__`.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from sweeper import data as data_mod
from sweeper import models, plan, tracking
from sweeper.cluster import runner as ray_runner
from sweeper.config import (
    SweeperConfig,
    budget_bytes,
    is_auto,
    tracking_uri,
    validate,
)
from sweeper.driver import console
from sweeper.errors import ConfigError, first_line
from sweeper.measure import estimate, flops, frontier
from sweeper.plan import GridPoint
from sweeper.report import build as report_mod
from sweeper.worker.step import FrontierSpec, TrialSpec

NEEDS_BUDGET = (
    "sweep.micro_batch_sizes=auto on CPU needs device.memory_budget_gb: the memory to plan for, "
    "e.g. device.memory_budget_gb=16 for a 16 GB card"
)
SYNTHETIC_NOTE = "not measured: synthetic data has random labels, so accuracy would mean nothing"


@dataclass
class Prepared:
    """What the checks before any trial found out: the grid (empty until the frontier search when
    sweep.micro_batch_sizes=auto) and the facts of the data and model it is built from."""

    points: List[GridPoint]
    num_train: int
    num_classes: int
    flop_count: Optional[flops.FlopCount]


def preflight(cfg: SweeperConfig) -> Tuple[Prepared, Dict[GridPoint, TrialSpec]]:
    """Every check that needs no cluster, all problems collected into one ConfigError."""
    problems = validate(cfg) + models.check(cfg.model) + data_mod.check(cfg.data)
    problems += tracking.check(tracking_uri(cfg.tracking))
    auto = is_auto(cfg.sweep.micro_batch_sizes)
    if auto and cfg.device.memory_budget_gb is None and cfg.cluster.use_gpu == "auto" and cfg.cluster.address is None:
        import torch

        if not torch.cuda.is_available():  # a local Ray on a machine without a GPU: CPU workers
            problems.append(NEEDS_BUDGET)
    points: List[GridPoint] = []
    if not auto and not problems:
        points = plan.expand_grid(
            cfg.sweep.micro_batch_sizes,
            cfg.sweep.accumulation_steps,
            cfg.sweep.num_workers,
            cfg.sweep.global_batch_sizes,
        )
        if not points:
            unfiltered = plan.expand_grid(
                cfg.sweep.micro_batch_sizes, cfg.sweep.accumulation_steps, cfg.sweep.num_workers
            )
            available = sorted({p.global_batch_size for p in unfiltered})
            problems.append(
                f"sweep.global_batch_sizes={list(cfg.sweep.global_batch_sizes or [])} keeps no grid point "
                f"(micro x accumulation x workers gives {available}): choose from those or set it to null"
            )
    if problems:
        raise ConfigError(problems)

    splits = data_mod.load(cfg.data, cfg.model.input_shape)
    flop_count = count_flops(cfg, splits.num_classes) if cfg.measure.flops else None
    prepared = Prepared(points, len(splits.train), splits.num_classes, flop_count)
    return prepared, (build_specs(cfg, prepared, points) if points else {})


def build_specs(cfg: SweeperConfig, prepared: Prepared, points: List[GridPoint]) -> Dict[GridPoint, TrialSpec]:
    """A TrialSpec per point, or a ConfigError naming every point too large for the data to time."""
    problems: List[str] = []
    estimates = estimate_memory(cfg, points, prepared.num_classes)
    specs: Dict[GridPoint, TrialSpec] = {}
    for point in points:
        steps = plan.optimizer_steps(prepared.num_train, cfg.train.epochs, point.global_batch_size)
        spec = TrialSpec(
            model=cfg.model,
            data=cfg.data,
            train=cfg.train,
            measure=cfg.measure,
            point=point,
            lr=plan.scaled_lr(cfg.train.lr, point.global_batch_size, cfg.train.base_batch_size, cfg.train.lr_scaling),
            steps=steps,
            profile=cfg.profile,
            flop_count=prepared.flop_count,
            memory_budget_bytes=budget_bytes(cfg.device),
            memory_estimate_bytes=estimates.get(point),
        )
        # Enough timed windows for the stability rule to be met at all.
        need = spec.first_timed_step + cfg.measure.stable_windows
        if steps < need:
            untimed = "measure.warmup_steps" + (" + measure.profile_steps + 1" if cfg.profile else "")
            problems.append(
                f"train.epochs={cfg.train.epochs}: {point.key} (global batch {point.global_batch_size}) "
                f"gets {steps} optimizer steps from {prepared.num_train} training samples, fewer than "
                f"{untimed} + measure.stable_windows = {need}; raise train.epochs or lower those"
            )
        specs[point] = spec
    if problems:
        raise ConfigError(problems)
    return specs


def estimate_memory(cfg: SweeperConfig, points: List[GridPoint], num_classes: int) -> Dict[GridPoint, int]:
    """Each point's fake-tensor estimate of its tracked peak, checked against the measured one in its
    trial (memory_estimate_error); nothing when the trials do not track memory or the model cannot
    be traced on fake tensors."""
    if not cfg.measure.memory_breakdown:
        return {}
    try:
        return estimate.point_estimates(cfg, points, num_classes)
    except Exception as exc:  # noqa: BLE001 - an estimate is extra; the trials measure regardless
        console.warn(f"memory not estimated for model {cfg.model.name!r}: {first_line(exc)}")
        return {}


def count_flops(cfg: SweeperConfig, num_classes: int) -> Optional[flops.FlopCount]:
    """FLOPs per sample, counted once for the sweep on a model traced with fake tensors (nothing is
    computed or allocated); a model that cannot be counted is measured without FLOPs and MFU."""
    try:
        return flops.count_flops(lambda: models.build(cfg.model, num_classes), cfg.model.input_shape, num_classes)
    except Exception as exc:  # the trials themselves will say whether the model works
        console.warn(f"FLOPs not counted for model {cfg.model.name!r}: {first_line(exc)}")
        return None


def trial_params(cfg: SweeperConfig, spec: TrialSpec) -> Dict[str, Any]:
    point = spec.point
    return {
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "micro_batch_size": point.micro_batch_size,
        "accumulation_steps": point.accumulation_steps,
        "num_workers": point.num_workers,
        "global_batch_size": point.global_batch_size,
        "lr": spec.lr,
        "lr_scaling": cfg.train.lr_scaling,
        "epochs": cfg.train.epochs,
        "seed": cfg.train.seed,
        "bn_recalibration_samples": cfg.train.bn_recalibration_samples,
    }


def overhead(rows: List[Tuple[GridPoint, Dict[str, Any]]], phases: Dict[str, float]) -> Dict[str, float]:
    """The harness's cost on the parent run: where the sweep's wall time went (`phases`: setup,
    ray_start, tracking, frontier, grid, report seconds) against its trials' own time, each point's model build,
    training and evaluation (`trial_seconds`), and its optimizer steps alone (`train_seconds`)."""
    wall = sum(phases.values())
    out = {"sweep_wall_seconds": wall, **{f"sweep_{name}_seconds": s for name, s in phases.items()}}
    for name in ("trial", "train"):
        total = sum(r.get(f"{name}_seconds", 0.0) for _, r in rows)
        out[f"sum_{name}_seconds"] = total
        if total > 0:
            out[f"sweep_wall_over_{name}_seconds"] = wall / total
    return out


def make_report(cfg: SweeperConfig, tracker, parent: str):
    """The report, or None with a warning: what is recorded in MLflow is never lost to a failing
    plot; `python -m sweeper.report` can rebuild it later."""
    try:
        return report_mod.build(tracker, parent, cfg.report)
    except Exception as exc:  # noqa: BLE001 - reported, and the trials stay recorded
        console.warn(f"the report could not be built ({type(exc).__name__}: {first_line(exc)}); "
                     f"rebuild it with: python -m sweeper.report {parent}")
        return None


def search_frontiers(
    cfg: SweeperConfig,
    prepared: Prepared,
    resources: ray_runner.Resources,
    cluster: ray_runner.Cluster,
    tracker: tracking.Tracker,
    name: str,
) -> Dict[int, Tuple[int, Optional[int]]]:
    """sweep.micro_batch_sizes=auto: each worker count's largest micro-batch under the budget, without
    and (when the grid accumulates) with gradient accumulation; every probe recorded under the
    sweep's run, each frontier on it beside the fake-tensor prediction."""
    budget = budget_bytes(cfg.device)  # None on GPU: the device's whole memory, read by the worker
    workers = sorted(set(cfg.sweep.num_workers))
    measure = cfg.measure
    fspecs = []
    for w in workers:
        template = TrialSpec(
            model=cfg.model, data=cfg.data, train=cfg.train, measure=measure, point=GridPoint(1, 1, w),
            lr=cfg.train.lr, steps=measure.warmup_steps,
        )
        # A frontier the trials could not time is no use: cap it where a point still gets its
        # warm-up and stability windows from the data (one micro-batch per worker per step).
        upper = prepared.num_train * cfg.train.epochs // (w * (measure.warmup_steps + measure.stable_windows))
        fspecs.append(FrontierSpec(
            template, budget, asdict(cfg.frontier), max(1, upper),
            accumulation_steps=list(cfg.sweep.accumulation_steps),
            global_batch_sizes=list(cfg.sweep.global_batch_sizes) if cfg.sweep.global_batch_sizes else None,
        ))
    probes: Dict[int, List[Dict[str, Any]]] = {w: [] for w in workers}
    found: Dict[int, Dict[str, Any]] = {}

    def on_probe(w: int, result: Dict[str, Any]) -> None:
        params = {
            "model": cfg.model.name,
            "dataset": cfg.data.name,
            "micro_batch_size": result["micro_batch_size"],
            "accumulation_steps": result["accumulation_steps"],
            "num_workers": w,
            "probe_role": result.get("probe_role"),
        }
        tracker.log_probe(params, result)
        probes[w].append(result)
        console.print_probe(w, result)

    def on_frontier(w: int, result: Dict[str, Any]) -> None:
        found[w] = result

    console.print_frontier_start(workers, cfg.device.memory_budget_gb)
    ray_runner.run_frontiers(f"{name}-frontier", fspecs, resources, cluster, on_probe, on_frontier)
    out: Dict[int, Tuple[int, Optional[int]]] = {}
    for w in workers:
        result = found.get(w, {"status": "failed", "error": "the frontier search reported nothing"})
        if result.get("status") == "ok":
            try:  # what a laptop would have predicted, to set beside what the device measured
                budget_w = int(result["memory_budget_bytes"])
                for prefix, accumulation in (("frontier_", 1), ("frontier_accumulating_", 2)):
                    if f"{prefix}micro_batch_size" in result:
                        predicted = estimate.predicted_frontier(cfg, prepared.num_classes, w, budget_w, accumulation)
                        result[f"{prefix}estimated_micro_batch_size"] = predicted.micro_batch_size
            except Exception as exc:  # noqa: BLE001 - the estimate is extra
                console.warn(f"frontier not estimated on fake tensors: {first_line(exc)}")
        folder = report_mod.frontier_files(report_mod.default_folder(tracker.uri, name), w, probes[w], result)
        tracker.log_frontier(w, result, folder)
        console.print_frontier(w, result)
        if result.get("status") == "ok":  # a failed search leaves its worker count unmeasured
            accumulating = result.get("frontier_accumulating_micro_batch_size")
            out[w] = (int(result["frontier_micro_batch_size"]), None if accumulating is None else int(accumulating))
    return out


def sweep_params(cfg: SweeperConfig, auto: bool, resources: ray_runner.Resources) -> Dict[str, Any]:
    """The parent run's params: what was asked for and how it was run."""
    return {
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "micro_batch_sizes": cfg.sweep.micro_batch_sizes if auto else list(cfg.sweep.micro_batch_sizes),
        "accumulation_steps": list(cfg.sweep.accumulation_steps),
        "num_workers": list(cfg.sweep.num_workers),
        "global_batch_sizes": cfg.sweep.global_batch_sizes,
        "points_per_worker_group": cfg.sweep.points_per_worker_group,
        "profile": cfg.profile,
        "lr_scaling": cfg.train.lr_scaling,
        "base_batch_size": cfg.train.base_batch_size,
        "use_gpu": resources.use_gpu,
        "cpus_per_worker": resources.cpus_per_worker,
        "device_memory_budget_gb": cfg.device.memory_budget_gb,
        # The question the report answers, so `python -m sweeper.report` rebuilds the same answer.
        **report_mod.settings_params(cfg.report),
    }


# A resumed sweep must be the same sweep: these parent params must match the config.
RESUME_KEYS = ("model", "dataset", "micro_batch_sizes", "accumulation_steps", "num_workers", "global_batch_sizes")


def find_interrupted(cfg: SweeperConfig, cluster: ray_runner.Cluster, tracker: tracking.Tracker) -> Tuple[str, str]:
    """The latest sweep of this model and dataset with a Ray Tune experiment to restore and a parent
    run in MLflow, checked to be the same grid; (experiment name, parent run id)."""
    prefix = f"sweep-{cfg.model.name}-{cfg.data.name}-"
    folder = cluster.results_dir
    names = sorted(
        (n for n in os.listdir(folder) if n.startswith(prefix) and n[len(prefix):].replace("-", "").isdigit()),
        reverse=True,
    )
    for name in names:
        if not ray_runner.can_resume(cluster, name):
            continue
        parent = tracker.find_sweep(name)
        if parent is None:
            continue
        params = tracker.resume_sweep(parent)
        wanted = sweep_params(cfg, False, ray_runner.Resources(False, 0, 0, 1))
        changed = [k for k in RESUME_KEYS if params.get(k) != str(wanted[k])]
        if changed:
            raise ConfigError([
                f"sweep.resume=true: the latest sweep {name} had other {', '.join(changed)} "
                f"({', '.join(f'{k}={params.get(k)}' for k in changed)}): resume it with the same config, "
                "or drop sweep.resume to start a new sweep"
            ])
        return name, parent
    raise ConfigError([
        f"sweep.resume=true: no interrupted sweep of {cfg.model.name} on {cfg.data.name} under {folder} "
        f"with its run in {tracker.uri}; drop sweep.resume to start one"
    ])


def run(cfg: SweeperConfig, resolved_yaml: str) -> int:
    """Run the sweep; the exit status is 0 when every trial ended ok or oom, 1 if any failed."""
    clock = time.perf_counter()
    phases: Dict[str, float] = {}

    def phase(name: str) -> None:
        # Seconds since the last phase ended: the phases add up to the sweep's wall time.
        nonlocal clock
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - clock
        clock = now

    prepared, specs = preflight(cfg)
    auto = not prepared.points
    uri = tracking_uri(cfg.tracking)
    phase("setup")
    cluster = ray_runner.connect(cfg.cluster)
    phase("ray_start")
    try:
        tracker = tracking.Tracker(uri, cfg.tracking.experiment_name)
        sizing = prepared.points or [GridPoint(1, 1, w) for w in cfg.sweep.num_workers]
        resources = ray_runner.plan_resources(cfg.cluster, cluster, sizing)
        if auto and cfg.device.memory_budget_gb is None and not resources.use_gpu:
            raise ConfigError([NEEDS_BUDGET])  # a cluster without GPUs
        done_keys: frozenset = frozenset()
        if cfg.sweep.resume:
            name, parent = find_interrupted(cfg, cluster, tracker)
            done_keys = frozenset(tracker.recorded_keys())
            console.print_resume(name, len(done_keys))
        else:
            name = f"sweep-{cfg.model.name}-{cfg.data.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            parent = tracker.start_sweep(name, sweep_params(cfg, auto, resources), resolved_yaml)
        phase("tracking")
        console.print_where(uri, cluster.dashboard_url, cluster.token_path, cluster.results_dir)
        points, frontier_failed = prepared.points, False
        if auto:
            frontiers = search_frontiers(cfg, prepared, resources, cluster, tracker, name)
            phase("frontier")
            frontier_failed = len(frontiers) < len(set(cfg.sweep.num_workers))
            points, skipped = frontier.grid_from_frontiers(
                frontiers, cfg.sweep.accumulation_steps, cfg.sweep.global_batch_sizes
            )
            for line in skipped:
                console.warn(f"not measured: {line}")
            if not points:
                console.warn("the frontier search left no grid point to measure")
                phase("grid")
                tracker.end_sweep(overhead([], phases), failed=True)
                return 1
            specs = build_specs(cfg, prepared, points)
        groups = plan.worker_groups(points, cfg.sweep.points_per_worker_group)
        if not cfg.sweep.resume:
            tracker.log_sweep_params({"num_trials": len(points), "num_worker_groups": len(groups)})
        if cfg.profile:
            traces = os.path.join(cluster.results_dir, name, "profile")
            specs = {p: replace(s, profile_dir=traces) for p, s in specs.items()}
        console.print_start(len(points), len(groups))
        accuracy_note = SYNTHETIC_NOTE if cfg.data.name == "synthetic" and not cfg.data._target_ else None
        rows: List[Tuple[GridPoint, Dict[str, Any]]] = []
        with console.progress() as bar:
            task = bar.add_task("", total=len(points), completed=len(done_keys))

            def started(group: List[GridPoint]) -> None:
                keys = ", ".join(p.key for p in group)
                bar.update(task, description=f"worker group of {len(group)}: {keys}")

            def done(point: GridPoint, result: Dict[str, Any]) -> None:
                if accuracy_note:
                    result["accuracy_note"] = accuracy_note
                tracker.log_trial(point, trial_params(cfg, specs[point]), result)
                rows.append((point, result))
                bar.update(task, advance=1, description=f"{point.key}: {result.get('status')}")

            # Points whose worker group died before reaching them come back and run in a fresh
            # group; each round records at least the point its group died on, so this ends.
            attempt, remaining, stamp = 0, points, time.strftime("%H%M%S")
            while remaining:
                label = name if attempt == 0 else f"{name}-rerun{attempt}"
                if cfg.sweep.resume and attempt > 0:
                    label += f"-{stamp}"  # not the interrupted run's own reruns
                round_groups = plan.worker_groups(remaining, cfg.sweep.points_per_worker_group)
                concurrency = cfg.sweep.max_concurrent_trials or ray_runner.concurrent_trials(
                    cluster, resources, max(p.num_workers for p in remaining)
                )
                remaining = ray_runner.run_sweep(
                    label, round_groups, specs, resources, cluster, concurrency, started, done,
                    done_keys=done_keys, resume=cfg.sweep.resume and attempt == 0,
                )
                attempt += 1
        phase("grid")
        made = make_report(cfg, tracker, parent)
        phase("report")
        # Counted from MLflow: a resumed sweep's totals include what was recorded before it stopped.
        statuses = Counter(child["status"] for child in tracker.load_sweep(parent).children)
        failed = statuses["failed"]
        tracker.end_sweep(
            {
                **{f"num_trials_{status}": statuses[status] for status in ("ok", "oom", "failed")},
                **overhead(rows, phases),
            },
            failed=failed > 0 or frontier_failed,
        )
        console.print_summary(rows, uri, parent, cfg.tracking.experiment_name, accuracy_note)
        if made is not None:
            console.print_report(made.html_path, made.text, made.yaml_path)
        return 1 if failed or frontier_failed else 0
    finally:
        ray_runner.shutdown()
