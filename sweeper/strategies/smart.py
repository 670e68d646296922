"""sweep.strategy=smart, the arithmetic: which layouts must train the same model (accuracy-equivalence
classes), each class's representative, the rungs of successive halving, and which classes a rung stops.

Pure functions on plain values (standard library; scipy's t quantile), tested without processes. The
driver runs what they decide (sweeper/strategies/smart_driver.py); docs/strategy.md tells the whole story.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from sweeper.plan import DEFAULT_PRECISION, GridPoint


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
