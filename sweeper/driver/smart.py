"""sweep.strategy=smart, run on Ray: every layout's throughput and memory in a short run; one
representative per accuracy-equivalence class and seed trained for accuracy in rungs of successive
halving; every point recorded with what was measured for it and where its accuracy came from; the
compute ledger. What it decides (the classes, the rungs, which a rung stops, each point's composed
record) is sweeper/strategies/smart.py's; this runs it, records it and says it on the console.

The rung logic is the sweeper's own, not Ray Tune's ASHAScheduler/HyperBandScheduler: a Tune trial
here is a worker group measuring several points one after another, so a Tune scheduler could only
stop a whole group; and the rule compares classes over their seeds with a confidence interval (never
stopping one the data cannot separate from the best), which a scheduler ranking one trial's metric
against a quantile cannot express. Each rung is one Ray Tune run of worker groups. A class that goes
on continues from its previous rung's training-state checkpoint (sweeper/worker/state.py): the sample
stream goes on where the rung stopped, and the run's loss curve is prefixed with the rungs before it,
so the record reads as one run from step 0. With smart.continue_rungs=false it trains again from step
0 instead (the sampler and the seed make it pass through the shorter run's state, at the cost of
repeating the earlier rungs' steps: docs/strategy.md).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Union

from sweeper.cluster import runs, storage
from sweeper.cluster.resources import concurrent_trials
from sweeper.config import SweeperConfig
from sweeper.driver import console
from sweeper.driver.params import accuracy_note, record_point
from sweeper.driver.skeleton import Session
from sweeper.plan import GridPoint, worker_groups
from sweeper.schema import PointResult
from sweeper.strategies import smart
from sweeper.strategies.base import Measured, Rows
from sweeper.strategies.smart import AccuracyClass, Record
from sweeper.worker.spec import PointSpec

if TYPE_CHECKING:
    from sweeper.driver.preflight import Prepared


class SmartRun(smart.Smart):
    """sweep.strategy=smart: its rules (strategies/smart.py), and its measurement runs on Ray."""

    def measure(self, cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                specs: Dict[GridPoint, PointSpec], done_keys: frozenset, prepared: Prepared) -> Measured:
        """The same points recorded as the grid's, from fewer measurements."""
        coupled = prepared.batch_coupled
        if not cfg.sweep.resume:
            s.tracker.log_sweep_params({"num_trials": len(points), "strategy": "smart",
                                        "batch_coupled_layers": ", ".join(coupled) or "none"})
        console.note(f"{len(points)} points, composed from measurement runs (sweep.strategy=smart)")
        rows: Rows = []

        def record(point: GridPoint, result: PointResult) -> None:
            result.accuracy.accuracy_note = accuracy_note(cfg)
            record_point(cfg, s, specs[point], point, result)
            rows.append((point, result))

        ledger = measure_points(cfg, s, name, points, specs, done_keys, bool(coupled), prepared.num_classes, record)
        return Measured(rows, ledger)


def measure_points(cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                   specs: Dict[GridPoint, PointSpec], done_keys: frozenset, coupled: bool, num_classes: int,
                   record: Record) -> smart.Ledger:
    """The smart strategy over `points`: `record(point, result)` once per point not in `done_keys`.
    `num_classes`: the labels' count, whose log is the loss of a model that learned nothing."""
    ledger = smart.Ledger()
    keep = smart.once(record, done_keys)
    throughput = measure_layouts(cfg, s, name, points, specs, ledger, keep, "smart")
    layouts = list(throughput)
    excluded = [layout for layout in layouts if throughput[layout].status != "ok"]
    classes = smart.classes(points, coupled, excluded)
    ledger.classes = len(classes)
    seeds = list(dict.fromkeys(p.seed for p in points))
    print_classes(classes, coupled, len(seeds))
    per_seed = len({replace(p, seed=None) for p in points})
    least, most = smart.sample_share(len(classes), per_seed, cfg.smart.eta, cfg.smart.rungs)
    console.note(f"smart: {len(classes)} class(es) for {per_seed} point(s) per seed: the rungs train {least:.0%} "
                 f"of the grid's samples if halving stops down to the best 1/{cfg.smart.eta} at every rung, "
                 f"{most:.0%} if the data let it stop nothing; the throughput runs come on top")
    uninformed = math.log(num_classes) if num_classes > 1 else None
    accuracy_runs = run_rungs(cfg, s, name, classes, seeds, throughput, specs, ledger, keep, uninformed)
    class_of = {member: c.key for c in classes for member in c.members}
    ledger.full_grid_estimate = smart.full_grid_estimate(points, specs, throughput, class_of, accuracy_runs)
    return ledger


