"""How sure a measured figure is: confidence intervals over seed replicates (Student t) or of one
validation set (Wilson score), and the test that decides whether two points' figures differ (Welch)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from scipy import stats as _scipy


@dataclass(frozen=True)
class Interval:
    """A measured mean with its confidence interval; `how` says in words how it was computed."""

    mean: float
    low: float
    high: float
    n: int  # seeds (over_seeds) or validation samples (binomial)
    how: str  # e.g. "t interval over 3 seeds, 95 %"
    sd: Optional[float] = None  # the standard deviation over seeds; None for a binomial interval

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self, digits: int = 3) -> str:
        """'0.780 [0.737, 0.819]'."""
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def percent(level: float) -> str:
    """0.95 -> '95 %'."""
    return f"{level * 100:g} %"


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level} must be a confidence level between 0 and 1, e.g. 0.95")


def z_score(level: float) -> float:
    """The two-sided normal quantile at `level`: 0.95 -> 1.96."""
    _check_level(level)
    return float(_scipy.norm.ppf(0.5 + level / 2))


def over_seeds(values: Sequence[float], level: float = 0.95) -> Interval:
    """Student t interval of the mean of `values` (one per seed replicate): mean +/- t * sd / sqrt(n)
    with n - 1 degrees of freedom. Needs at least two finite values."""
    _check_level(level)
    values = [float(v) for v in values]
    if len(values) < 2:
        raise ValueError(f"over_seeds needs at least 2 values (one per seed), got {len(values)}: "
                         "with one seed use binomial() for an accuracy")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"over_seeds needs finite values, got {values}")
    n = len(values)
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = float(_scipy.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, f"t interval over {n} seeds, {percent(level)}", sd)


def binomial(accuracy: float, samples: int, level: float = 0.95) -> Interval:
    """Wilson score interval of an accuracy measured on `samples` validation samples (one run): it
    stays inside [0, 1] and keeps its coverage near 0 and 1, where the normal approximation fails."""
    _check_level(level)
    if samples is None or int(samples) < 1:
        raise ValueError(f"binomial needs a positive number of validation samples, got {samples}")
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy={accuracy} must be a fraction between 0 and 1")
    n = int(samples)
    z = float(_scipy.norm.ppf(0.5 + level / 2))
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n))
    how = f"Wilson interval of {n} validation samples, {percent(level)} (one seed)"
    return Interval(float(accuracy), max(0.0, centre - half), min(1.0, centre + half), n, how)


def above_chance(hits: int, samples: int, chance: float, level: float = 0.95) -> bool:
    """Whether `hits` correct of `samples` validation samples are separated from guessing (`chance`, e.g.
    1 / classes) at `level`: a one-sided exact binomial test, p = P(X >= hits | chance) < 1 - level.
    81 of 263 against 1/10 is separated (p ~ 1e-20); 25 of 263 is not (fewer hits than a guess's 26.3)."""
    _check_level(level)
    if samples <= 0:
        return False
    if not 0.0 < chance < 1.0:
        raise ValueError(f"chance={chance} must be a probability between 0 and 1 (1 / classes)")
    hits = int(round(hits))
    if hits <= chance * samples:
        return False
    p = float(_scipy.binomtest(hits, samples, chance, alternative="greater").pvalue)
    return p < 1.0 - level


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test (unequal variances) for equal means of `a` and `b`, each
    with at least two values. Identical constant samples give 1.0; different constants 0.0."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch_p needs at least 2 values per side, got {len(a)} and {len(b)}")
    if statistics.variance(a) == 0 and statistics.variance(b) == 0:
        # No spread at all: scipy returns nan; the means either agree or differ for certain.
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    return float(_scipy.ttest_ind(a, b, equal_var=False).pvalue)


def separable(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> bool:
    """Whether `a` and `b` (one value per seed each) have different means at `level`: Welch's t-test,
    two-sided, p < 1 - level. With fewer than two values on either side no test over seeds exists and
    this returns False; the caller then decides on non-overlapping intervals (e.g. `binomial`)."""
    _check_level(level)
    if len(a) < 2 or len(b) < 2:
        return False
    return welch_p(a, b) < 1.0 - level


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """Paired t interval of mean(a - b) over matched pairs (a[i] and b[i] from the same seed: the same
    samples in the same order, so the seed's luck cancels in the difference). Needs at least 2 pairs."""
    _check_level(level)
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) != len(b):
        raise ValueError(f"paired_difference needs as many values on each side, got {len(a)} and {len(b)}")
    if len(a) < 2:
        raise ValueError(f"paired_difference needs at least 2 pairs (seeds), got {len(a)}")
    diffs = [x - y for x, y in zip(a, b)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError(f"paired_difference needs finite values, got {a} and {b}")
    interval = over_seeds(diffs, level)  # the t interval of the per-seed differences
    return replace(interval, how="paired " + interval.how)


def newcombe_difference(hits_a: float, n_a: int, hits_b: float, n_b: int, level: float = 0.95) -> Interval:
    """Newcombe's hybrid score interval (method 10 of Newcombe 1998) of p_a - p_b, two independent
    proportions, from their Wilson intervals (l, u): [d - sqrt((p_a - l_a)^2 + (u_b - p_b)^2),
    d + sqrt((u_a - p_a)^2 + (p_b - l_b)^2)]. 56/70 vs 48/80: 0.2000 [0.0524, 0.3339]."""
    _check_level(level)
    pa, pb = float(hits_a) / int(n_a), float(hits_b) / int(n_b)
    wa, wb = binomial(min(1.0, max(0.0, pa)), n_a, level), binomial(min(1.0, max(0.0, pb)), n_b, level)
    d = pa - pb
    low = d - math.sqrt((pa - wa.low) ** 2 + (wb.high - pb) ** 2)
    high = d + math.sqrt((wa.high - pa) ** 2 + (pb - wb.low) ** 2)
    return Interval(d, low, high, min(int(n_a), int(n_b)),
                    f"Newcombe interval of {int(n_a)} and {int(n_b)} validation samples, {percent(level)}")


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """Welch's (unpaired, unequal variances) t interval of mean(a) - mean(b), Welch-Satterthwaite
    degrees of freedom: the interval that ignores which seed each value came from."""
    _check_level(level)
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch_difference needs at least 2 values per side, got {len(a)} and {len(b)}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    mean = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(mean, mean, mean, min(len(a), len(b)), f"Welch interval, {percent(level)}", 0.0)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(_scipy.t.ppf(0.5 + level / 2, df)) * se
    return Interval(mean, mean - half, mean + half, min(len(a), len(b)), f"Welch interval, {percent(level)}")


def seeds_to_settle(gap: Interval, threshold: float, level: float = 0.95, most: int = 1000) -> Optional[int]:
    """How many seeds would put a paired interval like `gap` (same mean and spread) wholly on one side of
    `threshold`: the smallest n with t(n-1) * sd / sqrt(n) < |mean - threshold|. None without a spread
    or when more than `most` would be needed."""
    if gap.sd is None or gap.sd <= 0:
        return None
    distance = abs(gap.mean - threshold)
    if distance == 0:
        return None
    for n in range(max(2, gap.n + 1), most + 1):
        if float(_scipy.t.ppf(0.5 + level / 2, n - 1)) * gap.sd / math.sqrt(n) < distance:
            return n
    return None


__all__ = ["Interval", "above_chance", "z_score", "binomial", "newcombe_difference", "over_seeds", "paired_difference",
           "percent", "seeds_to_settle", "separable", "welch_difference", "welch_p"]
