"""sweep.strategy=branch, run: every layout's throughput and memory in a short run (as smart's); per seed,
one trunk at the base global batch over the whole budget, saving its training state at each of branch.at on
the way; from each checkpoint, one branch per larger global batch of the grid, on that global batch's
fastest measured layout, for branch.window samples. Every run is an MLflow child run (sweeper.role trunk |
branch, its provenance in tags); the critical batch size at each checkpoint, the schedule it implies and the
best constant layout go on the parent run, the report and the console. The arithmetic is strategies/branch.py's.

Two rounds after the throughput runs, each one Ray Tune run of worker groups: the trunks, then every branch.
A resumed sweep reads back every run it holds (smart's measure_runs) and runs only what is missing: a
branch from the trunk checkpoint still on disk (checkpoints are deleted when the sweep ends).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from sweeper import plan
from sweeper.cluster import storage
from sweeper.config import SweeperConfig
from sweeper.driver import console
from sweeper.driver.skeleton import Session
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.strategies import branch, branch_reading, smart, smart_driver
from sweeper.worker.spec import PointSpec

Record = Callable[[GridPoint, PointResult], None]
NOTE = ("not measured for this point: sweep.strategy=branch measures quality once, by a trunk and branches from "
        "its checkpoints (the critical batch size over training); the trunk's layout carries the trunk's own")


@dataclass
class Answer:
    """What the branches say: the critical batch size at each checkpoint, where it flattens, the schedule it
    implies and the best constant layout, each with its predicted wall time to the trunk's final loss."""

    base: int
    budget: int
    window: int
    locals: List[branch_reading.Local]
    schedule: List[Tuple[int, int]]
    schedule_layouts: List[str]
    schedule_seconds: Optional[float]
    constant: Optional[str]  # the point key of the best constant layout
    constant_batch: Optional[int]
    constant_seconds: Optional[float]
    recommend_schedule: bool
    why: str
    # the gradient noise scale over the same training: at each checkpoint, the mean B_simple its branches
    # measured (a branch accumulates or spreads over workers: it has the micro-gradients the estimate needs)
    b_simple: Dict[int, float] = field(default_factory=dict)
    # per span, the measured layout whose samples/s times it: its own, or the same micro-batch and workers at
    # less accumulation (a lower bound on its rate) when the grid did not measure its accumulation
    schedule_timed_as: List[str] = field(default_factory=list)
    # the larger global batches the window was too short to judge (not branched to)
    unjudged: List[int] = field(default_factory=list)
    # branch.SCHEDULE | CONSTANT | TIE (a tie: the constant is the answer), and the share of the constant's
    # predicted time the two had to differ by (None: no measured noise)
    choice: str = branch.CONSTANT
    noise_share: Optional[float] = None
    lr_rule: Optional[str] = None  # the LR rule the branches and a schedule's spans scale by

    def to_dict(self) -> Dict[str, object]:
        return {
            "base_global_batch": self.base, "budget_samples": self.budget, "window_samples": self.window,
            "checkpoints": [{"samples": c.samples, "critical_batch_size": c.low, "next_tried": c.high,
                             "monotone_fit": fitted, "tolerance": c.tolerance,
                             "differences": {str(g): d for g, d in c.differences.items()},
                             "tolerances": {str(g): t for g, t in c.tolerances.items()},
                             "bounds": {str(g): list(b) for g, b in c.bounds.items()},
                             "verdicts": {str(g): v for g, v in c.verdicts.items()},
                             "trunk_fall": c.progress, "weak": c.weak, "informative": c.informative}
                            for c, fitted in zip(self.locals, branch_reading.monotone(self.locals))],
            "critical_batch_size_flat": branch_reading.flat(self.locals, self.base),
            "schedule": [[s, g] for s, g in self.schedule], "schedule_layouts": self.schedule_layouts,
            "schedule_timed_as": self.schedule_timed_as,
            "schedule_predicted_seconds": self.schedule_seconds, "constant": self.constant,
            "constant_global_batch": self.constant_batch, "constant_predicted_seconds": self.constant_seconds,
            "recommend_schedule": self.recommend_schedule, "why": self.why,
            "b_simple": [[samples, value] for samples, value in sorted(self.b_simple.items())],
            "unjudged_global_batches": self.unjudged, "choice": self.choice,
            "prediction_noise_share": self.noise_share, "lr_scaling": self.lr_rule,
        }


