"""sweep.strategy=branch, its decisions: where the trunk trains and saves its state, which branches run from
each save and for how long, each point's record, and the answer: the local critical batch size at each
checkpoint (read by branch_reading.py), the batch-size schedule it implies, the best constant layout, the
wall time each is predicted to take, and which of the two the sweep recommends.

Pure functions on plain values (standard library), tested on fixed loss curves (tests/unit/test_branch.py).
The driver's side runs what they decide on Ray (sweeper/driver/branch.py); docs/strategy.md tells the whole
story.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from sweeper import plan
from sweeper.config import SweeperConfig
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.strategies import branch_reading, smart
from sweeper.strategies.base import Strategy
from sweeper.strategies.smart import Record

if TYPE_CHECKING:  # the specs are only read and copied here; their module loads torch
    from sweeper.worker.spec import PointSpec


class Branch(Strategy):
    """sweep.strategy=branch: its LR rule as the points' train.lr_scaling, and a grid with a global batch
    to branch to."""

    name = "branch"

    def configure(self, cfg: SweeperConfig) -> SweeperConfig:
        return with_lr_rule(cfg)

    def grid_problems(self, cfg: SweeperConfig, points: Sequence[GridPoint]) -> List[str]:
        return grid_problems(cfg, points)


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
    optim.lr stays the LR the trunk trains at. Unchanged for a config too broken to read the grid from
    (validation says what is wrong)."""
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


# ---------------------------------------------------------------------------------------------------
# The trunk and its branches


@dataclass(frozen=True)
class Trunk:
    """What the branches measure from, fixed before any run: the trunk's layout (its global batch's fastest),
    the seeds it trains at, its sample budget, the window a branch trains for, the samples at which the trunk
    saves its state (`marks`), the larger global batches it branches to, and those the window is too short
    to judge (not branched to)."""

    layout: GridPoint
    seeds: list
    budget: int
    window: int
    marks: List[int]
    larger: List[int]
    unjudged: List[int]

    @property
    def base(self) -> int:
        return self.layout.global_batch_size

    @property
    def units(self) -> Dict[GridPoint, object]:
        """The trunk's run at each seed, and the seed."""
        return {replace(self.layout, seed=seed): seed for seed in self.seeds}

    def nothing_to_branch(self) -> Optional[str]:
        """Why no branch can run; None when some can."""
        if self.larger and self.marks:
            return None
        if not self.larger and not self.unjudged:
            return "no layout of a larger global batch got through its throughput run"
        if not self.larger:
            return f"the window of {self.window} samples judges no larger global batch"
        return f"a branch of {self.window} samples fits in the budget of {self.budget} samples at none of branch.at"


def trunk_of(cfg: SweeperConfig, points: Sequence[GridPoint], specs: Dict[GridPoint, PointSpec],
             fastest: Dict[int, GridPoint], base: int) -> Trunk:
    """The trunk at global batch `base` (one `fastest` holds: its layouts measured ok) and the branches it
    makes: to every larger global batch measured, but those the window cannot judge."""
    larger = [b for b in sorted(fastest) if b > base]
    layout = fastest[base]
    budget = specs[next(p for p in points if smart.layout(p) == layout)].steps * base
    window = window_samples(cfg.branch.window, budget, [base, *larger])
    unjudged = [g for g in larger if g not in branch_reading.judged(larger, window)]
    return Trunk(layout, list(dict.fromkeys(p.seed for p in points)), budget, window,
                 positions(cfg.branch.at, budget, base, window), [g for g in larger if g not in unjudged], unjudged)


