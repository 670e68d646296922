"""What "better" means for the recommendation: the quality metric a point is judged by (val_accuracy for a
classifier, val_loss or val_bits_per_byte for a language model, or a metric of eval.metrics_fn's that
report.quality_metric names), its direction, its units, its confidence intervals and the tolerance key that
bounds how much worse a faster point may be.

Every rule that compares two points' quality (non-inferiority, ties, the LR table, recipes against fp32)
works on the *score*: the value signed so that higher is better (a loss negated). A gap is the score of
one point minus another's, so "positive is better" and a tolerance is always `gap >= -tolerance`; the
words shown turn it back into the metric's own direction. Pure (stdlib; scipy.stats via sweeper.stats)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from sweeper import stats
from sweeper.config.report import QUALITY_CHOICES
from sweeper.stats import Interval
from sweeper.report.trials import PointSummary, Trial, _finite

AUTO = "auto"


@dataclass(frozen=True)
class Quality:
    metric: str  # the Trial field judged
    higher_is_better: bool
    units: str  # in words, for the reason: "accuracy", "nats per token", "bits per byte"
    tolerance_key: str  # the report setting that is the non-inferiority margin, in `units`
    # Objective accuracy: gaps this small (absolute, in `units`) are one result even when a test separates
    # them. Accuracy only (half a point); a loss has no natural floor, so only the data decide.
    tie_floor: float = 0.0
    # The standard error over held-out samples behind a one-seed interval (a loss's), scaled into `units`.
    se_metric: Optional[str] = None
    se_scale: float = 1.0
    # A metric of eval.metrics_fn's (Trial.val_metrics), its standard error a bootstrap over the samples.
    user: bool = False

    @property
    def is_accuracy(self) -> bool:
        return self.metric == "val_accuracy"

    @property
    def word(self) -> str:
        """'accuracy', 'loss', or a metric of the user's own by its name: what the sentences call it."""
        return "accuracy" if self.is_accuracy else self.metric if self.user else "loss"

    def value(self, trial: Trial) -> Optional[float]:
        value = (trial.metric(self.metric) or (None,))[0] if self.user else getattr(trial, self.metric)
        return float(value) if _finite(value) else None

    def se(self, trial: Trial) -> Optional[float]:
        """The standard error over the validation samples behind one run's value, in the metric's units."""
        if self.user:
            found = trial.metric(self.metric)
            return found[1] if found is not None and _finite(found[1]) else None
        se = getattr(trial, self.se_metric) if self.se_metric else None
        return se * self.se_scale if _finite(se) else None

    def put(self, trial: Trial, value: float, se: Optional[float]) -> Trial:
        """`trial` holding `value` (and its standard error, in the metric's units) as this quality's figure."""
        if self.user:
            up = self.higher_is_better
            kept = tuple(m for m in trial.val_metrics if m[0] != self.metric)
            return replace(trial, val_metrics=kept + ((self.metric, value, se, up),))
        figures = {self.metric: value}
        if self.se_metric:
            figures[self.se_metric] = None if se is None else se / self.se_scale
        return replace(trial, **figures)

    @property
    def has_se(self) -> bool:
        return self.user or self.se_metric is not None

    @property
    def se_words(self) -> str:
        return "bootstrap standard error over the validation samples" if self.user else \
            "standard error over the validation set"

    def score(self, trial: Trial) -> Optional[float]:
        """The value signed so that higher is better."""
        value = self.value(trial)
        return None if value is None else (value if self.higher_is_better else -value)

    def values(self, point: PointSummary) -> List[float]:
        """The value of each ok replicate that measured it."""
        return [v for t in point.replicates if t.status == "ok" for v in [self.value(t)] if v is not None]

    def best(self, points: Iterable[PointSummary]) -> PointSummary:
        """The best point by its value (the mean over its seeds); the key breaks exact ties."""
        return max(points, key=lambda p: (self.score(p.trial), p.key))

    # -- intervals -----------------------------------------------------------------------------------

    def interval(self, point: PointSummary, level: float = 0.95) -> Optional[Interval]:
        """The point's value with its confidence interval: Student t over its ok seeds (at least two), else
        one seed's: Wilson's of its validation samples for an accuracy, mean +/- z x SE for a loss."""
        if self.is_accuracy:
            return point.accuracy
        values = self.values(point)
        if len(values) >= 2:
            return stats.over_seeds(values, level)
        one = self.pooled(point)
        if one is None:
            return None
        mean, se = one
        half = stats.z_score(level) * se
        return Interval(mean, mean - half, mean + half, 1,
                        f"mean +/- z x its {self.se_words}, {stats.percent(level)} (one seed)")

    def gap(self, point: PointSummary, top: PointSummary, level: float = 0.95) -> Optional[Interval]:
        """The interval of `point`'s score minus `top`'s (positive: `point` is better), by the one rule every
        verdict uses:

        - seeds in common (at least 2): a paired t interval over them (a seed sees the same samples in the
          same order, so its luck cancels in the difference);
        - else at least 2 seeds on each side: Welch's interval over the seeds (their spread, unpaired);
        - else one seed on each side: one from the validation sets, Newcombe's of the two runs' hits for an
          accuracy, the normal interval of a difference of two means from their standard errors for a loss
          (both points are scored on the same validation set, so their errors correlate positively and this
          unpaired interval is conservative in that respect);
        - else None, not tested: one side has a spread over seeds and the other none to compare it with, or
          one seed and no validation-set size or SE recorded.

        Validation hits are never pooled over seeds: every seed is scored on the same validation set, so
        three seeds are not three times the samples."""
        mine, theirs = self._by_seed(point), self._by_seed(top)
        common = sorted(set(mine) & set(theirs))
        if len(common) >= 2:
            return stats.paired_difference([mine[s] for s in common], [theirs[s] for s in common], level)
        a, b = self._scores(point), self._scores(top)
        if len(a) >= 2 and len(b) >= 2:
            return stats.welch_difference(a, b, level)
        if len(a) != 1 or len(b) != 1:
            return None
        if self.is_accuracy:
            pooled = [hits(point), hits(top)]
            if pooled[0] is None or pooled[1] is None:
                return None
            (ha, na), (hb, nb) = pooled
            return stats.newcombe_difference(ha, na, hb, nb, level)
        a, b = self.pooled(point), self.pooled(top)
        if a is None or b is None:
            return None
        d, se = (a[0] - b[0]), math.hypot(a[1], b[1])  # the score's difference
        d = d if self.higher_is_better else -d  # a loss's sign flips
        half = stats.z_score(level) * se
        what = f"{self.metric}s' bootstrap" if self.user else "validation losses'"
        return Interval(d, d - half, d + half, 1, f"normal interval from the two {what} standard errors, "
                                                  f"{stats.percent(level)}")

    def _scores(self, point: PointSummary) -> List[float]:
        return [s for t in point.replicates if t.status == "ok" for s in [self.score(t)] if s is not None]

    def _by_seed(self, point: PointSummary) -> dict:
        return {t.seed: s for t in point.replicates if t.status == "ok" and t.seed is not None
                for s in [self.score(t)] if s is not None}

    def pooled(self, point: PointSummary) -> Optional[Tuple[float, float]]:
        """(mean value, its standard error) over the ok seeds from their validation-set SEs; not accuracy's.
        Every seed is scored on the same validation sequences, so averaging seeds does not average that
        sampling noise away: the SE is the seeds' mean SE, not divided by sqrt(seeds)."""
        return self.pooled_over(point, ("ok",))

    def pooled_over(self, point: PointSummary, statuses: Tuple[str, ...]) -> Optional[Tuple[float, float]]:
        """`pooled` over the replicates of these statuses (the chance check reads did_not_learn ones too)."""
        if not self.has_se:
            return None
        runs = [t for t in point.replicates if t.status in statuses and self.value(t) is not None]
        ses = [self.se(t) for t in runs]
        if not runs or not all(_finite(se) for se in ses):
            return None
        return statistics.fmean(self.value(t) for t in runs), statistics.fmean(ses)

    # -- words ---------------------------------------------------------------------------------------

    def most(self, what: str = "") -> str:
        """'most accurate point', or 'best point by val_loss' ('most accurate', 'best by val_loss' without
        `what`): the top of the ranking in this quality's words."""
        what = f" {what}" if what else ""
        return f"most accurate{what}" if self.is_accuracy else f"best{what} by {self.metric}"

    def shown(self, gap: Interval) -> Interval:
        """A score gap as the metric's own difference (point minus best): a loss's sign flips back."""
        if self.higher_is_better:
            return gap
        return replace(gap, mean=-gap.mean, low=-gap.high, high=-gap.low)

    def gap_text(self, gap: Interval) -> str:
        """'-0.012 [-0.031, +0.007] (paired t interval over 3 seeds, 95 %)' in the metric's direction."""
        g = self.shown(gap)
        return f"{g.mean:+.3f} [{g.low:+.3f}, {g.high:+.3f}] ({g.how})"

    def limit(self, tolerance: float) -> str:
        """The bound a certified gap lies beyond: '-0.02' for an accuracy, '+0.02' for a loss."""
        return f"-{tolerance:g}" if self.higher_is_better else f"+{tolerance:g}"

    def inside(self) -> str:
        """Where a certified gap lies against `limit`: 'above' (accuracy), 'below' (loss)."""
        return "above" if self.higher_is_better else "below"

    def outside(self) -> str:
        return "below" if self.higher_is_better else "above"

    def worse(self) -> str:
        """'below' (less accuracy) or 'above' (more loss)."""
        return self.outside()

    def amount(self, value: float, units: bool = True) -> str:
        """A tolerance-sized amount in words: '1.2 points' of accuracy, '0.031 bits per byte' ('1.2',
        '0.031' without `units`)."""
        number = f"{value * 100:.1f}" if self.is_accuracy else f"{value:.3f}"
        what = "points" if self.is_accuracy else f"of {self.units}" if self.user else self.units
        return f"{number} {what}" if units else number

    def text(self, point: PointSummary, level: float = 0.95) -> str:
        """'0.780 [0.737, 0.819]' with an interval, else '0.780'; '-' when unmeasured."""
        interval = self.interval(point, level)
        if interval is not None:
            return interval.text()
        value = self.value(point.trial)
        return "-" if value is None else f"{value:.3f}"

    def tolerance_text(self, tolerance: float) -> str:
        return f"{self.tolerance_key}={tolerance:g}"