def branch_lr_rule(cfg: SweeperConfig) -> str:
    """branch.lr_scaling=auto: train.lr_scaling when set, else sqrt for Adam-family optimizers and linear for
    SGD (Merrill et al. 2025; Malladi et al. 2022 for Adam's square root)."""
    if cfg.branch.lr_scaling != "auto":
        return cfg.branch.lr_scaling
    if cfg.train.lr_scaling != "none":
        return cfg.train.lr_scaling
    name = str(cfg.optim._target_ or cfg.optim.name).lower()
    return "sqrt" if "adam" in name else "linear" if name == "sgd" else "none"


def with_lr_rule(cfg: SweeperConfig) -> SweeperConfig:
    """A branch sweep's config with its LR rule as train.lr_scaling, so every point (and the override the
    report writes) takes the LR a branch of its global batch trained at. When train.lr_scaling is none (the
    default) and branch.lr_scaling picks a rule, train.base_batch_size becomes the trunk's global batch:
    optim.lr stays the LR the trunk trains at. Unchanged for other strategies, or a config too broken to
    read the grid from (validation says what is wrong)."""
    if cfg.sweep.strategy != "branch":
        return cfg
    rule_ = branch_lr_rule(cfg)
    if rule_ == cfg.train.lr_scaling or rule_ not in ("none", "linear", "sqrt"):
        return cfg  # nothing to change, or a value validation refuses
    try:
        base = cfg.branch.base_global_batch or min(
            m * a * w for m in cfg.sweep.micro_batch_sizes for a in cfg.sweep.accumulation_steps
            for w in cfg.sweep.num_workers)
    except (TypeError, ValueError):
        return cfg
    train = replace(cfg.train, lr_scaling=rule_)
    if cfg.train.lr_scaling == "none":
        train = replace(train, base_batch_size=int(base))
    return replace(cfg, train=train)


def grid_problems(cfg: SweeperConfig, points: Sequence[GridPoint]) -> List[str]:
    """Before Ray: the base global batch must be one of the grid's, and some global batch must be larger."""
    batches = sorted({p.global_batch_size for p in points})
    base = cfg.branch.base_global_batch or (batches[0] if batches else None)
    if base not in batches:
        return [f"branch.base_global_batch={base} is not a global batch of the grid ({batches}): choose one of "
                "them or set it to null"]
    if not [b for b in batches if b > base]:
        return [f"sweep.strategy=branch needs a global batch larger than the trunk's {base} to branch to (the grid "
                f"has {batches}): add larger micro-batches, accumulation steps or workers"]
    return []


@dataclass
class Ledger(smart_driver.Ledger):
    """smart's ledger, its classes being the roles (trunk, branch), with the branches counted."""

    branches: int = 0

    def metrics(self) -> Dict[str, float]:
        trunk, branches = self.by_class.get("trunk", 0.0), self.by_class.get("branch", 0.0)
        total = self.throughput + trunk + branches
        out = {"compute_throughput_point_seconds": self.throughput, "compute_trunk_point_seconds": trunk,
               "compute_branch_point_seconds": branches, "compute_point_seconds": total,
               "branch_runs": self.branches}
        if self.full_grid_estimate > 0:
            out["full_grid_point_seconds_estimate"] = self.full_grid_estimate
            out["compute_fraction_of_full_grid"] = total / self.full_grid_estimate
        return out


