"""The sweep, start to finish: check everything, connect, record the parent run, run the grid, report.

Takes typed config only; Hydra stays in `__main__`.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from sweeper import console, plan, ray_runner, tracking
from sweeper import report as report_mod
from sweeper import data as data_mod
from sweeper import flops, models
from sweeper.config import ConfigError, SweeperConfig, first_line, tracking_uri, validate
from sweeper.plan import GridPoint
from sweeper.training import TrialSpec

SYNTHETIC_NOTE = "not measured: synthetic data has random labels, so accuracy would mean nothing"


def preflight(cfg: SweeperConfig) -> Tuple[List[GridPoint], Dict[GridPoint, TrialSpec]]:
    """Every check that needs no cluster, all problems collected into one ConfigError."""
    problems = validate(cfg) + models.check(cfg.model) + data_mod.check(cfg.data)
    problems += tracking.check(tracking_uri(cfg.tracking))
    points = plan.expand_grid(
        cfg.sweep.micro_batch_sizes,
        cfg.sweep.accumulation_steps,
        cfg.sweep.num_workers,
        cfg.sweep.global_batch_sizes,
    )
    if not points and not problems:
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
    num_train = len(splits.train)
    flop_count = count_flops(cfg, splits.num_classes) if cfg.measure.flops else None
    specs: Dict[GridPoint, TrialSpec] = {}
    for point in points:
        steps = plan.optimizer_steps(num_train, cfg.train.epochs, point.global_batch_size)
        spec = TrialSpec(
            model=cfg.model,
            data=cfg.data,
            train=cfg.train,
            measure=cfg.measure,
            point=point,
            lr=plan.scaled_lr(cfg.train.lr, point.global_batch_size, cfg.train.base_batch_size, cfg.train.lr_scaling),
            steps=steps,
            profile=cfg.profile,
            flop_count=flop_count,
        )
        # Enough timed windows for the stability rule to be met at all.
        need = spec.first_timed_step + cfg.measure.stable_windows
        if steps < need:
            untimed = "measure.warmup_steps" + (" + measure.profile_steps + 1" if cfg.profile else "")
            problems.append(
                f"train.epochs={cfg.train.epochs}: {point.key} (global batch {point.global_batch_size}) "
                f"gets {steps} optimizer steps from {num_train} training samples, fewer than "
                f"{untimed} + measure.stable_windows = {need}; raise train.epochs or lower those"
            )
        specs[point] = spec
    if problems:
        raise ConfigError(problems)
    return points, specs


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
    }


def overhead(rows: List[Tuple[GridPoint, Dict[str, Any]]], wall_seconds: float) -> Dict[str, float]:
    """The harness's cost on the parent run: the sweep's wall time against its trials' own time
    (each point's model build, training and evaluation, measured in its worker)."""
    trial_seconds = sum(r.get("trial_seconds", 0.0) for _, r in rows)
    out = {"sweep_wall_seconds": wall_seconds, "sum_trial_seconds": trial_seconds}
    if trial_seconds > 0:
        out["sweep_wall_over_trial_seconds"] = wall_seconds / trial_seconds
    return out


def make_report(cfg: SweeperConfig, tracker, parent: str, uri: str, name: str):
    """The report, or None with a warning: what is recorded in MLflow is never lost to a failing
    plot; `python -m sweeper.report` can rebuild it later."""
    try:
        return report_mod.build(tracker, parent, cfg.report, report_mod.default_folder(uri, name))
    except Exception as exc:  # noqa: BLE001 - reported, and the trials stay recorded
        console.warn(f"the report could not be built ({type(exc).__name__}: {first_line(exc)}); "
                     f"rebuild it with: python -m sweeper.report {parent}")
        return None


def run(cfg: SweeperConfig, resolved_yaml: str) -> int:
    """Run the sweep; the exit status is 0 when every trial ended ok or oom, 1 if any failed."""
    sweep_start = time.perf_counter()
    points, specs = preflight(cfg)
    uri = tracking_uri(cfg.tracking)
    cluster = ray_runner.connect(cfg.cluster)
    try:
        tracker = tracking.Tracker(uri, cfg.tracking.experiment_name)
        resources = ray_runner.plan_resources(cfg.cluster, cluster, points)
        groups = plan.worker_groups(points, cfg.sweep.points_per_worker_group)
        name = f"sweep-{cfg.model.name}-{cfg.data.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if cfg.profile:
            traces = os.path.join(cluster.results_dir, name, "profile")
            specs = {p: replace(s, profile_dir=traces) for p, s in specs.items()}
        console.print_start(
            len(points), len(groups), uri, cluster.dashboard_url, cluster.token_path, cluster.results_dir
        )
        parent = tracker.start_sweep(
            name,
            {
                "model": cfg.model.name,
                "dataset": cfg.data.name,
                "micro_batch_sizes": list(cfg.sweep.micro_batch_sizes),
                "accumulation_steps": list(cfg.sweep.accumulation_steps),
                "num_workers": list(cfg.sweep.num_workers),
                "global_batch_sizes": cfg.sweep.global_batch_sizes,
                "num_trials": len(points),
                "num_worker_groups": len(groups),
                "points_per_worker_group": cfg.sweep.points_per_worker_group,
                "profile": cfg.profile,
                "lr_scaling": cfg.train.lr_scaling,
                "base_batch_size": cfg.train.base_batch_size,
                "use_gpu": resources.use_gpu,
                "cpus_per_worker": resources.cpus_per_worker,
            },
            resolved_yaml,
        )
        accuracy_note = SYNTHETIC_NOTE if cfg.data.name == "synthetic" and not cfg.data._target_ else None
        rows: List[Tuple[GridPoint, Dict[str, Any]]] = []
        with console.progress() as bar:
            task = bar.add_task("", total=len(points))

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
            attempt, remaining = 0, points
            while remaining:
                label = name if attempt == 0 else f"{name}-rerun{attempt}"
                round_groups = plan.worker_groups(remaining, cfg.sweep.points_per_worker_group)
                remaining = ray_runner.run_sweep(
                    label, round_groups, specs, resources, cluster, cfg.sweep.max_concurrent_trials, started, done
                )
                attempt += 1
        wall = time.perf_counter() - sweep_start
        made = make_report(cfg, tracker, parent, uri, name)
        statuses = Counter(result.get("status") for _, result in rows)
        failed = statuses["failed"]
        tracker.end_sweep(
            {
                **{f"num_trials_{status}": statuses[status] for status in ("ok", "oom", "failed")},
                **overhead(rows, wall),
            },
            failed=failed > 0,
        )
        console.print_summary(rows, uri, parent, cfg.tracking.experiment_name, accuracy_note)
        if made is not None:
            console.print_report(made.html_path, made.text)
        return 1 if failed else 0
    finally:
        ray_runner.shutdown()
