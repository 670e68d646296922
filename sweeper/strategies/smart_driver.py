"""sweep.strategy=smart, run: every layout's throughput and memory in a short run; one representative
per accuracy-equivalence class and seed trained for accuracy in rungs of successive halving; every
point recorded with what was measured for it and where its accuracy came from; the compute ledger.

The rung logic is the driver's own, not Ray Tune's ASHAScheduler/HyperBandScheduler: a Tune trial
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
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from sweeper.strategies import smart
from sweeper.cluster import runs, storage
from sweeper.cluster.resources import concurrent_trials
from sweeper.config import SweeperConfig
from sweeper.driver import console
from sweeper.driver.skeleton import Session
from sweeper.plan import GridPoint, worker_groups
from sweeper.schema import PointResult
from sweeper.strategies.smart import AccuracyClass
from sweeper.worker.spec import PointSpec

# The sections a point takes from its layout's throughput run, and those from its class representative.
FROM_LAYOUT = ("throughput", "memory", "utilization", "flops", "recipe")
FROM_REPRESENTATIVE = ("accuracy", "progress", "divergence", "noise")
Rows = List[Tuple[GridPoint, PointResult]]
Record = Callable[[GridPoint, PointResult], None]


@dataclass
class Ledger:
    """Point-seconds (each measurement run's wall time in its worker) by phase, and by class so a
    class's rungs count as `stopped` once halving stops it."""

    throughput: float = 0.0
    by_class: Dict[str, float] = field(default_factory=lambda: defaultdict(float))
    stopped_classes: List[str] = field(default_factory=list)
    runs: int = 0
    full_grid_estimate: float = 0.0
    classes: int = 0
    # smart.continue_rungs: the training seconds the continued rung runs did not spend again (their earlier
    # rungs' steps, which a run from step 0 repeats), and how many rung runs continued from a checkpoint
    continuation_saved: float = 0.0
    continued_runs: int = 0
    # every measurement run, for the parent's sum_trial_seconds / sum_train_seconds (a composed point
    # has no run of its own: what the sweep spent is what its measurement runs spent)
    measured: Rows = field(default_factory=list)

    def add(self, unit: GridPoint, result: PointResult, class_key: Optional[str] = None) -> None:
        seconds = result.cost.trial_seconds or 0.0
        self.runs += 1
        self.measured.append((unit, result))
        if class_key is None:
            self.throughput += seconds
        else:
            self.by_class[class_key] += seconds

    def metrics(self) -> Dict[str, float]:
        stopped = sum(s for k, s in self.by_class.items() if k in self.stopped_classes)
        accuracy = sum(self.by_class.values()) - stopped
        total = self.throughput + accuracy + stopped
        out = {
            "compute_throughput_point_seconds": self.throughput,
            "compute_accuracy_point_seconds": accuracy,
            "compute_stopped_point_seconds": stopped,
            "compute_point_seconds": total,
            "smart_measurement_runs": self.runs,
            "smart_accuracy_classes": self.classes,
            "smart_classes_stopped": len(self.stopped_classes),
            "smart_continued_runs": self.continued_runs,
            "compute_continuation_saved_point_seconds": self.continuation_saved,
        }
        if self.full_grid_estimate > 0:
            out["full_grid_point_seconds_estimate"] = self.full_grid_estimate
            out["compute_fraction_of_full_grid"] = total / self.full_grid_estimate
        return out


def measure(cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
            done_keys: frozenset, coupled: bool, num_classes: int, record: Record) -> Ledger:
    """The smart strategy over `points`: `record(point, result)` once per point not in `done_keys`.
    `num_classes`: the labels' count, whose log is the loss of a model that learned nothing."""
    ledger = Ledger()
    keep = once(record, done_keys)
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
    ledger.full_grid_estimate = full_grid_estimate(points, specs, throughput, class_of, accuracy_runs)
    return ledger


def once(record: Record, done_keys: frozenset) -> Record:
    """`record`, for each point not in `done_keys` and not recorded yet."""
    recorded = set(done_keys)

    def keep(point: GridPoint, result: PointResult) -> None:
        if point.key not in recorded:
            recorded.add(point.key)
            record(point, result)

    return keep


def measure_layouts(cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                    specs: Dict[GridPoint, PointSpec], ledger: Ledger, keep: Record, strategy: str
                    ) -> Dict[GridPoint, PointResult]:
    """Every layout's throughput run, each layout's result (a run that never reported: a failed result);
    the points of a layout that did not end ok are recorded with its result."""
    layouts = list(dict.fromkeys(smart.layout(p) for p in points))
    console.note(f"{strategy}: {len(layouts)} layout(s) measured for throughput and memory in runs of at most "
                 f"{cfg.smart.throughput_steps} steps")
    tp_specs = {layout: throughput_spec(cfg, specs, points, layout) for layout in layouts}
    # The throughput runs are the Ray Tune experiment named after the sweep: sweep.resume finds a sweep
    # by that experiment's state (driver/resume.py), as for the grid.
    throughput = measure_runs(cfg, s, name, "throughput", tp_specs, throughput_key, ledger, {})
    for point in points:
        measured = throughput.get(smart.layout(point))
        if measured is None or measured.status != "ok":
            keep(point, layout_failure(point, measured))
    return {layout: throughput.get(layout) or layout_failure(layout, None) for layout in layouts}


def run_rungs(cfg: SweeperConfig, s: Session, name: str, classes: List[AccuracyClass], seeds: list,
              throughput: Dict[GridPoint, PointResult], specs: Dict[GridPoint, PointSpec], ledger: Ledger,
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
        unit_specs = {unit: rung_spec(specs[unit], fraction, previous.get(unit),
                                      storage.join(folder, rung_key(rung)(unit)) if not last else None)
                      if cfg.smart.continue_rungs else rung_spec(specs[unit], fraction) for unit in units}
        continuing = sum(spec.start_from is not None for spec in unit_specs.values())
        console.note(f"smart: rung {rung} of {len(fractions)}: {len(alive)} class(es) x {len(seeds)} seed(s) "
                     f"trained to {fraction:.3g} of the budget"
                     + (f", {continuing} run(s) continuing from the rung before's checkpoint" if continuing else ""))
        classes_of = {unit: c.key for unit, c in units.items()}
        results = measure_runs(cfg, s, f"{name}-rung{rung}", "rung", unit_specs, rung_key(rung), ledger, classes_of,
                               {u: previous[u] for u, spec in unit_specs.items() if spec.start_from is not None})
        for unit, result in results.items():
            accuracy_runs[classes_of[unit]].append(result)
            if unit_specs[unit].start_from is not None and result.status in ("ok", "stopped"):
                ledger.continued_runs += 1
                ledger.continuation_saved += trained[unit]
            trained[unit] += result.cost.train_seconds or 0.0
            previous[unit] = result
        scores: Dict[str, smart.Score] = {}
        for c in alive:
            reps = [(replace(c.representative, seed=seed), results.get(replace(c.representative, seed=seed)))
                    for seed in seeds]
            score = None if last else rung_score(cfg, reps)
            if score is None:  # finished: the last rung, or it cannot go on (rung_score says why)
                record_class(cfg, c, reps, throughput, specs, rung, None if last else ended_early(reps), keep)
            else:
                scores[c.key] = score
        decision = smart.halve(scores, cfg.smart.eta, uninformed, cfg.smart.confidence)
        if decision.note:
            console.note(f"smart: rung {rung} stops no class: {decision.note}")
        for c in alive:
            if c.key in decision.stopped:
                reps = [(replace(c.representative, seed=seed), results[replace(c.representative, seed=seed)])
                        for seed in seeds]
                ledger.stopped_classes.append(c.key)
                console.note(f"smart: stopped {c.key} at rung {rung}: {decision.stopped[c.key]}")
                record_class(cfg, c, reps, throughput, specs, rung, decision.stopped[c.key], keep)
        alive = [c for c in alive if c.key in decision.keep]
    # Every class is recorded: its rungs' checkpoints have served (an interrupted sweep keeps them, for
    # sweep.resume to continue from).
    storage.delete(folder)
    return accuracy_runs


def rungs_folder(cfg: SweeperConfig, s: Session, name: str) -> str:
    """Where the rungs' training-state checkpoints go: under cluster.storage_path, else beside the sweep's
    Ray results (a continued run may land on another node: on a cluster, storage every node reads)."""
    return storage.join(storage.root(cfg.cluster.storage_path, s.cluster.results_dir, name), "rungs")


def throughput_key(point: GridPoint) -> str:
    return f"tp-{point.key}"


def rung_key(rung: int) -> Callable[[GridPoint], str]:
    return lambda point: f"r{rung}-{point.key}"


def throughput_spec(cfg: SweeperConfig, specs: Dict[GridPoint, PointSpec], points: Sequence[GridPoint],
                    layout: GridPoint) -> PointSpec:
    """A layout's short run: warm-up, the memory-tracked step and the timed windows of at most
    smart.throughput_steps steps; no evaluation, divergence check or noise scale (the accuracy runs'
    business). Throughput and memory depend on neither the seed nor the LR, so one run per layout."""
    spec = specs[next(p for p in points if smart.layout(p) == layout)]
    return replace(spec, point=layout, steps=min(spec.steps, cfg.smart.throughput_steps), evaluate=False,
                   divergence=replace(spec.divergence, check=False), gns=replace(spec.gns, enabled=False))


def rung_spec(spec: PointSpec, fraction: float, previous: Optional[PointResult] = None,
              save_to: Optional[str] = None) -> PointSpec:
    """A representative's accuracy run to `fraction` of its budget, evaluated at its end: no memory
    breakdown, FLOPs or CPU budget (its layout's throughput run measured those, and fits). One warm-up
    step, for the point's deadline to be projected from; the windows stay, as the edges where
    divergence is checked. Before the last rung the run is `partial`: an accuracy near a guess a
    fraction into the budget is a model still learning, not one that learned nothing (halving ranks
    it by its loss instead), and a spike still over its bar at the rung's end may yet come back;
    nonfinite and an unrecovered spike still end it diverged.

    `previous`: the unit's run at the rung before; when it saved its training state, this run continues
    from there and trains only the steps between the two rungs. `save_to`: where this run saves its own
    state at its end, for the next rung."""
    return segment_spec(spec, smart.rung_steps(spec.steps, fraction), fraction < 1, previous, save_to)


def segment_spec(spec: PointSpec, total_steps: int, partial: bool, previous: Optional[PointResult] = None,
                 save_to: Optional[str] = None) -> PointSpec:
    """`spec`'s run to its `total_steps`-th optimizer step, light (rung_spec says how), continuing from
    `previous`'s checkpoint when it saved one (then only the steps after it), saving at its end to `save_to`."""
    light = replace(spec.measure, warmup_steps=1, memory_breakdown=False)
    steps, start_from = total_steps, None
    if previous is not None and previous.status == "ok" and previous.state.saved_state_path:
        done = previous.cost.optimizer_steps or 0
        if 0 < done < steps:
            steps, start_from = steps - done, previous.state.saved_state_path
    return replace(spec, steps=steps, measure=light, flop_count=None, memory_estimate_bytes=None,
                   memory_budget_bytes=None, profile=False, partial=partial, start_from=start_from,
                   save_state_to=save_to)


def carried(previous: PointResult, result: PointResult) -> PointResult:
    """A continued rung run's result as one run from step 0: the rung before's loss per step, noise-scale
    series and gradient norms first, its optimizer steps and samples counted in (its evaluations and target
    came with the checkpoint: worker.state.History). Its own cost (train and trial
    seconds) stays its own: the ledger counts each run once."""
    out = PointResult.from_flat(result.to_flat())
    out.train_loss = list(previous.train_loss or []) + list(result.train_loss or [])
    out.noise.follow([previous.noise])
    out.divergence.follow([previous.divergence], previous.cost.optimizer_steps or 0)
    out.cost.optimizer_steps = (previous.cost.optimizer_steps or 0) + (result.cost.optimizer_steps or 0)
    out.cost.samples_seen = (previous.cost.samples_seen or 0) + (result.cost.samples_seen or 0)
    if result.cost.tokens_seen is not None:
        out.cost.tokens_seen = (previous.cost.tokens_seen or 0) + result.cost.tokens_seen
    return out


def measure_runs(cfg: SweeperConfig, s: Session, label: str, role: Union[str, Callable[[GridPoint], str]],
                 unit_specs: Dict[GridPoint, PointSpec], key: Callable[[GridPoint], str], ledger: Ledger,
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
            result = carried(continued[unit], result)
        if annotate is not None:
            annotate(unit, result)
        out[unit] = result
        ledger.add(unit, result, classes_of.get(unit))
        s.tracker.log_measurement(key(unit), role_of(unit), measurement_params(unit, unit_specs[unit], role_of(unit)),
                                  result)
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


def measurement_params(unit: GridPoint, spec: PointSpec, role: str) -> Dict[str, object]:
    return {"micro_batch_size": unit.micro_batch_size, "accumulation_steps": unit.accumulation_steps,
            "num_workers": unit.num_workers, "global_batch_size": unit.global_batch_size,
            "precision": unit.precision, "activation_checkpointing": unit.checkpointing,
            "lr_multiplier": unit.lr_multiplier, "seed": spec.seed, "lr": spec.lr, "steps": spec.steps,
            "point": unit.point_key, "measurement": role}


def rung_score(cfg: SweeperConfig, reps: List[Tuple[GridPoint, Optional[PointResult]]]) -> Optional[smart.Score]:
    """The class's validation loss at this rung, or None when it is finished now: a seed's run failed,
    diverged or is missing; every seed reached the target and stops there (eval.stop_at_target); or
    there is no validation loss to compare (its class then goes on: halving cannot rank it)."""
    results = [r for _, r in reps]
    if any(r is None or r.status != "ok" for r in results):
        return None
    if cfg.eval.stop_at_target and all(r.progress.reached_target for r in results):
        return None
    losses = [r.accuracy.val_loss for r in results]
    if any(v is None or not math.isfinite(v) for v in losses):
        return smart.Score(0.0, -math.inf, math.inf, len(losses), "no validation loss")
    return smart.score(losses, [r.accuracy.val_loss_se for r in results], cfg.smart.confidence,
                       [unit.seed for unit, _ in reps])


def ended_early(reps: List[Tuple[GridPoint, Optional[PointResult]]]) -> Optional[str]:
    """Why a class ends before the last rung although some of its seeds are ok: another seed diverged,
    failed or never reported (those ok seeds are then recorded `stopped`, their accuracy a rung's).
    None when it ends because every seed reached the target (eval.stop_at_target): that is its end."""
    bad = [unit.key for unit, r in reps if r is None or r.status != "ok"]
    return f"a seed of its class did not end ok at this rung ({', '.join(bad)}): the class goes no further" \
        if bad else None


def record_class(cfg: SweeperConfig, c: AccuracyClass, reps: List[Tuple[GridPoint, Optional[PointResult]]],
                 throughput: Dict[GridPoint, PointResult], specs: Dict[GridPoint, PointSpec], rung: int,
                 stopped: Optional[str], keep: Record) -> None:
    """Every member of class `c`, once per seed: its layout's figures and its representative's."""
    for unit, rep in reps:
        for member in c.members:
            point = replace(member, seed=unit.seed)
            if point not in specs:
                continue  # a layout the grid filtered out of this class's global batch
            tp = throughput[smart.layout(point)]
            if tp.status != "ok":
                continue  # recorded already with its own throughput run's status
            keep(point, compose(point, tp, unit, rep, c, rung, stopped))


def compose(point: GridPoint, tp: PointResult, unit: GridPoint, rep: Optional[PointResult], c: AccuracyClass,
            rung: int, stopped: Optional[str]) -> PointResult:
    """A point's record: throughput, memory, utilization, FLOPs and recipe from its layout's throughput
    run; accuracy, progress, divergence and noise scale from its class representative's run at its
    seed; the time to target from the representative's steps on this point's own step time."""
    out = from_layout(point, tp)
    prov = out.provenance
    prov.accuracy_class = c.key
    if rep is None:
        out.status, out.error = "failed", f"its class representative's accuracy run ({unit.key}) never reported"
        return out
    take_accuracy(out, rep)
    prov.accuracy_from = rung_key(rung)(unit)
    progress = out.progress
    if progress.steps_to_target is not None:
        progress.time_to_target_seconds = smart.derived_time_to_target(
            progress.steps_to_target, out.throughput.step_time_seconds, progress.eval_seconds_to_target)
        prov.time_to_target_from = "derived: representative's steps to target x this point's step time + evaluations"
    out.status, out.error = rep.status, rep.error
    if rep.status != "ok":
        out.error = f"{rep.error or rep.status} (in its class representative {prov.accuracy_from})"
    elif stopped is not None:
        out.status, out.error = "stopped", f"stopped by successive halving at rung {rung}: {stopped}"
        prov.stopped_at_rung, prov.stopped_at_samples, prov.stopped_reason = rung, rep.cost.samples_seen, stopped
    return out


def from_layout(point: GridPoint, tp: PointResult) -> PointResult:
    """A point's record with its layout's throughput run's sections (throughput, memory, utilization, FLOPs,
    recipe) and fixed cost, naming that run."""
    out = PointResult(trial_key=point.key, device=tp.device)
    for section in FROM_LAYOUT:
        setattr(out, section, replace(getattr(tp, section)))
    out.cost.startup_seconds = tp.cost.startup_seconds  # the layout's fixed cost, measured in its run
    out.provenance.throughput_from = throughput_key(smart.layout(point))
    return out


def take_accuracy(out: PointResult, run: PointResult) -> None:
    """`out` takes the quality side of the accuracy run `run` (accuracy, progress, divergence, noise scale, the
    loss per step, its optimizer steps and samples)."""
    for section in FROM_REPRESENTATIVE:
        setattr(out, section, replace(getattr(run, section)))
    out.train_loss = run.train_loss
    out.cost.optimizer_steps, out.cost.samples_seen = run.cost.optimizer_steps, run.cost.samples_seen


def layout_failure(point: GridPoint, measured: Optional[PointResult]) -> PointResult:
    """A point whose layout did not get through its throughput run: that run's result is the point's."""
    if measured is None:
        return PointResult(trial_key=point.key, status="failed", error="its layout's throughput run never reported")
    out = PointResult.from_flat({**measured.to_flat(), "trial_key": point.key})
    out.provenance.throughput_from = throughput_key(smart.layout(point))
    return out


def full_grid_estimate(points: Sequence[GridPoint], specs: Dict[GridPoint, PointSpec],
                       throughput: Dict[GridPoint, PointResult], class_of: Dict[GridPoint, str],
                       accuracy_runs: Dict[str, List[PointResult]]) -> float:
    """What the grid strategy would have spent, from the same measurements: per point, its layout's
    throughput run (start-up and its steps) plus the rest of its budget at its measured step time,
    plus the evaluations its budget holds at the seconds per evaluation its class's accuracy runs
    measured (all classes' when its own has none). A point that did not fit costs what its throughput
    run did; eval.stop_at_target is not modelled (the grid would stop early too: an upper bound there)."""
    per_eval_all = seconds_per_evaluation([r for runs in accuracy_runs.values() for r in runs])
    total = 0.0
    for point in points:
        tp = throughput.get(smart.layout(point))
        if tp is None:
            continue
        step, spent = tp.throughput.step_time_seconds, tp.cost.trial_seconds or 0.0
        if tp.status != "ok" or step is None:
            total += spent
            continue
        spec = specs[point]
        per_eval = seconds_per_evaluation(accuracy_runs.get(class_of.get(replace(point, seed=None)), []))
        evaluations = smart.evaluations(spec.steps, spec.eval.every_samples, point.global_batch_size) \
            if spec.evaluate else 0
        rest = max(spec.steps - (tp.cost.optimizer_steps or 0), 0) * step
        total += spent + rest + evaluations * (per_eval if per_eval is not None else per_eval_all or 0.0)
    return total


def seconds_per_evaluation(results: Sequence[PointResult]) -> Optional[float]:
    """The mean seconds of one evaluation (BatchNorm re-estimation included) over `results`' runs."""
    pairs = [(r.progress.eval_seconds, r.progress.evaluations) for r in results
             if r.progress.eval_seconds is not None and r.progress.evaluations]
    return sum(s for s, _ in pairs) / sum(n for _, n in pairs) if pairs else None


def print_classes(classes: List[AccuracyClass], coupled: bool, seeds: int) -> None:
    why = "same global batch and micro-batch (the model has batch-coupled layers)" if coupled else \
        "same global batch (the model has no batch-coupled layer)"
    console.note(f"smart: {len(classes)} accuracy class(es) ({why}), each trained once per seed ({seeds}) by "
                 "its representative: " + "; ".join(f"{c.key} <- {c.representative.key}" for c in classes))