def measure(cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
            done_keys: frozenset, record: Record) -> Tuple[Ledger, Optional[Answer]]:
    """The branch strategy over `points`: `record(point, result)` once per point not in `done_keys`; the
    ledger and the answer (None when the trunk could not run)."""
    ledger = Ledger()
    keep = smart_driver.once(record, done_keys)
    throughput = smart_driver.measure_layouts(cfg, s, name, points, specs, ledger, keep, "branch")
    ok = {layout: r for layout, r in throughput.items() if r.status == "ok" and r.throughput.samples_per_second}
    fastest = fastest_layouts(ok)
    batches = sorted(fastest)
    base = cfg.branch.base_global_batch or min(p.global_batch_size for p in points)
    if base not in fastest:
        console.warn(f"branch: no layout of the trunk's global batch {base} got through its throughput run; "
                     "nothing to branch from")
        record_points(points, specs, throughput, {}, keep)
        return ledger, None
    seeds = list(dict.fromkeys(p.seed for p in points))
    larger = [b for b in batches if b > base]
    trunk_layout = fastest[base]
    trunk_spec = specs[next(p for p in points if smart.layout(p) == trunk_layout)]
    budget = trunk_spec.steps * base
    window = branch.window_samples(cfg.branch.window, budget, [base, *larger])
    marks = branch.positions(cfg.branch.at, budget, base, window)
    unjudged = [g for g in larger if g not in branch_reading.judged(larger, window)]
    if unjudged:
        console.warn(f"branch: global batch(es) {', '.join(map(str, unjudged))} not branched to: a window of {window} "
                     f"samples gives them fewer than {branch_reading.MIN_TAIL_STEPS} steps in its compared second "
                     f"half (a step's loss is measured before its update); branch.window="
                     f"{2 * branch_reading.MIN_TAIL_STEPS * max(unjudged)} or more would judge them")
        larger = [g for g in larger if g not in unjudged]
    if not larger or not marks:
        why = ("no layout of a larger global batch got through its throughput run" if not larger and not unjudged
               else f"the window of {window} samples judges no larger global batch" if not larger else
               f"a branch of {window} samples fits in the budget of {budget} samples at none of branch.at")
        console.warn(f"branch: nothing to branch to: {why}")
        record_points(points, specs, throughput, {}, keep)
        return ledger, None
    console.note(f"branch: trunk {trunk_layout.key} (global batch {base}) x {len(seeds)} seed(s), checkpoints at "
                 f"{', '.join(map(str, marks))} of {budget} samples; from each, branches to "
                 f"{', '.join(f'{b} ({fastest[b].key})' for b in larger)} for {window} samples each")
    trunks, branches = run_rounds(cfg, s, name, specs, points, seeds, trunk_layout, fastest, larger, marks, window,
                                  ledger)
    ledger.branches = len(branches)
    answer = decide(cfg, base, budget, window, marks, seeds, trunks, branches, fastest, ok, larger)
    if answer is not None and unjudged:
        answer.unjudged = unjudged
        answer.why += (f". Global batch(es) {', '.join(map(str, unjudged))} were not branched to: the window of "
                       f"{window} samples is too short to judge them, so the critical batch size is read up to "
                       f"{max(larger)} at most")
    record_points(points, specs, throughput, {seed: trunks.get(seed) for seed in seeds}, keep, trunk_layout)
    ledger.full_grid_estimate = smart_driver.full_grid_estimate(points, specs, throughput, {},
                                                                {"": [r for r in trunks.values() if r]})
    if answer is not None:
        log_answer(s, answer, name)
    storage.delete(folder_of(cfg, s, name))
    return ledger, answer


def fastest_layouts(ok: Dict[GridPoint, PointResult]) -> Dict[int, GridPoint]:
    """Each global batch's fastest layout among those measured ok (samples/s; memory already filtered)."""
    out: Dict[int, GridPoint] = {}
    for layout, result in ok.items():
        g = layout.global_batch_size
        if g not in out or result.throughput.samples_per_second > ok[out[g]].throughput.samples_per_second:
            out[g] = layout
    return out


def folder_of(cfg: SweeperConfig, s: Session, name: str) -> str:
    """Where the trunks' checkpoints go: under cluster.storage_path, else beside the sweep's Ray results."""
    return storage.join(storage.root(cfg.cluster.storage_path, s.cluster.results_dir, name), "trunk")


def trunk_key(unit: GridPoint) -> str:
    return f"trunk-{unit.key}"


def branch_key(unit: GridPoint) -> str:
    return f"branch-{unit.key}"


