"""sweep.strategy=branch, run on Ray: every layout's throughput and memory in a short run (as smart's); per
seed, one trunk at the base global batch over the whole budget, saving its training state at each of
branch.at on the way; from each checkpoint, one branch per larger global batch of the grid, on that global
batch's fastest measured layout, for branch.window samples. Every run is an MLflow child run
(sweeper.role trunk | branch, its provenance in tags); the critical batch size at each checkpoint, the
schedule it implies and the best constant layout go on the parent run, the report and the console. What
it decides (the trunk, the branches, the answer) is sweeper/strategies/branch.py's.

Two rounds after the throughput runs, each one Ray Tune run of worker groups: the trunks, then every branch.
A resumed sweep reads back every run it holds (smart's measure_runs) and runs only what is missing: a
branch from the trunk checkpoint still on disk (checkpoints are deleted when the sweep ends).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from sweeper.cluster import storage
from sweeper.config import SweeperConfig
from sweeper.driver import console
from sweeper.driver.params import record_point
from sweeper.driver.skeleton import Session
from sweeper.driver.smart import measure_layouts, measure_runs
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.strategies import branch, branch_reading, smart
from sweeper.strategies.base import Measured, Rows
from sweeper.strategies.smart import Record
from sweeper.worker.spec import PointSpec

if TYPE_CHECKING:
    from sweeper.driver.preflight import Prepared


class BranchRun(branch.Branch):
    """sweep.strategy=branch: its rules (strategies/branch.py), and its trunks and branches run on Ray."""

    def measure(self, cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                specs: Dict[GridPoint, PointSpec], done_keys: frozenset, prepared: Prepared) -> Measured:
        """Every point's throughput and memory, the critical batch size over training from one trunk per
        seed and its branches, and the schedule it implies."""
        if not cfg.sweep.resume:
            s.tracker.log_sweep_params({"num_trials": len(points), "strategy": "branch",
                                        "branch_lr_scaling": branch.branch_lr_rule(cfg)})
        console.note(f"{len(points)} points, their quality measured by a trunk and its branches "
                     "(sweep.strategy=branch)")
        rows: Rows = []

        def record(point: GridPoint, result: PointResult) -> None:
            record_point(cfg, s, specs[point], point, result)
            rows.append((point, result))

        ledger, answer = measure_points(cfg, s, name, points, specs, done_keys, record)
        return Measured(rows, ledger, answer)


def measure_points(cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                   specs: Dict[GridPoint, PointSpec], done_keys: frozenset, record: Record
                   ) -> Tuple[branch.Ledger, Optional[branch.Answer]]:
    """The branch strategy over `points`: `record(point, result)` once per point not in `done_keys`; the
    ledger and the answer (None when the trunk could not run)."""
    ledger = branch.Ledger()
    keep = smart.once(record, done_keys)
    throughput = measure_layouts(cfg, s, name, points, specs, ledger, keep, "branch")
    ok = {layout: r for layout, r in throughput.items() if r.status == "ok" and r.throughput.samples_per_second}
    fastest = branch.fastest_layouts(ok)
    base = cfg.branch.base_global_batch or min(p.global_batch_size for p in points)
    if base not in fastest:
        console.warn(f"branch: no layout of the trunk's global batch {base} got through its throughput run; "
                     "nothing to branch from")
        branch.record_points(points, specs, throughput, {}, keep)
        return ledger, None
    trunk = branch.trunk_of(cfg, points, specs, fastest, base)
    if trunk.unjudged:
        warn_unjudged(trunk)
    why = trunk.nothing_to_branch()
    if why is not None:
        console.warn(f"branch: nothing to branch to: {why}")
        branch.record_points(points, specs, throughput, {}, keep)
        return ledger, None
    console.note(f"branch: trunk {trunk.layout.key} (global batch {base}) x {len(trunk.seeds)} seed(s), checkpoints "
                 f"at {', '.join(map(str, trunk.marks))} of {trunk.budget} samples; from each, branches to "
                 f"{', '.join(f'{b} ({fastest[b].key})' for b in trunk.larger)} for {trunk.window} samples each")
    trunks, branches = run_rounds(cfg, s, name, specs, trunk, fastest, ledger)
    ledger.branches = len(branches)
    answer = branch.decide(cfg, base, trunk.budget, trunk.window, trunk.marks, trunk.seeds, trunks, branches,
                           fastest, ok, trunk.larger)
    if answer is None:
        console.warn("branch: no trunk trained its whole budget ok; no critical batch size to give")
    elif trunk.unjudged:
        branch.note_unjudged(answer, trunk)
    branch.record_points(points, specs, throughput, {seed: trunks.get(seed) for seed in trunk.seeds}, keep,
                         trunk.layout)
    ledger.full_grid_estimate = smart.full_grid_estimate(points, specs, throughput, {},
                                                         {"": [r for r in trunks.values() if r]})
    if answer is not None:
        log_answer(s, answer, name)
    storage.delete(folder_of(cfg, s, name))
    return ledger, answer


def warn_unjudged(trunk: branch.Trunk) -> None:
    """The larger global batches the window is too short to judge, and the branch.window that would."""
    steps = branch_reading.MIN_TAIL_STEPS
    console.warn(f"branch: global batch(es) {', '.join(map(str, trunk.unjudged))} not branched to: a window of "
                 f"{trunk.window} samples gives them fewer than {steps} steps in its compared second half (a step's "
                 f"loss is measured before its update); branch.window={2 * steps * max(trunk.unjudged)} or more "
                 "would judge them")


def folder_of(cfg: SweeperConfig, s: Session, name: str) -> str:
    """Where the trunks' checkpoints go: under cluster.storage_path, else beside the sweep's Ray results."""
    return storage.join(storage.root(cfg.cluster.storage_path, s.cluster.results_dir, name), "trunk")


def run_rounds(cfg: SweeperConfig, s: Session, name: str, specs: Dict[GridPoint, PointSpec], trunk: branch.Trunk,
               fastest: Dict[int, GridPoint], ledger: branch.Ledger
               ) -> Tuple[Dict[object, Optional[PointResult]], Dict[Tuple[object, int, int], PointResult]]:
    """Two rounds: every seed's trunk over the whole budget, saving its state at each mark on the way; then
    every branch, from each mark a trunk saved, to each larger global batch. Returns each seed's trunk and
    each (seed, checkpoint number from 1, global batch)'s branch."""
    folder = folder_of(cfg, s, name)
    saves = {seed: {mark: storage.join(folder, unit.key, f"s{mark}") for mark in trunk.marks}
             for unit, seed in trunk.units.items()}
    trunk_specs = branch.trunk_specs(specs, trunk, saves)

    def annotate_trunk(unit: GridPoint, result: PointResult) -> None:
        result.provenance.branch_global_batch = trunk.base

    console.note(f"branch: round 1 of 2: {len(trunk_specs)} trunk(s) over the whole budget")
    done = measure_runs(cfg, s, f"{name}-trunk", "trunk", trunk_specs, branch.trunk_key, ledger,
                        {unit: "trunk" for unit in trunk_specs}, annotate=annotate_trunk)
    trunks: Dict[object, Optional[PointResult]] = {seed: done.get(unit) for unit, seed in trunk.units.items()}
    b_specs, what = branch.branch_specs(cfg, specs, trunk, fastest, trunks, saves)

    def annotate(unit: GridPoint, result: PointResult) -> None:
        seed, k, g = what[unit]
        prov = result.provenance
        prov.branch_trunk = branch.trunk_key(replace(trunk.layout, seed=seed))
        prov.branch_checkpoint_samples, prov.branch_global_batch = trunk.marks[k - 1], g
        prov.branch_window_samples = trunk.window

    branches: Dict[Tuple[object, int, int], PointResult] = {}
    if b_specs:
        console.note(f"branch: round 2 of 2: {len(b_specs)} branch(es) of {trunk.window} samples")
        results = measure_runs(cfg, s, f"{name}-branches", "branch", b_specs, branch.branch_key, ledger,
                               {unit: "branch" for unit in b_specs}, annotate=annotate)
        branches = {what[unit]: result for unit, result in results.items()}
    return trunks, branches