def positions(fractions: Sequence[float], budget: int, base: int, window: int) -> List[int]:
    """The trunk's checkpoints in samples: each fraction of the `budget` rounded down to whole trunk steps
    (`base` samples each), at least one step in, at most a window before the budget's end (a branch must
    fit in the budget), without repeats, in order."""
    last = (budget - window) // base * base
    out = sorted({min(max(base, int(f * budget) // base * base), last) for f in fractions})
    return [s for s in out if 0 < s <= last]


def window_samples(window: Optional[int], budget: int, batches: Sequence[int]) -> int:
    """branch.window in samples (null: a twentieth of the budget, at least two steps of the largest global
    batch), rounded up to a multiple of every global batch compared, so each run ends on a whole step at
    the same sample."""
    step = 1
    for b in batches:
        step = step * b // math.gcd(step, b)
    wanted = window if window is not None else max(budget // 20, 2 * max(batches))
    return max(step, -(-wanted // step) * step)


def trunk_key(unit: GridPoint) -> str:
    return f"trunk-{unit.key}"


def branch_key(unit: GridPoint) -> str:
    return f"branch-{unit.key}"


def trunk_specs(specs: Dict[GridPoint, PointSpec], trunk: Trunk, saves: Dict[object, Dict[int, str]]
                ) -> Dict[GridPoint, PointSpec]:
    """Each seed's trunk: the point's own run, light (its layout's throughput run measured throughput and
    memory), evaluated as the point is and judged at its end as a point is (not partial), saving its state
    at each mark on the way (`saves`: seed -> mark -> where)."""
    return {unit: replace(smart.segment_spec(specs[unit], specs[unit].steps, False), save_states_at=saves[seed])
            for unit, seed in trunk.units.items()}


def branch_specs(cfg: SweeperConfig, specs: Dict[GridPoint, PointSpec], trunk: Trunk, fastest: Dict[int, GridPoint],
                 trunks: Dict[object, Optional[PointResult]], saves: Dict[object, Dict[int, str]]
                 ) -> Tuple[Dict[GridPoint, PointSpec], Dict[GridPoint, Tuple[object, int, int]]]:
    """Every branch: from each mark a seed's trunk saved (`trunks`: each seed's trunk run), to each larger
    global batch on its fastest layout, for the window; and what each is: (seed, checkpoint number from 1,
    global batch)."""
    lr_rule = branch_lr_rule(cfg)
    b_specs: Dict[GridPoint, PointSpec] = {}
    what: Dict[GridPoint, Tuple[object, int, int]] = {}
    for unit, seed in trunk.units.items():
        done = trunks[seed]
        saved = set(int(x) for x in (done.state.saved_at_samples or [])) if done is not None else set()
        for k, mark in enumerate(trunk.marks, 1):
            if mark not in saved:
                continue  # the trunk did not get there (it diverged or failed first), or its save failed
            for g in trunk.larger:
                b_unit = replace(fastest[g], seed=seed, context=unit.context)
                # the grid point's own spec: its LR is the trunk's scaled by the rule (with_lr_rule)
                b_spec = specs.get(b_unit) or replace(specs[unit], point=b_unit,
                                                      lr=plan.scaled_lr(specs[unit].lr, g, trunk.base, lr_rule))
                b_spec = replace(smart.segment_spec(b_spec, trunk.window // g, True), start_from=saves[seed][mark],
                                 evaluate=False)
                b_unit = replace(b_unit, branch_from=mark)  # one run per layout, seed and checkpoint
                b_specs[b_unit] = replace(b_spec, point=b_unit)
                what[b_unit] = (seed, k, g)
    return b_specs, what


# ---------------------------------------------------------------------------------------------------
# The points' records and what the runs cost


NOTE = ("not measured for this point: sweep.strategy=branch measures quality once, by a trunk and branches from "
        "its checkpoints (the critical batch size over training); the trunk's layout carries the trunk's own")


@dataclass
class Ledger(smart.Ledger):
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


def fastest_layouts(ok: Dict[GridPoint, PointResult]) -> Dict[int, GridPoint]:
    """Each global batch's fastest layout among those measured ok (samples/s; memory already filtered)."""
    out: Dict[int, GridPoint] = {}
    for layout, result in ok.items():
        g = layout.global_batch_size
        if g not in out or result.throughput.samples_per_second > ok[out[g]].throughput.samples_per_second:
            out[g] = layout
    return out


def record_points(points: List[GridPoint], specs: Dict[GridPoint, PointSpec],
                  throughput: Dict[GridPoint, PointResult], trunks: Dict[object, Optional[PointResult]], keep: Record,
                  trunk_layout: Optional[GridPoint] = None) -> None:
    """Every point with its layout's throughput and memory; the trunk's layout at each seed with the trunk's
    quality too (its whole budget, trained as one run)."""
    for point in points:
        tp = throughput.get(smart.layout(point))
        if tp is None or tp.status != "ok":
            continue  # recorded already with its throughput run's status
        out = smart.from_layout(point, tp)
        trunk = trunks.get(point.seed) if smart.layout(point) == trunk_layout else None
        if trunk is not None:
            smart.take_accuracy(out, trunk)
            out.provenance.accuracy_from = "trunk"
            out.status, out.error = trunk.status, trunk.error
        else:
            out.accuracy.accuracy_note = NOTE
        keep(point, out)


# ---------------------------------------------------------------------------------------------------
# The schedule and its predicted wall time


def schedule(locals_: Sequence[branch_reading.Local], base: int, batches: Sequence[int]) -> List[Tuple[int, int]]:
    """The batch-size schedule [(samples seen, global batch), ...] from (0, base): from each checkpoint on, the
    largest of `batches` at or below the monotone fit of the critical batch size there (so the batch never
    shrinks), each change moved to the first step boundary of the span before it (a whole number of its steps
    after its start); spans of one global batch merged."""
    out = [(0, base)]
    for local, fitted in zip(locals_, branch_reading.monotone(locals_)):
        fitting = [b for b in batches if base <= b <= fitted + 1e-9]
        g = max(fitting) if fitting else base
        start, current = out[-1]
        if g <= current:
            continue
        # a whole number of the span before's steps after its start (train.batch_schedule's rule)
        at = start + max(1, -(-(local.samples - start) // current)) * current
        out.append((at, g))
    return out


def span_accumulations(unit: int, base: int, measured: Dict[int, float], batches: Sequence[int]
                       ) -> Dict[int, Tuple[int, int]]:
    """The global batches a schedule can change to and how each is timed. `train.batch_schedule` keeps the
    first span's micro-batch and workers (their product `unit`) and raises the accumulation, so a global
    batch of `batches` at or above `base` is reachable when `unit` divides it; `measured` maps the
    accumulation steps measured at that micro-batch and workers to their samples/s. For each reachable
    global batch: (the accumulation it runs at, the measured accumulation whose samples/s times it) - its
    own when measured, else the largest measured below it: a lower bound on its rate, since more
    accumulation spreads the same optimizer step over more samples. One with no measured accumulation at
    or below its own is left out (its rate would be a guess)."""
    out = {}
    for g in batches:
        if g < base or g % unit:
            continue
        steps = g // unit
        below = [a for a in measured if a <= steps]
        if below:
            out[g] = (steps, max(below))
    return out


def samples_factor(global_batch: int, base: int, critical: float) -> float:
    """How many samples a stretch of training takes at `global_batch` for what it takes at `base`, with the
    critical batch size `critical` (McCandlish et al. 2018's E = E_min (1 + B / B_crit))."""
    return (1 + global_batch / critical) / (1 + base / critical)


def predicted_seconds(spans: Sequence[Tuple[int, int]], budget: int, locals_: Sequence[branch_reading.Local], base: int,
                      rate: Dict[int, float]) -> Tuple[float, int]:
    """The predicted wall seconds (and samples) to the trunk's final loss when training follows `spans`
    [(samples of the trunk's progress, global batch), ...] at `rate[global batch]` samples/s: each stretch
    of the trunk's progress between checkpoints costs its samples x samples_factor at the stretch's
    critical batch size (the monotone fit at the checkpoint the stretch starts from, the first checkpoint's for
    the stretch before it: each reading fitted at the middle of its interval, `Local.estimate`)."""
    edges = [0] + [c.samples for c in locals_] + [budget]
    fitted = branch_reading.monotone(locals_)
    crit = [fitted[0]] + fitted if locals_ else [float(base)]
    seconds, samples = 0.0, 0.0
    for (a, b), critical in zip(zip(edges, edges[1:]), crit):
        for start, end, g in _pieces(spans, budget):
            lo, hi = max(a, start), min(b, end)
            if hi > lo:
                cost = (hi - lo) * samples_factor(g, base, max(critical, base))
                samples += cost
                seconds += cost / rate[g]
    return seconds, int(round(samples))


# The answer, of the schedule and the best constant layout: SCHEDULE only when predicted faster beyond the
# predictions' noise; TIE when the two are not told apart (the constant is then the answer: one layout, no
# accumulation changes mid-run); CONSTANT when it is predicted faster, or there is no schedule.
SCHEDULE, CONSTANT, TIE = "schedule", "constant", "tie"


def rate_noise(cv: Optional[float], windows: Optional[int]) -> Optional[float]:
    """A measured samples/s's relative standard error: its timed windows' coefficient of variation over
    sqrt(windows) (None when either is unrecorded)."""
    if cv is None or not windows or not math.isfinite(cv):
        return None
    return cv / math.sqrt(windows)


def choose(schedule_seconds: float, constant_seconds: float, spans: int, schedule_noise: Sequence[Optional[float]],
           constant_noise: Sequence[Optional[float]], z: float) -> Tuple[str, Optional[float]]:
    """(SCHEDULE | CONSTANT | TIE, the share of the constant's predicted time the two must differ by). A
    prediction is samples / a measured samples/s, so its noise is the rates' relative standard errors
    (`rate_noise`; the noisiest of the layouts timing it), the two combined in quadrature, times `z`. The
    model's own error (the critical batch size between the largest global batch that kept up and the next
    one tried) is not counted: the share is a floor on what can be told apart. An unmeasured noise tells
    nothing apart (TIE, None). One span: no schedule, CONSTANT."""
    if spans < 2:
        return CONSTANT, None
    noises = [max(n, default=None) if None not in n else None for n in (schedule_noise, constant_noise)]
    if None in noises:
        return TIE, None
    share = z * math.hypot(*noises)
    difference = (constant_seconds - schedule_seconds) / constant_seconds
    if abs(difference) <= share:
        return TIE, share
    return (SCHEDULE if difference > 0 else CONSTANT), share


def _pieces(spans: Sequence[Tuple[int, int]], budget: int) -> List[Tuple[int, int, int]]:
    starts = [s for s, _ in spans] + [budget]
    return [(starts[i], starts[i + 1], g) for i, (_, g) in enumerate(spans) if starts[i + 1] > starts[i]]


# ---------------------------------------------------------------------------------------------------
# The answer


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
    # SCHEDULE | CONSTANT | TIE (a tie: the constant is the answer), and the share of the constant's
    # predicted time the two had to differ by (None: no measured noise)
    choice: str = CONSTANT
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


def decide(cfg: SweeperConfig, base: int, budget: int, window: int, marks: List[int], seeds: list,
           trunks: Dict[object, Optional[PointResult]], branches: Dict[Tuple[object, int, int], PointResult],
           fastest: Dict[int, GridPoint], ok: Dict[GridPoint, PointResult], larger: List[int]) -> Optional[Answer]:
    """The local critical batch size at every checkpoint the trunks passed ok, the schedule and the best
    constant layout, with their predicted wall times, and which one is the answer (sweeper/strategies/branch.py:
    the schedule only when predicted faster beyond the noise of the rates behind both predictions). None when
    no trunk trained its whole budget ok."""
    whole = {seed: t for seed, t in trunks.items() if t is not None and t.status == "ok" and t.train_loss}
    if not whole:  # no critical batch size to give
        return None
    z = statistics.NormalDist().inv_cdf(cfg.branch.confidence)  # one-sided: "certified within", as the grid's
    locals_ = readings(cfg, base, window, marks, whole, branches, larger, z)
    flat = branch_reading.flat(locals_, base)
    plan_ = schedule_plan(base, budget, locals_, flat, fastest, ok)
    rates = {g: ok[fastest[g]].throughput.samples_per_second for g in fastest}
    # the fastest layout whose global batch stays at or below the critical batch size where it flattens
    constant_batch = max((g for g in fastest if g <= flat), key=lambda g: rates[g])
    constant_seconds, _ = predicted_seconds([(0, constant_batch)], budget, locals_, base, rates)
    noise = {layout.key: rate_noise(r.throughput.samples_per_second_cv, r.throughput.stable_windows_used
                                    or r.throughput.timing_windows) for layout, r in ok.items()}
    choice, share = choose(plan_.seconds, constant_seconds, len(plan_.spans),
                           [noise.get(k) for k in dict.fromkeys(plan_.timed_as)],
                           [noise.get(fastest[constant_batch].key)], z)
    why = choice_why(plan_, base, flat, constant_batch, constant_seconds, choice, share)
    if locals_[-1].weak:
        why += weak_why(locals_[-1])
    return Answer(base, budget, window, locals_, plan_.spans, plan_.layouts, plan_.seconds,
                  fastest[constant_batch].key, constant_batch, constant_seconds, choice == SCHEDULE, why,
                  b_simple_over_training(marks, branches), plan_.timed_as, choice=choice, noise_share=share,
                  lr_rule=branch_lr_rule(cfg))


def note_unjudged(answer: Answer, trunk: Trunk) -> None:
    """The answer names the larger global batches the window was too short to judge, and so how far up the
    critical batch size is read."""
    answer.unjudged = trunk.unjudged
    answer.why += (f". Global batch(es) {', '.join(map(str, trunk.unjudged))} were not branched to: the window of "
                   f"{trunk.window} samples is too short to judge them, so the critical batch size is read up to "
                   f"{max(trunk.larger)} at most")


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
    reach = span_accumulations(first.micro_batch_size * first.num_workers, base, measured, sorted(fastest))
    spans = schedule(locals_, base, sorted(reach))
    seconds, _ = predicted_seconds(spans, budget, locals_, base,
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
    if choice == SCHEDULE:
        return (f"the schedule is predicted to reach the trunk's final loss in {schedule_seconds:.3g} s against "
                f"{constant_seconds:.3g} s for a constant {constant_batch}, {100 * apart:.1f} % faster ({noise}): the "
                "constant batch trains its early samples above the critical batch size measured there, and pays "
                "for it in samples")
    if choice == TIE:
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
