"""A sweep's runs as the report reads them (Trial) and seed replicates folded into points with
confidence intervals (PointSummary, summarize). Pure (stdlib; scipy.stats via sweeper.stats)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from sweeper import stats
from sweeper.stats import Interval


def recorded_as(*names: str) -> Any:
    """A Trial field read from a record under other names than its own, the first one present winning:
    a sweeper/schema.py field's (its MLflow name comes from the schema) or a run param's."""
    return field(default=None, metadata={"recorded_as": names})


@dataclass(frozen=True)
class Trial:
    """One grid point's outcome, as the sweep recorded it (MLflow child run params and metrics). A field
    is read from the child run's param, metric or tag of the same name (the schema's tag name for a
    tag, report/recorded.py), unless `recorded_as` names others."""

    key: str  # e.g. "mb32-acc2-w1"
    micro_batch_size: int
    accumulation_steps: int
    num_workers: int
    global_batch_size: int
    # "ok" | "stopped" | "did_not_learn" | "diverged" | "oom" | "failed"; a record without one: failed
    status: str = field(metadata={"unrecorded": "failed"})
    lr: Optional[float] = None  # the LR it trained with (optim.lr, scaled for its global batch)
    samples_per_second: Optional[float] = None
    samples_per_second_cv: Optional[float] = None
    throughput_stable: Optional[bool] = None
    # why its throughput is not the recipe's: a precision its device only emulates (tag sweeper.throughput_emulated)
    throughput_emulated: Optional[str] = None
    peak_memory_bytes: Optional[float] = None
    val_accuracy: Optional[float] = None
    train_seconds: Optional[float] = None  # wall time of its optimizer steps
    samples_seen: Optional[float] = None
    # The point this run is a seed replicate of (param `point`: the key without the seed; tag sweeper.point
    # in older records); None: the key itself (a single-seed sweep, or a record from before seeds).
    point_key: Optional[str] = recorded_as("point", "sweeper.point")
    seed: Optional[int] = None
    lr_multiplier: Optional[float] = None  # sweep.lr_multipliers, on top of the scaling rule
    precision: Optional[str] = None  # "fp32" | "bf16" | "fp16"
    parallelism: Optional[str] = None  # plan.PARALLELISMS (None: a record from before the axis, ddp)
    activation_checkpointing: Optional[str] = None  # "none" | "blocks"
    optimizer: Optional[str] = None  # the optim group: "sgd" | "adamw" | "custom"
    compiled: Optional[bool] = None  # train.compile
    error: Optional[str] = None
    # "nonfinite" | "spike" | "chance" (status "diverged")
    diverged_reason: Optional[str] = recorded_as("divergence_reason")
    diverged_at_step: Optional[int] = None
    val_loss: Optional[float] = None
    val_samples: Optional[int] = None  # validation samples behind val_accuracy
    train_loss: Optional[float] = None  # final train loss
    steps_to_target: Optional[float] = None
    samples_to_target: Optional[float] = None
    time_to_target_seconds: Optional[float] = None
    reached_target: Optional[bool] = None
    gns_b_simple: Optional[float] = None
    gns_b_simple_train_avg: Optional[float] = None
    num_classes: Optional[int] = None  # the labels' count: chance is 1 / num_classes (None: unknown)
    # A language model's: tokens/s, the validation loss's standard error over its sequences, the loss in
    # bits per byte (byte-level data), the training stream's unigram entropy (bits per token: what
    # learning only the token frequencies reaches) and its context length.
    tokens_per_second: Optional[float] = None
    val_loss_se: Optional[float] = None
    val_bits_per_byte: Optional[float] = None
    train_unigram_entropy_bits: Optional[float] = None
    context: Optional[int] = None
    memory_activations_bytes: Optional[float] = None  # the micro-batch's activations at the peak
    # How accumulation reduced, as the worker did it (final | every | none: param gradient_sync), the peak per
    # worker measure.sharded_memory predicted (a skipped point's too), the bytes a worker sent per step.
    gradient_sync: Optional[str] = None
    memory_predicted_bytes: Optional[float] = None
    communication_bytes_per_step: Optional[float] = None
    # What the run's figures and the throughput model read (report/projection.py): a step's seconds waiting for
    # data (and the share of the step, where a point records it), the worker's own parameter bytes (its shard
    # under ZeRO), (its bytes moved per step: communication_bytes_per_step above), evaluations and a checkpoint's cost.
    data_seconds_per_step: Optional[float] = None
    data_wait_fraction: Optional[float] = None
    memory_parameters_bytes: Optional[float] = None
    evaluations: Optional[int] = None
    eval_seconds: Optional[float] = None
    checkpoint_write_seconds: Optional[float] = None
    # eval.metrics_fn's metrics: (name, value, its bootstrap standard error or None, higher is better) each
    val_metrics: Tuple[Tuple[str, float, Optional[float], bool], ...] = ()
    eval_error: Optional[str] = None  # why it has no validation figures (its evaluation ran out of memory)

    def metric(self, name: str) -> Optional[Tuple[float, Optional[float], bool]]:
        """(value, standard error, higher is better) of eval.metrics_fn's metric `name`; None when unrecorded."""
        return next(((v, se, up) for n, v, se, up in self.val_metrics if n == name), None)

    @property
    def activation_bytes_per_token(self) -> Optional[float]:
        """A language model's activation memory per token of its micro-batch (what a longer context or
        a larger micro-batch costs); None without both figures."""
        if self.context is None or self.memory_activations_bytes is None:
            return None
        return self.memory_activations_bytes / (self.micro_batch_size * self.context)

    @property
    def point(self) -> str:
        """The point this run measures, its seed left out."""
        return self.key if self.point_key is None else self.point_key