ACCURACY = Quality("val_accuracy", True, "accuracy", "report.max_accuracy_drop", tie_floor=0.005)
LOSS = Quality("val_loss", False, "nats per token", "report.max_loss_rise", se_metric="val_loss_se")
BITS_PER_BYTE = Quality("val_bits_per_byte", False, "bits per byte", "report.max_loss_rise",
                        se_metric="val_loss_se", se_scale=1.0 / math.log(2))
QUALITIES = {q.metric: q for q in (ACCURACY, LOSS, BITS_PER_BYTE)}
CHOICES = QUALITY_CHOICES  # its one home is config/report.py (stdlib)


def user_quality(name: str, higher_is_better: bool) -> Quality:
    """A metric of eval.metrics_fn's: its margin report.max_accuracy_drop when higher is better (a drop, as
    accuracy's), report.max_loss_rise when lower is (a rise, as a loss's), in its own units."""
    return Quality(name, higher_is_better, name, "report.max_accuracy_drop" if higher_is_better
                   else "report.max_loss_rise", user=True)


def recorded(name: str, trials: Sequence[Trial]) -> Optional[Quality]:
    """The quality `name` as these trials recorded it: a built-in one, or a metric of eval.metrics_fn's
    with the direction its class declared; None when no trial recorded it."""
    if name in QUALITIES:
        return QUALITIES[name]
    found = next((m for t in trials for m in t.val_metrics if m[0] == name), None)
    return None if found is None else user_quality(name, found[3])


