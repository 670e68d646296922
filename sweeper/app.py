"""The sweep, start to finish: check everything, connect, record the parent run, run the grid, report.

Takes typed config only; Hydra stays in `__main__`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Dict, List, Tuple

from sweeper import console, plan, ray_runner, tracking
from sweeper import data as data_mod
from sweeper import models
from sweeper.config import ConfigError, SweeperConfig, tracking_uri, validate
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

    num_train = len(data_mod.load(cfg.data, cfg.model.input_shape).train)
    specs: Dict[GridPoint, TrialSpec] = {}
    need = cfg.train.warmup_steps + cfg.train.timing_windows
    for point in points:
        steps = plan.optimizer_steps(num_train, cfg.train.epochs, point.global_batch_size)
        if steps < need:
            problems.append(
                f"train.epochs={cfg.train.epochs}: {point.key} (global batch {point.global_batch_size}) "
                f"gets {steps} optimizer steps from {num_train} training samples, fewer than "
                f"train.warmup_steps + train.timing_windows = {need}; raise train.epochs or lower "
                "train.warmup_steps / train.timing_windows"
            )
        specs[point] = TrialSpec(
            model=cfg.model,
            data=cfg.data,
            train=cfg.train,
            point=point,
            lr=plan.scaled_lr(cfg.train.lr, point.global_batch_size, cfg.train.base_batch_size, cfg.train.lr_scaling),
            steps=steps,
        )
    if problems:
        raise ConfigError(problems)
    return points, specs


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


def run(cfg: SweeperConfig, resolved_yaml: str) -> int:
    """Run the sweep; the exit status is 0 when every trial ended ok or oom, 1 if any failed."""
    points, specs = preflight(cfg)
    uri = tracking_uri(cfg.tracking)
    cluster = ray_runner.connect(cfg.cluster)
    try:
        tracker = tracking.Tracker(uri, cfg.tracking.experiment_name)
        resources = ray_runner.plan_resources(cfg.cluster, cluster, points)
        console.print_start(len(points), uri, cluster.dashboard_url, cluster.token_path, cluster.results_dir)
        name = f"sweep-{cfg.model.name}-{cfg.data.name}-{time.strftime('%Y%m%d-%H%M%S')}"
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
                "use_gpu": resources.use_gpu,
                "cpus_per_worker": resources.cpus_per_worker,
            },
            resolved_yaml,
        )
        accuracy_note = SYNTHETIC_NOTE if cfg.data.name == "synthetic" and not cfg.data._target_ else None
        rows: List[Tuple[GridPoint, Dict[str, Any]]] = []
        with console.progress() as bar:
            task = bar.add_task("", total=len(points))

            def started(point: GridPoint) -> None:
                bar.update(task, description=f"running {point.key}")

            def done(point: GridPoint, result: Dict[str, Any]) -> None:
                if accuracy_note:
                    result["accuracy_note"] = accuracy_note
                tracker.log_trial(point, trial_params(cfg, specs[point]), result)
                rows.append((point, result))
                bar.update(task, advance=1, description=f"{point.key}: {result.get('status')}")

            ray_runner.run_sweep(
                name, points, specs, resources, cluster, cfg.sweep.max_concurrent_trials, started, done
            )
        statuses = Counter(result.get("status") for _, result in rows)
        failed = statuses["failed"]
        tracker.end_sweep(
            {f"num_trials_{status}": statuses[status] for status in ("ok", "oom", "failed")},
            failed=failed > 0,
        )
        console.print_summary(rows, uri, parent, cfg.tracking.experiment_name, accuracy_note)
        return 1 if failed else 0
    finally:
        ray_runner.shutdown()