def measure_layouts(cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                    specs: Dict[GridPoint, PointSpec], ledger: smart.Ledger, keep: Record, strategy: str
                    ) -> Dict[GridPoint, PointResult]:
    """Every layout's throughput run, each layout's result (a run that never reported: a failed result);
    the points of a layout that did not end ok are recorded with its result."""
    layouts = list(dict.fromkeys(smart.layout(p) for p in points))
    console.note(f"{strategy}: {len(layouts)} layout(s) measured for throughput and memory in runs of at most "
                 f"{cfg.smart.throughput_steps} steps")
    tp_specs = {layout: smart.throughput_spec(cfg, specs, points, layout) for layout in layouts}
    # The throughput runs are the Ray Tune experiment named after the sweep: sweep.resume finds a sweep
    # by that experiment's state (driver/resume.py), as for the grid.
    throughput = measure_runs(cfg, s, name, "throughput", tp_specs, smart.throughput_key, ledger, {})
    for point in points:
        measured = throughput.get(smart.layout(point))
        if measured is None or measured.status != "ok":
            keep(point, smart.layout_failure(point, measured))
    return {layout: throughput.get(layout) or smart.layout_failure(layout, None) for layout in layouts}


def run_rungs(cfg: SweeperConfig, s: Session, name: str, classes: List[AccuracyClass], seeds: list,
              throughput: Dict[GridPoint, PointResult], specs: Dict[GridPoint, PointSpec], ledger: smart.Ledger,
              keep: Record, uninformed: Optional[float]) -> Dict[str, List[PointResult]]:
    """Successive halving: each rung trains every surviving class's representative at every seed to
    the rung's share of the budget; a class is recorded (every member, every seed) when it finishes,
    is stopped, or passes the last rung. Returns every rung run's result by class."""
    alive = classes
    accuracy_runs: Dict[str, List[PointResult]] = defaultdict(list)
    fractions = smart.rung_fractions(cfg.smart.eta, cfg.smart.rungs)
    # smart.continue_rungs: each unit's last rung run (its checkpoint is where the next rung starts), and
    # the training seconds its rungs have taken so far (what a run from step 0 would spend again)
    previous: Dict[GridPoint, PointResult] = {}
    trained: Dict[GridPoint, float] = defaultdict(float)
    folder = rungs_folder(cfg, s, name)
    for rung, fraction in enumerate(fractions, 1):
        last = rung == len(fractions)
        units = {replace(c.representative, seed=seed): c for c in alive for seed in seeds}
        unit_specs = {unit: smart.rung_spec(specs[unit], fraction, previous.get(unit),
                                            storage.join(folder, smart.rung_key(rung)(unit)) if not last else None)
                      if cfg.smart.continue_rungs else smart.rung_spec(specs[unit], fraction) for unit in units}
        continuing = sum(spec.start_from is not None for spec in unit_specs.values())
        console.note(f"smart: rung {rung} of {len(fractions)}: {len(alive)} class(es) x {len(seeds)} seed(s) "
                     f"trained to {fraction:.3g} of the budget"
                     + (f", {continuing} run(s) continuing from the rung before's checkpoint" if continuing else ""))
        classes_of = {unit: c.key for unit, c in units.items()}
        results = measure_runs(cfg, s, f"{name}-rung{rung}", "rung", unit_specs, smart.rung_key(rung), ledger,
                               classes_of,
                               {u: previous[u] for u, spec in unit_specs.items() if spec.start_from is not None})
        for unit, result in results.items():
            accuracy_runs[classes_of[unit]].append(result)
            if unit_specs[unit].start_from is not None and result.status in ("ok", "stopped"):
                ledger.continued_runs += 1
                ledger.continuation_saved += trained[unit]
            trained[unit] += result.cost.train_seconds or 0.0
            previous[unit] = result
        scores = smart.rung_scores(cfg, alive, seeds, results, throughput, specs, rung, last, keep)
        decision = smart.halve(scores, cfg.smart.eta, uninformed, cfg.smart.confidence)
        if decision.note:
            console.note(f"smart: rung {rung} stops no class: {decision.note}")
        for c in alive:
            if c.key in decision.stopped:
                reps = [(replace(c.representative, seed=seed), results[replace(c.representative, seed=seed)])
                        for seed in seeds]
                ledger.stopped_classes.append(c.key)
                console.note(f"smart: stopped {c.key} at rung {rung}: {decision.stopped[c.key]}")
                smart.record_class(cfg, c, reps, throughput, specs, rung, decision.stopped[c.key], keep)
        alive = [c for c in alive if c.key in decision.keep]
    # Every class is recorded: its rungs' checkpoints have served (an interrupted sweep keeps them, for
    # sweep.resume to continue from).
    storage.delete(folder)
    return accuracy_runs


