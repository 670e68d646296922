"""sweep.strategy=branch, the reading at one checkpoint: a branch's losses against its trunk's on the same
samples (`compare`), the verdict on each larger global batch and the local critical batch size they give
(`local_critical`), and the critical batch size over training as it is known to behave, never falling
(`monotone`, `flat`). The strategy's decisions built on it (where to branch, the schedule, the answer):
strategies/branch.py.

Pure functions on plain values (standard library), tested on fixed loss curves (tests/unit/test_branch.py).

The measurement (Merrill et al. 2025, arXiv:2505.23971): from a checkpoint of a trunk trained at global
batch B, branch to a larger global batch G with the LR scaled by the run's rule, for a short window of
samples; the branch reads the very samples the trunk reads over that window (the sample stream goes on
from the checkpoint's position whatever the layout), so the two losses are paired. The local critical
batch size is the largest G whose loss rise over the trunk's at the window's end is certified within a
margin (a one-sided interval counting the trunk's and the branch's noise), every smaller G certified
too; it lies between that G and the next one tried.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# The share of the window whose losses are compared: its second half, after a branch's first steps at a
# new LR and global batch (AdamW's second moments were estimated at the trunk's batch: a brief spike is
# expected there, and is not what the branch is judged on).
TAIL = 0.5

# A reading is weak when it could not have seen a branch that makes half the trunk's progress over the window:
# such a branch lags by half the trunk's fall at the window's end, the lag growing from zero at the checkpoint,
# so by 3/8 of the fall on average over the compared tail (the window's second half). A branch counted as
# keeping up with a tolerance above POWER x the fall might have been that branch.
POWER = 0.375

# A global batch is judged on at least this many of its branch's steps in the compared tail: a step's loss is
# its model's before the update, so a tail of one step shows how the branch started from the checkpoint, not
# how it trains (one step of 256 from a well-trained trunk is barely changed, and it "keeps up").
MIN_TAIL_STEPS = 3


@dataclass(frozen=True)
class Comparison:
    """A branch against its trunk over the tail of one window: the branch's mean training loss over the
    tail's samples, the trunk's over the same samples read at the branch's mean position (compare), their
    difference (branch minus trunk: above zero, the larger batch lost ground), and the trunk's own noise:
    the standard error of its tail's mean about its straight-line trend (`noise`), and of the trend's value
    where it is read (`noise_at`, larger the further that is from the tail's middle)."""

    global_batch: int
    trunk: float
    branch: float
    noise: float
    steps: int  # the trunk's steps in the tail
    noise_at: float = math.nan
    progress: float = math.nan  # the trunk's fall over the whole window (its trend's; above zero: falling)
    # the standard error of the branch's tail mean about its own straight-line trend (as few as
    # MIN_TAIL_STEPS steps: a noisy figure, and so a wide interval, not one to leave out)
    branch_noise: float = math.nan

    @property
    def difference(self) -> float:
        return self.branch - self.trunk

    @property
    def standard_error(self) -> float:
        """The difference's: the trunk's trend read at the branch's position and the branch's own tail mean,
        independent noises (nan when the branch's is not measured)."""
        trunk = self.noise_at if math.isfinite(self.noise_at) else self.noise
        return math.sqrt(trunk * trunk + self.branch_noise * self.branch_noise)


def tail_mean(losses: Sequence[float], step_samples: int, start: int, end: int) -> Tuple[List[float], float]:
    """The losses of the steps that read samples [start, end) of a run whose step i reads
    [i * step_samples, (i + 1) * step_samples) after its checkpoint, and their mean (nan when a loss is
    not finite or a step is missing: a run that did not get there)."""
    first, stop = start // step_samples, end // step_samples
    part = list(losses[first:stop])
    if len(part) < stop - first or not part or not all(math.isfinite(v) for v in part):
        return part, math.nan
    return part, statistics.fmean(part)


def compare(trunk_losses: Sequence[float], base: int, branch_losses: Sequence[float], global_batch: int,
            window: int) -> Comparison:
    """The branch at `global_batch` against the trunk (steps of `base` samples), both counted from the
    checkpoint, over the last TAIL of `window` samples.

    A step's loss is its model's before the step's update: over the same tail, a branch's losses come from
    models that have seen, on average, (global_batch - base) / 2 fewer samples than the trunk's (its steps
    are fewer and longer). So the trunk is read on its straight-line trend over the tail at the branch's
    mean position, not at its own: a branch exactly as good per sample seen as the trunk differs by zero,
    as its definition of keeping up asks, where the plain means would charge it the trunk's fall over those
    samples."""
    start = tail_start(window, global_batch)
    trunk_part, trunk = tail_mean(trunk_losses, base, start, window)
    branch_part, branch = tail_mean(branch_losses, global_batch, start, window)
    # the branch's mean position less the trunk's, in trunk steps
    shift = -(global_batch - base) / 2 / base
    at, noise_at = trend_at(trunk_part, shift) if math.isfinite(trunk) else (math.nan, math.nan)
    return Comparison(global_batch, at if math.isfinite(at) else trunk, branch, trend_noise(trunk_part),
                      len(trunk_part), noise_at, fall(trunk_losses[:window // base]),
                      trend_noise(branch_part) if math.isfinite(branch) else math.nan)


def fall(values: Sequence[float]) -> float:
    """How far the straight-line trend of `values` (one per step) falls from their first step to past their
    last (above zero: falling); nan below three values or with one not finite."""
    n = len(values)
    first, _ = trend_at(values, -(n - 1) / 2)
    last, _ = trend_at(values, (n + 1) / 2)
    return first - last


def tail_start(window: int, global_batch: int) -> int:
    """Where the compared tail of a `window` starts for a branch at `global_batch`: the last TAIL of it in
    whole steps, at least one."""
    return min(window - int(window * TAIL) // global_batch * global_batch, window - global_batch)


def judged(batches: Sequence[int], window: int) -> List[int]:
    """The global batches of `batches` a `window` can judge: MIN_TAIL_STEPS or more of their steps in its
    compared tail (a window of 2 x MIN_TAIL_STEPS steps of a global batch judges it)."""
    return [g for g in batches if (window - tail_start(window, g)) // g >= MIN_TAIL_STEPS]


def trend_at(values: Sequence[float], shift: float) -> Tuple[float, float]:
    """The straight-line least-squares trend of `values` (one per step) read `shift` steps from their mean
    position, and its standard error (residuals with n - 2 degrees of freedom); (nan, nan) below three
    values (a trend of two values has no residual to measure noise by)."""
    n = len(values)
    if n < 3 or not all(math.isfinite(v) for v in values):
        return math.nan, math.nan
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, values)) / (n - 2)
    return my + slope * shift, math.sqrt(residual * (1 / n + shift * shift / sxx))


def trend_noise(values: Sequence[float]) -> float:
    """The standard error of the mean of `values` about their straight-line trend (a falling loss is no
    noise): sqrt(residual variance / n), with n - 2 degrees of freedom; nan below three values."""
    return trend_at(values, 0.0)[1]


# A global batch's verdict at one checkpoint, the grid's non-inferiority words (report/noninferiority.py):
# certified within the margin, shown beyond it, neither, or no finite comparison at all.
KEEPS_UP, WORSE, UNPROVEN, NOT_JUDGED = "keeps up", "worse", "unproven", "not judged"


@dataclass(frozen=True)
class Local:
    """The local critical batch size at one checkpoint: `low` is the largest global batch certified to keep
    up (every smaller one too; the trunk's own when none was), `high` the next one tried (None: every branch
    kept up, the critical batch size is at least `low`). `tolerance` is the margin a branch's rise over the
    trunk must be certified within (branch.tolerance, else POWER x the trunk's fall over the window: a
    branch making half the trunk's progress per sample lags by that much on average over the tail, and
    half the progress per sample is where a global batch reaches the critical batch size,
    E = E_min (1 + B / B_crit)). Each global batch's `verdicts` come from the one-sided `bounds` of its
    rise, the trunk's and the branch's own noise both counted."""

    samples: int
    low: int
    high: Optional[int]
    tolerance: float
    differences: Dict[int, float]  # global batch -> branch minus trunk, over seeds
    tolerances: Dict[int, float] = field(default_factory=dict)  # global batch -> the margin it was judged by
    progress: float = math.nan  # the trunk's fall over the window, mean over the seeds
    # global batch -> (lower, upper) one-sided bounds of its rise at the level asked (nan: not judged)
    bounds: Dict[int, Tuple[float, float]] = field(default_factory=dict)
    verdicts: Dict[int, str] = field(default_factory=dict)  # global batch -> KEEPS_UP | WORSE | UNPROVEN | NOT_JUDGED

    @property
    def bounded(self) -> bool:
        return self.high is not None

    @property
    def kept(self) -> List[int]:
        """The global batches this reading counts as keeping up (every one up to `low`)."""
        return [g for g in self.differences if g <= self.low]

    def tolerance_of(self, global_batch: int) -> float:
        """The margin `global_batch` was judged by: its own, else the checkpoint's."""
        return self.tolerances.get(global_batch, self.tolerance)

    def verdict(self, global_batch: int) -> str:
        """Its verdict here; NOT_JUDGED for a global batch this checkpoint did not compare."""
        if global_batch in self.verdicts:
            return self.verdicts[global_batch]
        if global_batch not in self.differences:
            return NOT_JUDGED
        return KEEPS_UP if global_batch <= self.low else UNPROVEN  # a reading without verdicts (tests, old answers)

    @property
    def weak(self) -> bool:
        """A reading that could not have told a branch making half the trunk's progress from one keeping up:
        some global batch it counts as keeping up has a margin above POWER x the trunk's fall over the
        window (branch.tolerance set that wide, or the trunk did not fall). A reading bounded by a branch
        that fell behind is only as weak as the keep-ups below it; a zero margin (a trunk that did not fall,
        kept up with only by a branch certified no worse than it) is the strictest there is."""
        if not self.kept:
            return False
        if not (math.isfinite(self.progress) and self.progress > 0):
            return any(self.tolerance_of(g) > 0 for g in self.kept)
        return any(self.tolerance_of(g) > POWER * self.progress * (1 + 1e-9) for g in self.kept)

    @property
    def estimate(self) -> float:
        """The critical batch size this reading points at: it lies between `low` and `high` (the next global
        batch tried), so the geometric middle of the two (on the grid's doubling global batches, half a step
        in log2 above `low`); `low` itself when every branch kept up (a lower bound, all it says). Fitting the
        lower bounds alone reads the critical batch size half a step low at every bounded checkpoint."""
        return math.sqrt(self.low * self.high) if self.high is not None else float(self.low)

    @property
    def informative(self) -> bool:
        """Whether this reading says anything of the critical batch size. A margin above zero: yes (a global
        batch that keeps up would be certified, given the precision). A zero margin (the trunk did not fall
        over the window): only when some branch was certified no worse than the trunk, since against no
        margin a branch exactly as good as the trunk is certified no more often than the confidence allows:
        failing to is what noise alone gives, not a sign that only the trunk's global batch keeps up. No
        margin at all (the trunk's fall not measured): no."""
        if math.isfinite(self.tolerance) and self.tolerance > 0:
            return True
        return math.isfinite(self.tolerance) and KEEPS_UP in self.verdicts.values()


def margin(progress: float, fixed: Optional[float]) -> float:
    """The rise a branch must be certified within: `fixed` (branch.tolerance) when set, else POWER x the
    trunk's fall over the window; zero when the trunk did not fall (there is no progress to keep up with: a
    branch keeps up only when certified no worse than the trunk); nan when the fall is not measured."""
    if fixed is not None:
        return fixed
    if not math.isfinite(progress):
        return math.nan
    return POWER * progress if progress > 0 else 0.0


def judge(rise: float, standard_error: float, limit: float, z: float) -> Tuple[str, Tuple[float, float]]:
    """The verdict on a rise with its standard error against the margin `limit`, one-sided at the normal
    quantile `z`: KEEPS_UP when rise + z x se <= limit (certified), WORSE when rise - z x se > limit (shown
    beyond), UNPROVEN between, NOT_JUDGED when the rise or its noise is not finite; with the bounds."""
    if not (math.isfinite(rise) and math.isfinite(standard_error)):
        return NOT_JUDGED, (math.nan, math.nan)
    lower, upper = rise - z * standard_error, rise + z * standard_error
    if math.isfinite(limit) and upper <= limit:
        return KEEPS_UP, (lower, upper)
    if math.isfinite(limit) and lower > limit:
        return WORSE, (lower, upper)
    return UNPROVEN, (lower, upper)


def local_critical(samples: int, base: int, by_seed: Sequence[Dict[int, Comparison]], z: float,
                   fixed: Optional[float] = None) -> Local:
    """The local critical batch size at the checkpoint `samples` from each seed's comparisons (global batch
    -> Comparison): a global batch keeps up when its rise over the trunk, averaged over the seeds that
    measured it, is certified within the margin (`margin`) by a one-sided interval at the normal quantile
    `z` (branch.confidence's), its standard error the trunk's noise where its comparison reads it and the
    branch's own, pooled over the seeds (root mean square over sqrt(seeds)): not a failure to show it
    worse. The answer is the largest one such that it and every smaller one keep up (a larger one that
    keeps up after a smaller one did not is noise, not a critical batch)."""
    batches = sorted({g for seed in by_seed for g in seed})
    progress = [next(iter(seed.values())).progress for seed in by_seed if seed]
    progress = [p for p in progress if math.isfinite(p)]
    mean_progress = statistics.fmean(progress) if progress else math.nan
    limit = margin(mean_progress, fixed)
    differences: Dict[int, float] = {}
    bounds: Dict[int, Tuple[float, float]] = {}
    verdicts: Dict[int, str] = {}
    low, high = base, None
    for g in batches:
        mine = [seed[g] for seed in by_seed if g in seed]
        diffs = [c.difference for c in mine]
        differences[g] = statistics.fmean(diffs) if diffs and all(math.isfinite(d) for d in diffs) else math.nan
        se = _rms([c.standard_error for c in mine]) / math.sqrt(len(mine)) if all(
            math.isfinite(c.standard_error) for c in mine) else math.nan
        verdicts[g], bounds[g] = judge(differences[g], se, limit, z)
    for g in batches:
        if high is None and verdicts[g] == KEEPS_UP:
            low = g
        elif high is None:
            high = g
    return Local(samples, low, high, limit, differences, {g: limit for g in batches}, mean_progress, bounds,
                 verdicts)


def _rms(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return math.sqrt(statistics.fmean(v * v for v in finite)) if finite else math.nan


def monotone(locals_: Sequence[Local]) -> List[float]:
    """The critical batch size over training as it is known to behave, rising and never falling (Merrill et
    al. 2025): the least-squares non-decreasing fit (pool adjacent violators) of the readings in log2, so
    one low reading between higher ones is read as the noise it is rather than holding the schedule down.
    Each reading is fitted at its `estimate` (the middle of its interval). Readings that say nothing
    (`Local.informative`) are left out of the fit and take the fitted value before them (the first fitted
    value when none is before); with none informative, each reads its own `low`: the trunk's global batch,
    nothing having been certified."""
    used = [i for i, c in enumerate(locals_) if c.informative]
    if not used:
        return [float(c.low) for c in locals_]
    fitted = dict(zip(used, _fit_log2([locals_[i].estimate for i in used])))
    out: List[float] = []
    for i in range(len(locals_)):
        out.append(fitted.get(i, out[-1] if out else fitted[used[0]]))
    return out


def _fit_log2(values: Sequence[float]) -> List[float]:
    """The least-squares non-decreasing fit of `values` in log2 (pool adjacent violators), back in values."""
    blocks: List[List[float]] = []  # [sum of log2 values, count]
    for value in values:
        blocks.append([math.log2(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out: List[float] = []
    for total, count in blocks:
        out += [2 ** (total / count)] * int(count)
    return out


def flat(locals_: Sequence[Local], base: int) -> float:
    """Where the critical batch size flattens: the monotone fit at the last checkpoint (the trunk's own global
    batch without checkpoints)."""
    return monotone(locals_)[-1] if locals_ else float(base)