@dataclass(frozen=True)
class Recommendation:
    """The answer for one objective; `best` is None when no trial was eligible, and `reason` says why."""

    best: Optional[Trial]  # the point's figures: the mean over its seeds (PointSummary.trial)
    runners_up: List[Trial]  # up to 3, best first
    reason: str  # a few sentences with the measured numbers that decided it
    excluded: Dict[str, str]  # point key -> why it was not eligible
    objective: str
    points: Dict[str, "PointSummary"] = field(default_factory=dict)  # every point, by key
    # Point key -> why it counts as tied with the most accurate point (the data cannot separate them).
    ties: Dict[str, str] = field(default_factory=dict)
    diverged: Dict[str, str] = field(default_factory=dict)  # point key -> how and where it diverged
    level: float = 0.95  # the confidence level of the intervals and the test
    # Point key -> why it is faster but unproven: its gap to the best is neither certified inside
    # report.max_accuracy_drop nor shown beyond it.
    unproven: Dict[str, str] = field(default_factory=dict)
    quality: str = "val_accuracy"  # the metric "better" was judged by (report.quality, resolved)
    # Point key -> its quality gap to the best class (noninferiority.Gap), when a tolerance judged them.
    gaps: Dict[str, Any] = field(default_factory=dict)
    # Point key -> its accuracy class's quality (report/classes.py; the point itself when alone).
    classes: Dict[str, "PointSummary"] = field(default_factory=dict)
    tolerance: Optional[float] = None  # the non-inferiority margin applied, in the quality's units
    top: Optional[str] = None  # the key of the best class's quality (a point's key, or "class gb32-lrx2")



# ---------------------------------------------------------------------------------------------------
# Seed replicates and their intervals

# Best to worst, as sweeper.schema.STATUSES: a point's status is its worst replicate's.
_STATUS_ORDER = ("ok", "stopped", "did_not_learn", "diverged", "oom", "failed")
# Figures a point carries as the mean over its ok replicates; the target figures are the mean over
# the replicates that reached the target.
_MEAN_FIELDS = ("samples_per_second", "val_accuracy", "train_seconds", "samples_seen", "val_loss", "train_loss",
                "gns_b_simple", "gns_b_simple_train_avg", "tokens_per_second", "val_bits_per_byte")
