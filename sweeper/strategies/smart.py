"""sweep.strategy=smart, its decisions: which layouts must train the same model (accuracy-equivalence
classes), each class's representative, the rungs of successive halving and which classes a rung stops;
each point's record, composed from its layout's throughput run and its class representative's accuracy
run; the compute ledger.

Pure functions on plain values (standard library; scipy's t quantile, imported where it is used), tested
without processes. The driver's side runs what they decide on Ray (sweeper/driver/smart.py);
docs/strategy.md tells the whole story.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from sweeper.config import SweeperConfig
from sweeper.plan import DEFAULT_PRECISION, GridPoint
from sweeper.schema import PointResult
from sweeper.strategies.base import Strategy

if TYPE_CHECKING:  # the specs are only read and copied here; their module loads torch
    from sweeper.worker.spec import PointSpec

# The sections a point takes from its layout's throughput run, and those from its class representative.
FROM_LAYOUT = ("throughput", "memory", "utilization", "flops", "recipe")
FROM_REPRESENTATIVE = ("accuracy", "progress", "divergence", "noise")
Rows = List[Tuple[GridPoint, PointResult]]
Record = Callable[[GridPoint, PointResult], None]


class Smart(Strategy):
    """sweep.strategy=smart: the grid's config and grid. The model's batch-coupled layers are recorded with
    the accuracy classes they shape (sweeper/driver/smart.py), not before."""

    name = "smart"

    def opening_params(self, batch_coupled: Sequence[str]) -> Dict[str, str]:
        return {}


@dataclass(frozen=True)
class AccuracyClass:
    """Layouts that train the same model from the same samples, at one LR multiplier: the same global
    batch and recipe (and micro-batch, when the model has batch-coupled layers such as BatchNorm).
    `members` are layouts (seed None); `representative` is the one trained for accuracy, once per seed."""

    members: Tuple[GridPoint, ...]
    representative: GridPoint
    coupled: bool = False  # the model has batch-coupled layers: the micro-batch is part of the class

    @property
    def key(self) -> str:
        return class_key(self.representative, self.coupled)

    @property
    def global_batch_size(self) -> int:
        return self.representative.global_batch_size


def layout(point: GridPoint) -> GridPoint:
    """The point's layout and recipe, without its seed and LR multiplier: what throughput and memory
    depend on."""
    return replace(point, lr_multiplier=1.0, seed=None)


def class_key(point: GridPoint, coupled: bool) -> str:
    """gb64-lrx2 (a BatchNorm-free model), gb64-mb16 (batch-coupled layers), with -bf16 / -ckpt for
    a recipe other than fp32 without checkpointing and -ctx256 for a context of sweep.context_lengths
    (another context is another task: never one class)."""
    key = f"gb{point.global_batch_size}" + (f"-mb{point.micro_batch_size}" if coupled else "")
    if point.precision != DEFAULT_PRECISION:
        key += f"-{point.precision}"
    if point.checkpointing != "none":
        key += "-ckpt"
    if point.lr_multiplier != 1.0:
        key += f"-lrx{point.lr_multiplier:g}"
    if point.context is not None:
        key += f"-ctx{point.context}"
    return key


def classes(points: Sequence[GridPoint], coupled: bool,
            excluded: Sequence[GridPoint] = ()) -> List[AccuracyClass]:
    """The accuracy-equivalence classes of `points` (seeds folded: a class is trained once per seed).

    Same global batch, recipe and LR multiplier; with `coupled` (BatchNorm or another layer that
    mixes the samples of a micro-batch) also the same micro-batch. Why this is sound: the sampler
    gives every layout of a global batch the same samples at every step, and the same micro-batches
    when the micro-batch size is the same (plan.stream_indices), so gradients agree up to float
    summation order. `excluded` layouts (out of memory, failed in their throughput run) cannot
    represent their class; a class whose every member is excluded has no representative and is
    left out."""
    groups: Dict[Tuple, List[GridPoint]] = {}
    for point in points:
        member = replace(point, seed=None)
        key = (point.global_batch_size, point.recipe, point.lr_multiplier)
        key += (point.micro_batch_size,) if coupled else ()
        if member not in groups.setdefault(key, []):
            groups[key].append(member)
    out = []
    blocked = {layout(p) for p in excluded}
    for members in groups.values():
        candidates = [m for m in members if layout(m) not in blocked]
        if candidates:
            out.append(AccuracyClass(tuple(members), representative(candidates), coupled))
    return out


def representative(members: Sequence[GridPoint]) -> GridPoint:
    """The member trained for accuracy: the fewest workers (the least hardware for the same model),
    then the largest micro-batch (fewest, largest kernels), then the fewest accumulation steps."""
    return min(members, key=lambda m: (m.num_workers, -m.micro_batch_size, m.accumulation_steps))


def rung_fractions(eta: int, rungs: int) -> List[float]:
    """The share of the sample budget each rung trains to: eta^-(rungs-1), ..., 1/eta, 1."""
    return [float(eta) ** -(rungs - 1 - r) for r in range(rungs)]


def rung_steps(full_steps: int, fraction: float) -> int:
    """Optimizer steps of a rung: its share of the point's budget, rounded up to a whole step (at least one)."""
    return max(1, min(full_steps, math.ceil(full_steps * fraction - 1e-9)))