def log_answer(s: Session, answer: branch.Answer, name: str) -> None:
    """On the parent run: the critical batch size per checkpoint as curves over samples seen (MLflow's chart
    draws them), where it flattens, the predicted times; the whole answer as branch/answer.json."""
    import json
    import shutil
    import tempfile

    said = [c for c in answer.locals if c.informative]  # a checkpoint that says nothing draws no point
    curves = {"critical_batch_size_branched": [(c.samples, float(c.low)) for c in said],
              "branch_tolerance": [(c.samples, c.tolerance) for c in answer.locals if math.isfinite(c.tolerance)]}
    upper = [(c.samples, float(c.high)) for c in said if c.high is not None]
    if upper:
        curves["critical_batch_size_branched_upper"] = upper
    metrics = {"critical_batch_size_flat": branch_reading.flat(answer.locals, answer.base)}
    if answer.schedule_seconds is not None:
        metrics["schedule_predicted_seconds"] = answer.schedule_seconds
    if answer.constant_seconds is not None:
        metrics["constant_predicted_seconds"] = answer.constant_seconds
    s.tracker.log_parent_metrics(metrics, curves)
    folder = tempfile.mkdtemp(prefix="sweeper-branch-")
    with open(os.path.join(folder, "answer.json"), "w") as f:
        json.dump(answer.to_dict(), f, indent=2)
    pending = s.tracker.pending
    s.tracker.log_artifacts(folder, "branch")
    if s.tracker.pending == pending:  # recorded: nothing left to replay from the folder
        shutil.rmtree(folder, ignore_errors=True)