_TARGET_FIELDS = ("steps_to_target", "samples_to_target", "time_to_target_seconds")


@dataclass(frozen=True)
class PointSummary:
    """One point over its seed replicates. `trial` carries the point's figures under the point's key:
    the mean over its ok replicates (throughput, accuracy, losses; the target figures over those that
    reached it), the largest peak memory and window spread, and the worst status of any replicate, so
    a point that diverged, ran out of memory or failed in one seed is not eligible."""

    trial: Trial
    replicates: Tuple[Trial, ...]
    accuracy: Optional[Interval] = None  # accuracy_interval of the replicates
    loss: Optional[Interval] = None  # loss_interval of the replicates

    @property
    def key(self) -> str:
        return self.trial.key

    @property
    def seeds(self) -> List[Optional[int]]:
        return [t.seed for t in self.replicates]

    @property
    def accuracies(self) -> List[float]:
        """val_accuracy of each ok replicate that measured it."""
        return [t.val_accuracy for t in self.replicates if t.status == "ok" and _finite(t.val_accuracy)]

    @property
    def reached(self) -> int:
        """Replicates that ended ok and reached the target (with a time to it)."""
        return sum(1 for t in self.replicates
                   if t.status == "ok" and t.reached_target and _finite(t.time_to_target_seconds))

    @property
    def reached_in_every_seed(self) -> bool:
        return self.reached == len(self.replicates)


def replicates(trials: Iterable[Trial]) -> Dict[str, List[Trial]]:
    """The trials grouped by the point they replicate (`Trial.point`: point_key, else key), points
    and replicates in the order first seen."""
    groups: Dict[str, List[Trial]] = {}
    for trial in trials:
        groups.setdefault(trial.point, []).append(trial)
    return groups


def summarize(members: Sequence[Trial], level: float = 0.95) -> PointSummary:
    """One point's replicates (all with the same `Trial.point`) as a PointSummary. A single replicate
    keeps its own figures exactly (the mean of one value is that value)."""
    members = tuple(members)
    if not members:
        raise ValueError("summarize needs at least one replicate")
    ok = [t for t in members if t.status == "ok"]
    source = ok or list(members)
    worst = max(members, key=_status_rank)
    reached = [t for t in ok if t.reached_target]
    figures = {name: _mean([getattr(t, name) for t in source]) for name in _MEAN_FIELDS}
    figures.update({name: _mean([getattr(t, name) for t in reached]) for name in _TARGET_FIELDS})
    flags = [t.reached_target for t in members]
    stable = [t.throughput_stable for t in source if t.throughput_stable is not None]
    first = source[0]
    trial = replace(
        first, **figures, key=first.point, point_key=first.point, val_metrics=mean_metrics(source),
        seed=first.seed if len(members) == 1 else None,
        status=worst.status, error=worst.error,
        diverged_reason=worst.diverged_reason, diverged_at_step=worst.diverged_at_step,
        samples_per_second_cv=_largest([t.samples_per_second_cv for t in source]),
        peak_memory_bytes=_largest([t.peak_memory_bytes for t in source]),
        throughput_stable=all(stable) if stable else None,
        reached_target=None if all(f is None for f in flags) else all(bool(f) for f in flags),
    )
    return PointSummary(trial, members, accuracy_interval(members, level), loss_interval(members, level))


def summarize_all(trials: Iterable[Trial], level: float = 0.95) -> Dict[str, PointSummary]:
    """Every point of the sweep, by point key, in the order first seen."""
    return {key: summarize(members, level) for key, members in replicates(trials).items()}