def sample_share(num_classes: int, points_per_seed: int, eta: int, rungs: int) -> Tuple[float, float]:
    """The share of the grid's training samples the rungs train, every point taking the same sample
    budget: (least, most). Least: halving stops down to its quota, the best ceil(n / eta), at every
    rung; most: it stops nothing, and every class trains every rung from step 0. Known before any run:
    what smart can save on a grid is bounded by its classes per point, whatever the data say."""
    fractions = rung_fractions(eta, rungs)
    least, alive = 0.0, num_classes
    for fraction in fractions:
        least += alive * fraction
        alive = max(1, math.ceil(alive / eta))
    return least / points_per_seed, num_classes * sum(fractions) / points_per_seed


def evaluations(steps: int, every_samples: Optional[int], global_batch_size: int) -> int:
    """How many evaluations a budget of `steps` holds: every eval.every_samples rounded up to whole
    global batches, before the last step (worker/train.py), then one at the end: ceil(steps / every)."""
    if not every_samples:
        return 1
    return -(-steps // math.ceil(every_samples / global_batch_size))


@dataclass(frozen=True)
class Score:
    """A class's figure at a rung (lower is better: the validation loss at the rung's samples), with
    its interval: mean +- t * sd / sqrt(n) over seeds, or with one seed the normal interval of the
    validation set's per-sample losses. `by_seed` keeps each seed's value, for comparisons paired by seed."""

    mean: float
    low: float
    high: float
    seeds: int
    how: str  # "seeds" | "validation set"
    by_seed: Tuple[Tuple[object, float], ...] = ()

    @property
    def width(self) -> float:
        return self.high - self.low


def score(values: Sequence[float], standard_errors: Sequence[Optional[float]], level: float,
          seeds: Sequence[object] = ()) -> Score:
    """The interval of a class's losses over its seeds (`values`, in the order of `seeds`), at confidence `level`."""
    n = len(values)
    mean = statistics.fmean(values)
    by_seed = tuple(zip(seeds, values))
    if n >= 2:
        half = t_quantile(level, n - 1) * statistics.stdev(values) / math.sqrt(n)
        return Score(mean, mean - half, mean + half, n, "seeds", by_seed)
    se = standard_errors[0] if standard_errors and standard_errors[0] is not None else 0.0
    half = statistics.NormalDist().inv_cdf(0.5 + level / 2) * se
    return Score(mean, mean - half, mean + half, 1, "validation set", by_seed)


def t_quantile(level: float, df: int) -> float:
    """Student's t quantile of a two-sided interval at `level` with `df` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def paired_difference(s: Score, best: Score, level: float) -> Optional[Score]:
    """The interval of `s` minus `best`, seed by seed, when both were measured at the same two seeds or
    more; else None. The same seed gives every class the same initial weights and the same samples in
    the same order (plan.stream_indices: classes differ in how the samples are grouped into steps,
    and in the LR), so what a seed shares with another class cancels in the difference; an interval
    of the two losses apart would count it twice."""
    mine, theirs = dict(s.by_seed), dict(best.by_seed)
    if len(mine) < 2 or mine.keys() != theirs.keys():
        return None
    return score([mine[seed] - theirs[seed] for seed in mine], [], level, list(mine))


@dataclass(frozen=True)
class Decision:
    keep: List[str]
    stopped: Dict[str, str]  # class key -> why, in words
    note: str = ""  # why nothing could be stopped at this rung, when that is why


def halve(scores: Dict[str, Score], eta: int, uninformed: Optional[float] = None, level: float = 0.95) -> Decision:
    """Successive halving over classes at one rung: keep the best ceil(n / eta) by mean loss, and
    every class the data cannot tell from the best one (halving must not choose between them); stop
    the rest, each with the figures that stopped it.

    Told apart: measured at the same seeds (two or more), the class's loss minus the best's, seed by
    seed, has a t-interval at `level` wholly above zero (paired_difference); otherwise (one seed, or
    other seeds) the two classes' own intervals do not overlap.

    `uninformed`: the loss of a model that has learned nothing (ln(classes) for cross-entropy: a
    uniform guess). While the best class's interval does not lie below it, no class has shown it
    learns, and their order is noise around the initial loss (a small batch's first steps at a high
    LR can even raise it): nothing is stopped at this rung."""
    if not scores:
        return Decision([], {})
    ranked = sorted(scores, key=lambda k: scores[k].mean)
    best = scores[ranked[0]]
    if uninformed is not None and not best.high < uninformed:
        return Decision(ranked, {}, f"the best class, {ranked[0]}, has a val loss {best.mean:.4g} [{best.low:.4g}, "
                                    f"{best.high:.4g}] not below {uninformed:.4g}, a guess's: none has learned yet")
    quota = set(ranked[: max(1, math.ceil(len(ranked) / eta))])
    keep, stopped = [], {}
    for key in ranked:
        s = scores[key]
        apart = separation(s, best, level)
        if key in quota or apart is None:
            keep.append(key)
        else:
            stopped[key] = (
                f"val loss {s.mean:.4g} [{s.low:.4g}, {s.high:.4g}] against the best {ranked[0]}'s "
                f"{best.mean:.4g} [{best.low:.4g}, {best.high:.4g}] ({s.how}): outside the best 1/{eta} and {apart}"
            )
    return Decision(keep, stopped)


def separation(s: Score, best: Score, level: float) -> Optional[str]:
    """Why `s` is worse than `best` beyond the noise, in words; None when the data cannot tell them apart
    (always for a class without a validation loss: no seeds to pair, and an interval of everything)."""
    diff = paired_difference(s, best, level)
    if diff is not None:
        if diff.low > 0:
            return (f"its loss minus the best's, seed by seed, is {diff.mean:.4g} [{diff.low:.4g}, {diff.high:.4g}] "
                    f"over {diff.seeds} seeds: above zero")
        return None
    return "the intervals do not overlap" if s.low > best.high else None


def derived_time_to_target(steps_to_target: Optional[float], step_time_seconds: Optional[float],
                           eval_seconds_to_target: Optional[float]) -> Optional[float]:
    """A member's time to target from its class representative's steps to target, on the member's own
    measured step time, plus the evaluations the representative spent until the target."""
    if steps_to_target is None or step_time_seconds is None:
        return None
    return steps_to_target * step_time_seconds + (eval_seconds_to_target or 0.0)


# ---------------------------------------------------------------------------------------------------
# A point's record, composed from the measurement runs, and what they cost


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


def once(record: Record, done_keys: frozenset) -> Record:
    """`record`, for each point not in `done_keys` and not recorded yet."""
    recorded = set(done_keys)

    def keep(point: GridPoint, result: PointResult) -> None:
        if point.key not in recorded:
            recorded.add(point.key)
            record(point, result)

    return keep


def throughput_key(point: GridPoint) -> str:
    return f"tp-{point.key}"


def rung_key(rung: int) -> Callable[[GridPoint], str]:
    return lambda point: f"r{rung}-{point.key}"


def throughput_spec(cfg: SweeperConfig, specs: Dict[GridPoint, PointSpec], points: Sequence[GridPoint],
                    wanted: GridPoint) -> PointSpec:
    """The layout `wanted`'s short run: warm-up, the memory-tracked step and the timed windows of at most
    smart.throughput_steps steps; no evaluation, divergence check or noise scale (the accuracy runs'
    business). Throughput and memory depend on neither the seed nor the LR, so one run per layout."""
    spec = specs[next(p for p in points if layout(p) == wanted)]
    return replace(spec, point=wanted, steps=min(spec.steps, cfg.smart.throughput_steps), evaluate=False,
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
    return segment_spec(spec, rung_steps(spec.steps, fraction), fraction < 1, previous, save_to)


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


def measurement_params(unit: GridPoint, spec: PointSpec, role: str) -> Dict[str, object]:
    return {"micro_batch_size": unit.micro_batch_size, "accumulation_steps": unit.accumulation_steps,
            "num_workers": unit.num_workers, "global_batch_size": unit.global_batch_size,
            "precision": unit.precision, "activation_checkpointing": unit.checkpointing,
            "lr_multiplier": unit.lr_multiplier, "seed": spec.seed, "lr": spec.lr, "steps": spec.steps,
            "point": unit.point_key, "measurement": role}


def rung_score(cfg: SweeperConfig, reps: List[Tuple[GridPoint, Optional[PointResult]]]) -> Optional[Score]:
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
        return Score(0.0, -math.inf, math.inf, len(losses), "no validation loss")
    return score(losses, [r.accuracy.val_loss_se for r in results], cfg.smart.confidence,
                       [unit.seed for unit, _ in reps])


def rung_scores(cfg: SweeperConfig, alive: Sequence[AccuracyClass], seeds: Sequence[object],
                results: Dict[GridPoint, PointResult], throughput: Dict[GridPoint, PointResult],
                specs: Dict[GridPoint, PointSpec], rung: int, last: bool, keep: Record) -> Dict[str, Score]:
    """Each class still in the running's score at this rung, for halving to rank; a class that finishes
    here (the last rung, or one that cannot go on: rung_score says why) is recorded instead, every member
    at every seed, by `keep`."""
    scores: Dict[str, Score] = {}
    for c in alive:
        reps = [(replace(c.representative, seed=seed), results.get(replace(c.representative, seed=seed)))
                for seed in seeds]
        figure = None if last else rung_score(cfg, reps)
        if figure is None:
            record_class(cfg, c, reps, throughput, specs, rung, None if last else ended_early(reps), keep)
        else:
            scores[c.key] = figure
    return scores


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
            tp = throughput[layout(point)]
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
        progress.time_to_target_seconds = derived_time_to_target(
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
    out.provenance.throughput_from = throughput_key(layout(point))
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
    out.provenance.throughput_from = throughput_key(layout(point))
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
        tp = throughput.get(layout(point))
        if tp is None:
            continue
        step, spent = tp.throughput.step_time_seconds, tp.cost.trial_seconds or 0.0
        if tp.status != "ok" or step is None:
            total += spent
            continue
        spec = specs[point]
        per_eval = seconds_per_evaluation(accuracy_runs.get(class_of.get(replace(point, seed=None)), []))
        count = evaluations(spec.steps, spec.eval.every_samples, point.global_batch_size) if spec.evaluate else 0
        rest = max(spec.steps - (tp.cost.optimizer_steps or 0), 0) * step
        total += spent + rest + count * (per_eval if per_eval is not None else per_eval_all or 0.0)
    return total


def seconds_per_evaluation(results: Sequence[PointResult]) -> Optional[float]:
    """The mean seconds of one evaluation (BatchNorm re-estimation included) over `results`' runs."""
    pairs = [(r.progress.eval_seconds, r.progress.evaluations) for r in results
             if r.progress.eval_seconds is not None and r.progress.evaluations]
    return sum(s for s, _ in pairs) / sum(n for _, n in pairs) if pairs else None
