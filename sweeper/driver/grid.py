"""sweep.strategy=grid, run on Ray: every point not yet recorded measured in worker groups and recorded
as it arrives, in rounds until each is (the rule: sweeper/strategies/grid.py); where each point writes
its profile traces and training state; the console's progress.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List

from sweeper.cluster import recovery, runs, storage
from sweeper.cluster.resources import concurrent_trials
from sweeper.cluster.resources import in_trial as resources_in_trial
from sweeper.config import SweeperConfig
from sweeper.driver import console
from sweeper.driver.params import accuracy_note, record_point
from sweeper.driver.skeleton import Session
from sweeper.errors import first_line
from sweeper.plan import GridPoint, worker_groups
from sweeper.schema import PointResult
from sweeper.strategies import grid
from sweeper.strategies.base import Measured, Rows
from sweeper.worker.spec import PointSpec

if TYPE_CHECKING:
    from sweeper.driver.preflight import Prepared


class GridRun(grid.Grid):
    """sweep.strategy=grid: its rules (strategies/grid.py), and its points run on Ray."""

    def measure(self, cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                specs: Dict[GridPoint, PointSpec], done_keys: frozenset, prepared: Prepared) -> Measured:
        return Measured(measure_points(cfg, s, name, points, specs, done_keys))


def measure_points(
    cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
    done_keys: frozenset,
) -> Rows:
    """Every point not yet recorded, measured in worker groups and recorded as it arrives. A resume
    first restores the interrupted Ray Tune experiment; then any point still unrecorded (its worker
    group died before reaching it, its record was half-written, or it failed and is retried) runs in
    a fresh round. Each round records at least the point its group died on, so this ends."""
    groups = worker_groups(points, cfg.sweep.points_per_worker_group)
    if not cfg.sweep.resume:
        s.tracker.log_sweep_params(grid.run_params(points, groups))
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
            record_point(cfg, s, specs[point], point, result)
            rows.append((point, result))
            recorded.add(point.key)
            if result.state.continued_from and cfg.cluster.checkpoint_every_steps:
                console.print_continued(point.key, result.state.start_samples, result.state.continued_from)
            waiting = s.tracker.pending
            pending = f" ({waiting} write(s) pending: the tracking store is unreachable)" if waiting else ""
            bar.update(task, advance=1, description=f"{point.key}: {result.status}{pending}")

        attempt, stamp = 0, time.strftime("%H%M%S")
        remaining = grid.unrecorded(points, recorded)
        while remaining:
            label = grid.round_label(name, attempt, stamp, cfg.sweep.resume)
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
            remaining = grid.unrecorded(points, recorded)
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