def accuracy_interval(trials: Sequence[Trial], level: float = 0.95) -> Optional[Interval]:
    """The confidence interval of one point's val_accuracy: Student t over its ok seed replicates
    when at least two measured it (clipped to [0, 1]), else the Wilson interval of the one ok replicate's validation
    set (needs val_samples). None when neither can be computed."""
    measured = [t for t in trials if t.status == "ok" and _finite(t.val_accuracy)]
    if len(measured) >= 2:
        interval = stats.over_seeds([t.val_accuracy for t in measured], level)
        # An accuracy lies in [0, 1]: a t interval over few seeds can reach past either end.
        return replace(interval, low=max(0.0, interval.low), high=min(1.0, interval.high))
    if len(measured) == 1 and measured[0].val_samples:
        return stats.binomial(measured[0].val_accuracy, measured[0].val_samples, level)
    return None


def loss_interval(trials: Sequence[Trial], level: float = 0.95) -> Optional[Interval]:
    """The t interval of one point's final train loss over its ok seed replicates (at least two);
    one run has no interval for a loss (no binomial stand-in), so None."""
    measured = [t.train_loss for t in trials if t.status == "ok" and _finite(t.train_loss)]
    return stats.over_seeds(measured, level) if len(measured) >= 2 else None


def _finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    finite = [float(v) for v in values if _finite(v)]
    return statistics.fmean(finite) if finite else None


# How eval.metrics_fn's metrics are recorded on a point's run (sweeper/schema.py, Accuracy's named fields).
METRIC_PREFIX, METRIC_SE_PREFIX, DIRECTIONS_TAG = "val_metric/", "val_metric_se/", "sweeper.metric_directions"


def user_metrics(row: Mapping[str, Any]) -> Tuple[Tuple[str, float, Optional[float], bool], ...]:
    """A run's eval.metrics_fn metrics (its metrics and tags by name) as Trial.val_metrics: each recorded
    value with its standard error and direction ("f1=higher"; a metric with no direction recorded is
    taken as higher is better)."""
    directions = dict(pair.split("=", 1) for pair in str(row.get(DIRECTIONS_TAG) or "").split(",") if "=" in pair)
    out = []
    for key, value in row.items():
        if key.startswith(METRIC_PREFIX) and value not in (None, "None", ""):
            name = key[len(METRIC_PREFIX):]
            se = row.get(METRIC_SE_PREFIX + name)
            out.append((name, float(value), None if se in (None, "None", "") else float(se),
                        directions.get(name, "higher") != "lower"))
    return tuple(sorted(out))


def mean_metrics(trials: Sequence[Trial]) -> Tuple[Tuple[str, float, Optional[float], bool], ...]:
    """eval.metrics_fn's metrics as a point's: each the mean over the replicates that recorded it, its SE
    the mean SE (every seed is scored on the same validation samples: no sqrt(seeds) shrinkage)."""
    out = []
    for name in sorted({m[0] for t in trials for m in t.val_metrics}):
        found = [t.metric(name) for t in trials if t.metric(name) is not None and _finite(t.metric(name)[0])]
        if found:
            ses = [se for _, se, _ in found]
            out.append((name, _mean([v for v, _, _ in found]), _mean(ses) if all(_finite(se) for se in ses) else None,
                        found[0][2]))
    return tuple(out)


def _largest(values: Sequence[Optional[float]]) -> Optional[float]:
    finite = [v for v in values if _finite(v)]
    return max(finite) if finite else None


def _status_rank(trial: Trial) -> int:
    return _STATUS_ORDER.index(trial.status) if trial.status in _STATUS_ORDER else len(_STATUS_ORDER)

def seconds_to_train(trial: Trial) -> Optional[float]:
    """Time to train the trial's sample budget. The steady-state rate is preferred over the wall
    clock: `train_seconds` also holds the warm-up steps (one of them memory-tracked, much slower) and
    any profiled steps, which a real training run does not repeat."""
    if trial.samples_seen is not None and trial.samples_per_second:
        return trial.samples_seen / trial.samples_per_second
    return trial.train_seconds