def rungs_folder(cfg: SweeperConfig, s: Session, name: str) -> str:
    """Where the rungs' training-state checkpoints go: under cluster.storage_path, else beside the sweep's
    Ray results (a continued run may land on another node: on a cluster, storage every node reads)."""
    return storage.join(storage.root(cfg.cluster.storage_path, s.cluster.results_dir, name), "rungs")


def measure_runs(cfg: SweeperConfig, s: Session, label: str, role: Union[str, Callable[[GridPoint], str]],
                 unit_specs: Dict[GridPoint, PointSpec], key: Callable[[GridPoint], str], ledger: smart.Ledger,
                 classes_of: Dict[GridPoint, str], continued: Optional[Dict[GridPoint, PointResult]] = None,
                 annotate: Optional[Callable[[GridPoint, PointResult], None]] = None) -> Dict[GridPoint, PointResult]:
    """Measurement runs in worker groups, each recorded (sweeper.role=`role`, or role(unit)) as it arrives;
    those a resumed sweep already holds are read back instead of measured again. Rounds go on while each
    one records something (a group that died is run again in a fresh one). `continued`: the runs before
    those that continue from a checkpoint, whose history is carried into theirs before they are recorded;
    `annotate` adds what the driver knows of a run (its provenance) before it is recorded."""
    continued = continued or {}
    role_of = role if callable(role) else (lambda unit: role)
    held: Dict[str, Dict] = {}
    if cfg.sweep.resume:
        for name in dict.fromkeys(role_of(unit) for unit in unit_specs):
            held.update(s.tracker.reader.measurements(name))
    out: Dict[GridPoint, PointResult] = {}
    for unit in unit_specs:
        # sweep.retry_failed: a failed measurement is measured again, like a failed point
        if key(unit) in held and not (cfg.sweep.retry_failed and held[key(unit)].get("status") == "failed"):
            out[unit] = PointResult.from_flat(held[key(unit)])
            ledger.add(unit, out[unit], classes_of.get(unit))

    def done(unit: GridPoint, result: PointResult) -> None:
        if unit in out:
            return
        if unit in continued:
            result = smart.carried(continued[unit], result)
        if annotate is not None:
            annotate(unit, result)
        out[unit] = result
        ledger.add(unit, result, classes_of.get(unit))
        s.tracker.log_measurement(key(unit), role_of(unit),
                                  smart.measurement_params(unit, unit_specs[unit], role_of(unit)), result)
        bar.update(task, advance=1, description=f"{key(unit)}: {result.status}")

    stamp = time.strftime("%H%M%S")
    with console.progress() as bar:
        task = bar.add_task(label, total=len(unit_specs), completed=len(out))
        attempt = 0
        while True:
            remaining = [u for u in unit_specs if u not in out]
            if not remaining:
                break
            before = len(out)
            run_label = label + (f"-rerun{attempt}" if attempt else "") + (f"-{stamp}" if cfg.sweep.resume else "")
            concurrency = cfg.sweep.max_concurrent_trials or concurrent_trials(
                s.cluster, s.resources, max(u.num_workers for u in remaining))
            runs.run_points(run_label, worker_groups(remaining, cfg.sweep.points_per_worker_group), unit_specs,
                            s.resources, s.cluster, concurrency,
                            lambda group: bar.update(task, description=f"{label}: {', '.join(key(u) for u in group)}"),
                            done, done_keys=frozenset())
            attempt += 1
            if len(out) == before:
                console.warn(f"{label}: a round measured nothing; {len(remaining)} run(s) left unmeasured")
                break
    return out


def print_classes(classes: List[AccuracyClass], coupled: bool, seeds: int) -> None:
    why = "same global batch and micro-batch (the model has batch-coupled layers)" if coupled else \
        "same global batch (the model has no batch-coupled layer)"
    console.note(f"smart: {len(classes)} accuracy class(es) ({why}), each trained once per seed ({seeds}) by "
                 "its representative: " + "; ".join(f"{c.key} <- {c.representative.key}" for c in classes))