def resolve(name: Optional[str], trials: Sequence[Trial]) -> Quality:
    """What the recommendation judges by (report.quality_metric, else report.quality) for these trials: a
    metric's name, or auto: bits per byte when the runs recorded it (byte-level text), the validation loss
    when they trained a language model on other tokens (a recorded unigram entropy), else val_accuracy. A
    name no trial recorded falls back to auto (`unrecorded` says so)."""
    if name not in (None, AUTO) and recorded(name, trials) is not None:
        return recorded(name, trials)
    if any(_finite(t.val_bits_per_byte) for t in trials):
        return BITS_PER_BYTE
    if any(t.train_unigram_entropy_bits is not None for t in trials):
        return LOSS
    return ACCURACY


def unrecorded(name: Optional[str], trials: Sequence[Trial]) -> Optional[str]:
    """The report's note when report.quality_metric names a metric that no run recorded; None otherwise."""
    if name in (None, AUTO) or recorded(name, trials) is not None:
        return None
    names = sorted({m[0] for t in trials for m in t.val_metrics})
    found = f"its runs recorded {', '.join(names)} from eval.metrics_fn" if names else \
        "its runs recorded no metric of eval.metrics_fn"
    return (f"report.quality_metric={name} is not a metric this sweep recorded ({found}), so it is judged by "
            f"{resolve(None, trials).metric} instead.")


def judged_by(rec: Any) -> Quality:
    """The quality a Recommendation was judged by (its `quality` name, resolved over its runs)."""
    return resolve(rec.quality, [t for p in rec.points.values() for t in p.replicates])


def tolerance(quality: Quality, max_accuracy_drop: Optional[float], max_loss_rise: Optional[float]
              ) -> Optional[float]:
    """The non-inferiority margin in the quality's units: its own report setting."""
    return max_accuracy_drop if quality.tolerance_key == ACCURACY.tolerance_key else max_loss_rise


def hits(point: PointSummary) -> Optional[Tuple[float, int]]:
    """(validation hits, validation samples) pooled over the point's ok seeds; None when unrecorded."""
    measured = [t for t in point.replicates if t.status == "ok" and _finite(t.val_accuracy)]
    if not measured or any(not t.val_samples for t in measured):
        return None
    return sum(t.val_accuracy * t.val_samples for t in measured), sum(int(t.val_samples) for t in measured)