def run_rounds(cfg: SweeperConfig, s: Session, name: str, specs: Dict[GridPoint, PointSpec], points: List[GridPoint],
               seeds: list, trunk_layout: GridPoint, fastest: Dict[int, GridPoint], larger: List[int],
               marks: List[int], window: int, ledger: Ledger
               ) -> Tuple[Dict[object, Optional[PointResult]], Dict[Tuple[object, int, int], PointResult]]:
    """Two rounds: every seed's trunk over the whole budget, saving its state at each mark on the way; then
    every branch, from each mark a trunk saved, to each larger global batch. Returns each seed's trunk and
    each (seed, checkpoint number from 1, global batch)'s branch."""
    folder = folder_of(cfg, s, name)
    base = trunk_layout.global_batch_size
    lr_rule = branch_lr_rule(cfg)
    units = {replace(trunk_layout, seed=seed): seed for seed in seeds}
    saves = {seed: {mark: storage.join(folder, unit.key, f"s{mark}") for mark in marks} for unit, seed in units.items()}
    # The trunk is the point's own run, light (its layout's throughput run measured throughput and memory),
    # evaluated as the point is; judged at its end as a point is (not partial).
    trunk_specs = {unit: replace(smart_driver.segment_spec(specs[unit], specs[unit].steps, False),
                                 save_states_at=saves[seed]) for unit, seed in units.items()}

    def annotate_trunk(unit: GridPoint, result: PointResult) -> None:
        result.provenance.branch_global_batch = base

    console.note(f"branch: round 1 of 2: {len(trunk_specs)} trunk(s) over the whole budget")
    done = smart_driver.measure_runs(cfg, s, f"{name}-trunk", "trunk", trunk_specs, trunk_key, ledger,
                                     {unit: "trunk" for unit in trunk_specs}, annotate=annotate_trunk)
    trunks: Dict[object, Optional[PointResult]] = {seed: done.get(unit) for unit, seed in units.items()}
    b_specs: Dict[GridPoint, PointSpec] = {}
    what: Dict[GridPoint, Tuple[object, int, int]] = {}
    for unit, seed in units.items():
        trunk = trunks[seed]
        saved = set(int(x) for x in (trunk.state.saved_at_samples or [])) if trunk is not None else set()
        for k, mark in enumerate(marks, 1):
            if mark not in saved:
                continue  # the trunk did not get there (it diverged or failed first), or its save failed
            for g in larger:
                b_unit = replace(fastest[g], seed=seed, context=unit.context)
                # the grid point's own spec: its LR is the trunk's scaled by the rule (with_lr_rule)
                b_spec = specs.get(b_unit) or replace(specs[unit], point=b_unit,
                                                      lr=plan.scaled_lr(specs[unit].lr, g, base, lr_rule))
                b_spec = replace(smart_driver.segment_spec(b_spec, window // g, True), start_from=saves[seed][mark],
                                 evaluate=False)
                b_unit = replace(b_unit, branch_from=mark)  # one run per layout, seed and checkpoint
                b_specs[b_unit] = replace(b_spec, point=b_unit)
                what[b_unit] = (seed, k, g)

    def annotate(unit: GridPoint, result: PointResult) -> None:
        seed, k, g = what[unit]
        prov = result.provenance
        prov.branch_trunk = trunk_key(replace(trunk_layout, seed=seed))
        prov.branch_checkpoint_samples, prov.branch_global_batch = marks[k - 1], g
        prov.branch_window_samples = window

    branches: Dict[Tuple[object, int, int], PointResult] = {}
    if b_specs:
        console.note(f"branch: round 2 of 2: {len(b_specs)} branch(es) of {window} samples")
        results = smart_driver.measure_runs(cfg, s, f"{name}-branches", "branch", b_specs, branch_key, ledger,
                                            {unit: "branch" for unit in b_specs}, annotate=annotate)
        branches = {what[unit]: result for unit, result in results.items()}
    return trunks, branches


def decide(cfg: SweeperConfig, base: int, budget: int, window: int, marks: List[int], seeds: list,
           trunks: Dict[object, Optional[PointResult]], branches: Dict[Tuple[object, int, int], PointResult],
           fastest: Dict[int, GridPoint], ok: Dict[GridPoint, PointResult], larger: List[int]) -> Optional[Answer]:
    """The local critical batch size at every checkpoint the trunks passed ok, the schedule and the best
    constant layout, with their predicted wall times, and which one is the answer (sweeper/strategies/branch.py:
    the schedule only when predicted faster beyond the noise of the rates behind both predictions)."""
    whole = {seed: t for seed, t in trunks.items() if t is not None and t.status == "ok" and t.train_loss}
    if not whole:
        console.warn("branch: no trunk trained its whole budget ok; no critical batch size to give")
        return None
    z = statistics.NormalDist().inv_cdf(cfg.branch.confidence)  # one-sided: "certified within", as the grid's
    locals_ = readings(cfg, base, window, marks, whole, branches, larger, z)
    flat = branch_reading.flat(locals_, base)
    plan_ = schedule_plan(base, budget, locals_, flat, fastest, ok)
    rates = {g: ok[fastest[g]].throughput.samples_per_second for g in fastest}
    # the fastest layout whose global batch stays at or below the critical batch size where it flattens
    constant_batch = max((g for g in fastest if g <= flat), key=lambda g: rates[g])
    constant_seconds, _ = branch.predicted_seconds([(0, constant_batch)], budget, locals_, base, rates)
    noise = {layout.key: branch.rate_noise(r.throughput.samples_per_second_cv, r.throughput.stable_windows_used
                                           or r.throughput.timing_windows) for layout, r in ok.items()}
    choice, share = branch.choose(plan_.seconds, constant_seconds, len(plan_.spans),
                                  [noise.get(k) for k in dict.fromkeys(plan_.timed_as)],
                                  [noise.get(fastest[constant_batch].key)], z)
    why = choice_why(plan_, base, flat, constant_batch, constant_seconds, choice, share)
    if locals_[-1].weak:
        why += weak_why(locals_[-1])
    return Answer(base, budget, window, locals_, plan_.spans, plan_.layouts, plan_.seconds,
                  fastest[constant_batch].key, constant_batch, constant_seconds, choice == branch.SCHEDULE, why,
                  b_simple_over_training(marks, branches), plan_.timed_as, choice=choice, noise_share=share,
                  lr_rule=branch_lr_rule(cfg))


def readings(cfg: SweeperConfig, base: int, window: int, marks: List[int], whole: Dict[object, PointResult],
             branches: Dict[Tuple[object, int, int], PointResult], larger: List[int], z: float
             ) -> List[branch_reading.Local]:
    """The local critical batch size at each checkpoint, each seed's branches compared with its trunk."""
    locals_: List[branch_reading.Local] = []
    for k, mark in enumerate(marks, 1):
        by_seed = []
        for seed, trunk in whole.items():
            after = list(trunk.train_loss)[mark // base:]
            compared = {}
            for g in larger:
                b = branches.get((seed, k, g))
                losses = list(b.train_loss or []) if b is not None and b.status == "ok" else []
                compared[g] = branch_reading.compare(after, base, losses, g, window)
            by_seed.append(compared)
        locals_.append(branch_reading.local_critical(mark, base, by_seed, z, cfg.branch.tolerance))
    return locals_


@dataclass
class Plan:
    """The schedule as train.batch_schedule runs it: its spans, each span's layout and the measured layout
    that times it, its predicted seconds, and the grid's global batches above the trunk's it cannot reach."""

    spans: List[Tuple[int, int]]
    layouts: List[str]
    timed_as: List[str]
    seconds: float
    first: GridPoint
    unreachable: List[int]


def schedule_plan(base: int, budget: int, locals_: List[branch_reading.Local], flat: float,
                  fastest: Dict[int, GridPoint], ok: Dict[GridPoint, PointResult]) -> Plan:
    """The schedule at the trunk's micro-batch and workers, more accumulation for each larger span, each span
    timed at its layout's measured samples/s (or a lower bound: the largest accumulation measured below);
    `flat`, where the critical batch size flattens, bounds the global batches it names unreachable."""
    first = fastest[base]
    measured = {p.accumulation_steps: r.throughput.samples_per_second for p, r in ok.items()
                if replace(p, accumulation_steps=1) == replace(first, accumulation_steps=1)}
    reach = branch.span_accumulations(first.micro_batch_size * first.num_workers, base, measured, sorted(fastest))
    spans = branch.schedule(locals_, base, sorted(reach))
    seconds, _ = branch.predicted_seconds(spans, budget, locals_, base,
                                          {g: measured[timed] for g, (_, timed) in reach.items()})
    return Plan(spans, [replace(first, accumulation_steps=reach[g][0]).key for _, g in spans],
                [replace(first, accumulation_steps=reach[g][1]).key for _, g in spans], seconds, first,
                [g for g in fastest if base < g <= flat and g not in reach])


def choice_why(plan_: Plan, base: int, flat: float, constant_batch: int, constant_seconds: float, choice: str,
               share: Optional[float]) -> str:
    """Why the answer is the schedule or the constant layout, with both predictions and the noise between."""
    schedule_seconds = plan_.seconds
    noise = ("no measured noise to tell them apart" if share is None else
             f"the predictions' noise is {100 * share:.1f} %")
    if len(plan_.spans) == 1 and plan_.unreachable:
        return (f"no schedule reaches the grid's global batch {plan_.unreachable[0]} from the trunk's "
                f"{plan_.first.key} by accumulation alone (train.batch_schedule keeps its micro-batch and workers): a "
                f"constant global batch of {constant_batch} is the answer")
    if len(plan_.spans) == 1:
        return (f"the critical batch size never reached a global batch of the grid larger than the trunk's {base} "
                f"(its rising fit ends at {flat:.0f}): a constant global batch of {constant_batch} is the answer")
    apart = abs(constant_seconds - schedule_seconds) / constant_seconds
    if choice == branch.SCHEDULE:
        return (f"the schedule is predicted to reach the trunk's final loss in {schedule_seconds:.3g} s against "
                f"{constant_seconds:.3g} s for a constant {constant_batch}, {100 * apart:.1f} % faster ({noise}): the "
                "constant batch trains its early samples above the critical batch size measured there, and pays "
                "for it in samples")
    if choice == branch.TIE:
        return (f"a tie: the schedule is predicted to reach the trunk's final loss in {schedule_seconds:.3g} s and "
                f"a constant global batch of {constant_batch} in {constant_seconds:.3g} s, {100 * apart:.1f} % apart, "
                f"inside the noise ({noise}; the samples/s behind each vary from window to window); the constant "
                "batch is the answer, the simpler to run: one layout, no accumulation changes mid-run")
    return (f"a constant global batch of {constant_batch} is predicted to reach the trunk's final loss in "
            f"{constant_seconds:.3g} s, faster than the schedule's {schedule_seconds:.3g} s ({noise}): its faster "
            "steps outweigh the samples it loses early")


def weak_why(last: branch_reading.Local) -> str:
    """What the why adds when the last checkpoint's reading (where the rising fit ends) is weak."""
    fell = f"fell by {last.progress:.3g}" if math.isfinite(last.progress) and last.progress > 0 else "did not fall"
    widest = max(last.tolerance_of(g) for g in last.kept)
    return (f". The last checkpoint's reading (where the rising fit ends) is weak: the trunk's loss {fell} over "
            "the window, so a branch making half its progress could have been certified within the margin of a "
            f"global batch counted as keeping up ({widest:.3g}, branch.tolerance); a smaller branch.tolerance, "
            "or null (the margin then follows the trunk's fall), sharpens it")


def b_simple_over_training(marks: List[int], branches: Dict[Tuple[object, int, int], PointResult]
                           ) -> Dict[int, float]:
    """At each checkpoint, the mean B_simple its branches measured (finite ones)."""
    out = {}
    for k, mark in enumerate(marks, 1):
        values = [r.noise.gns_b_simple_train_avg for (_, at, _), r in branches.items()
                  if at == k and r.status == "ok" and r.noise.gns_b_simple_train_avg is not None
                  and math.isfinite(r.noise.gns_b_simple_train_avg)]
        if values:
            out[mark] = sum(values) / len(values)
    return out


def record_points(points: List[GridPoint], specs: Dict[GridPoint, PointSpec], throughput: Dict[GridPoint, PointResult],
                  trunks: Dict[object, Optional[PointResult]], keep: Record,
                  trunk_layout: Optional[GridPoint] = None) -> None:
    """Every point with its layout's throughput and memory; the trunk's layout at each seed with the trunk's
    quality too (its whole budget, trained as one run)."""
    for point in points:
        tp = throughput.get(smart.layout(point))
        if tp is None or tp.status != "ok":
            continue  # recorded already with its throughput run's status
        out = smart_driver.from_layout(point, tp)
        trunk = trunks.get(point.seed) if smart.layout(point) == trunk_layout else None
        if trunk is not None:
            smart_driver.take_accuracy(out, trunk)
            out.provenance.accuracy_from = "trunk"
            out.status, out.error = trunk.status, trunk.error
        else:
            out.accuracy.accuracy_note = NOTE
        keep(point, out)


def log_answer(s: Session, answer: Answer, name: str) -> None:
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
