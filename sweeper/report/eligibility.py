"""Which points may be recommended at all, and why the others may not: a status other than ok, not learned
(a classifier's validation hits not separated from chance, a language model's loss not below its
training stream's unigram entropy), the objective's figure missing, over the memory budget, under
report.min_accuracy; and, when none is left, the reason naming the constraint to relax. Pure (stdlib;
scipy.stats via sweeper.stats)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Callable, Dict, List, Optional, Tuple, Union

from sweeper import stats
from sweeper.report.quality import LOSS
from sweeper.report.trials import PointSummary, Trial, _finite, seconds_to_train

MAX_LISTED = 3
METRIC_NAMES = {
    "throughput": "samples_per_second",
    "accuracy": "the quality metric (report.quality)",
    "time_to_accuracy": "training time (samples_seen and samples_per_second, or train_seconds)",
    "time_to_target": "time_to_target_seconds",
}
# What to change when points diverge (Goyal et al. 2017: warmup; sqrt scaling grows the LR slower).
TRY_INSTEAD = ("try a lower LR (a lower optim.lr, or sweep.lr_multipliers below 1, e.g. [0.25,0.5]), "
               "a warmup (train.warmup_steps), or another train.lr_scaling rule (sqrt grows the LR "
               "more slowly than linear)")
OTHER_OPTIMIZER = {"sgd": "optim=adamw", "adamw": "optim=sgd"}
# sweep.strategy=branch's quality rule: no point above this global batch, and why (a sentence, or what the
# branches said of a global batch: report/branched.limit)
BatchLimit = Tuple[int, Union[str, Callable[[int], str]]]


def did_not_learn_try(optimizer: Optional[str]) -> str:
    """What to change when a point learned nothing: never the optimizer it already used."""
    other = OTHER_OPTIMIZER.get(optimizer or "")
    return ("try a lower or higher LR, another optimizer" + (f" ({other})" if other else "")
            + ", more epochs (train.epochs)")


def has_metric(trial: Trial, objective: str, metric: str = "val_accuracy") -> bool:
    """Whether `trial` measured what `objective` ranks by (`metric`: the quality, for objective accuracy)."""
    if objective == "throughput":
        return trial.samples_per_second is not None
    if objective == "accuracy":
        return _finite(getattr(trial, metric, None)) or _finite((trial.metric(metric) or (None,))[0])
    if objective == "time_to_target":
        return trial.time_to_target_seconds is not None
    return seconds_to_train(trial) is not None


def missing_metric(point: PointSummary, objective: str, metric: str = "val_accuracy") -> str:
    if objective == "time_to_target":
        n = len(point.replicates)
        if any(t.reached_target is False for t in point.replicates):
            return f"did not reach the target in any of its {n} seed{'s' if n > 1 else ''}"
        return "no time_to_target_seconds (set eval.target_accuracy or eval.target_loss for the sweep)"
    failed = next((t.eval_error for t in point.replicates if t.eval_error), None)
    if objective == "accuracy" and failed:
        return f"no {metric}: its evaluation ran out of memory ({failed})"
    return f"no {metric if objective == 'accuracy' else METRIC_NAMES[objective]}"


def over_budget(trial: Trial, memory_budget_bytes: Optional[float]) -> Optional[str]:
    if memory_budget_bytes is None:
        return None
    if trial.peak_memory_bytes is None:
        # An unmeasured trial cannot be shown to fit, and recommending it could OOM the real run.
        return f"no peak_memory_bytes to check against {budget_text(memory_budget_bytes)}"
    if trial.peak_memory_bytes > memory_budget_bytes:
        return f"peak_memory_bytes {bytes_text(trial.peak_memory_bytes)} over {budget_text(memory_budget_bytes)}"
    return None


def under_accuracy(trial: Trial, min_accuracy: Optional[float]) -> Optional[str]:
    if min_accuracy is None:
        return None
    if trial.val_accuracy is None:
        return f"no val_accuracy to check against report.min_accuracy={min_accuracy:g}"
    if trial.val_accuracy < min_accuracy:
        return f"val_accuracy {trial.val_accuracy:.3f} under report.min_accuracy={min_accuracy:g}"
    return None


def eligible(points: List[PointSummary], objective: str, min_accuracy: Optional[float],
             memory_budget_bytes: Optional[float], level: float = 0.95, metric: str = "val_accuracy",
             batch_limit: Optional[BatchLimit] = None) -> Tuple[List[PointSummary], Dict[str, str]]:
    """(eligible points, point key -> why not) before the quality guard. `batch_limit` (a global batch, why):
    a larger global batch is not eligible (sweep.strategy=branch's quality rule)."""
    excluded: Dict[str, str] = {}
    kept: List[PointSummary] = []
    for point in points:
        trial = point.trial
        if trial.status != "ok":
            excluded[point.key] = not_ok_text(point)
            continue
        if not_learned(point, level):
            excluded[point.key] = chance_text(point)
            continue
        problems = [] if has_metric(trial, objective, metric) else [missing_metric(point, objective, metric)]
        problems += [p for p in (over_budget(trial, memory_budget_bytes), under_accuracy(trial, min_accuracy)) if p]
        if batch_limit is not None and trial.global_batch_size > batch_limit[0]:
            why = batch_limit[1]  # a sentence, or what the branches said of this global batch
            problems.append(why(trial.global_batch_size) if callable(why) else why)
        if problems:
            excluded[point.key] = "; ".join(problems)
        else:
            kept.append(point)
    return kept, excluded


# ---------------------------------------------------------------------------------------------------
# Learned at all


def not_learned(point: PointSummary, level: float) -> bool:
    """An ok point that learned nothing a guess would not, shown at `level` (one-sided): a language model's
    validation loss (nats per token) not below its training stream's unigram entropy, a classifier's
    validation accuracy not above chance (1 / num_classes). With one seed, by its own validation set (the
    loss's standard error; the exact binomial test of its hits); with several, by the spread over the seeds
    as well (Student t of their values): every seed is scored on the same validation set, so their hits
    are never pooled as independent draws (issue 46). False when what the rule needs is unrecorded."""
    tokens = _loss_against_unigram(point)
    if tokens is not None:
        loss, se, entropy = tokens
        z = stats.z_score(level)
        return not (loss + z * se < entropy and _spread_bound(LOSS.values(point), level, upper=True) < entropy)
    classes = point.trial.num_classes
    measured = [t for t in point.replicates if t.status == "ok" and _finite(t.val_accuracy)]
    if not classes or classes < 2 or not measured or any(not t.val_samples for t in measured):
        return False
    chance, accuracies = 1.0 / classes, [t.val_accuracy for t in measured]
    one_set = min(int(t.val_samples) for t in measured)  # the seeds' mean accuracy, on one validation set
    hits_on_one = int(round(statistics.fmean(accuracies) * one_set))
    return not (stats.above_chance(hits_on_one, one_set, chance, level)
                and _spread_bound(accuracies, level, upper=False) > chance)


def _spread_bound(values: List[float], level: float, upper: bool) -> float:
    """The one-sided bound at `level` of the mean of `values` (one per seed) from their spread: Student t;
    with one value, the value itself (its own validation set's test is the caller's)."""
    if len(values) < 2:
        return values[0] if values else math.nan
    interval = stats.over_seeds(values, 2.0 * level - 1.0)  # each bound of a two-sided 2l-1 is one-sided at l
    return interval.high if upper else interval.low


def _loss_against_unigram(point: PointSummary) -> Optional[Tuple[float, float, float]]:
    """(mean validation loss, its standard error, the unigram entropy), all in nats per token, over the
    point's ok seeds; None when the point is not a language model or lacks a figure."""
    # A point the worker already found did_not_learn is judged by the same figures, and named by them.
    judged = ("ok", "did_not_learn")
    runs = [t for t in point.replicates if t.status in judged]
    if not runs or any(t.train_unigram_entropy_bits is None or not _finite(t.val_loss) or not _finite(t.val_loss_se)
                       for t in runs):
        return None
    loss, se = LOSS.pooled_over(point, judged)  # the seeds' mean loss and mean SE (one validation set behind them)
    return loss, se, runs[0].train_unigram_entropy_bits * math.log(2)


def chance_text(point: PointSummary) -> str:
    tokens = _loss_against_unigram(point)
    if tokens is not None:
        loss, _, entropy = tokens
        return (f"did not learn (val loss {loss:.3f} nats per token is not below the training stream's unigram "
                f"entropy {entropy:.3f} nats, the loss of a unigram guess, by more than its noise): "
                f"{did_not_learn_try(point.trial.optimizer)}")
    accuracy = "-" if point.trial.val_accuracy is None else f"{point.trial.val_accuracy:.3f}"
    classes = point.trial.num_classes
    chance = f"1/{classes}" if classes else "1/classes"
    return f"did not learn (val accuracy {accuracy} at chance {chance}): {did_not_learn_try(point.trial.optimizer)}"


# ---------------------------------------------------------------------------------------------------
# Not ok


def not_ok_text(point: PointSummary) -> str:
    if point.trial.status == "diverged":
        return diverged_text(point)
    if point.trial.status == "did_not_learn":
        return chance_text(point)
    status, members = point.trial.status, point.replicates
    worst = [t for t in members if t.status == status]
    why = " (sweep.strategy=smart stopped its accuracy class early: see its sweeper.stopped tag)" \
        if status == "stopped" else ""
    if len(worst) == len(members):
        return f"status {status}{why}"
    seeds = ", ".join(f"s{t.seed}" for t in worst if t.seed is not None)
    return (f"status {status} in {len(worst)} of {len(members)} seeds{f' ({seeds})' if seeds else ''}{why}: "
            "a point is eligible only when every seed ended ok")


def diverged_text(point: PointSummary) -> str:
    """'diverged (nonfinite at step 12) at lr 0.8', or which seeds diverged when not all did."""
    bad = [t for t in point.replicates if t.status == "diverged"]
    several = len(point.replicates) > 1
    what = ", ".join(
        (t.diverged_reason or "unknown reason")
        + ("" if t.diverged_at_step is None else f" at step {t.diverged_at_step}")
        + (f" in seed {t.seed}" if several and t.seed is not None else "")
        for t in bad
    )
    lr = "" if point.trial.lr is None else f" at lr {point.trial.lr:.4g}"
    if len(bad) < len(point.replicates):
        return (f"diverged in {len(bad)} of {len(point.replicates)} seeds ({what}){lr}: a layout that diverges "
                "in some seeds is not eligible")
    return f"diverged ({what}){lr}"


def diverged_note(diverged: Dict[str, str]) -> str:
    shown = list(diverged.items())[:MAX_LISTED]
    listed = "; ".join(f"{key} {text}" for key, text in shown)
    more = f"; and {len(diverged) - len(shown)} more" if len(diverged) > len(shown) else ""
    return f"Not eligible because they diverged: {listed}{more}. To train at such a batch, {TRY_INSTEAD}."


# ---------------------------------------------------------------------------------------------------
# When nothing is eligible


def nobody_reason(points: List[PointSummary], objective: str, min_accuracy: Optional[float],
                  memory_budget_bytes: Optional[float], level: float = 0.95, metric: str = "val_accuracy") -> str:
    # The constraints are applied in a fixed order; the reason names the one that removed the last
    # candidates, with the closest miss, since that is the constraint a user would relax.
    if not points:
        return "no points to choose from"
    ok = [p.trial for p in points if p.trial.status == "ok" and not not_learned(p, level)]
    if not ok:
        return _nothing_ok_reason(points, level)
    measured = [t for t in ok if has_metric(t, objective, metric)]
    if not measured:
        hint = {"accuracy": " (synthetic data has none)",
                "time_to_target": " (set eval.target_accuracy or eval.target_loss; or no point reached it)"}
        what = metric if objective == "accuracy" else METRIC_NAMES[objective]
        return f"no ok point has {what}{hint.get(objective, '')}"
    fitting = [t for t in measured if over_budget(t, memory_budget_bytes) is None]
    if not fitting:
        with_memory = [t for t in measured if t.peak_memory_bytes is not None]
        if not with_memory:
            return f"no ok point has a peak_memory_bytes to check against {budget_text(memory_budget_bytes)}"
        smallest = min(with_memory, key=lambda t: (t.peak_memory_bytes, t.key))
        return (f"no ok point fits {budget_text(memory_budget_bytes)}: "
                f"the smallest peak was {bytes_text(smallest.peak_memory_bytes)} ({smallest.key})")
    within = " within report.memory_budget_gb" if memory_budget_bytes is not None else ""
    with_accuracy = [t for t in fitting if t.val_accuracy is not None]
    if not with_accuracy:
        return f"no ok point{within} has a val_accuracy to check against report.min_accuracy={min_accuracy:g}"
    closest = max(with_accuracy, key=lambda t: (t.val_accuracy, t.key))
    return (f"no ok point{within} reached report.min_accuracy={min_accuracy:g} "
            f"(best was {closest.val_accuracy:.3f}, {closest.key})")


def _nothing_ok_reason(points: List[PointSummary], level: float = 0.95) -> str:
    counts = Counter("did_not_learn" if p.trial.status == "ok" and not_learned(p, level) else p.trial.status
                     for p in points)
    if "did_not_learn" in counts and set(counts) <= {"did_not_learn", "diverged"}:
        listed = _listed(points, lambda p: diverged_text(p) if p.trial.status == "diverged" else chance_text(p))
        what = ("every point did not learn" if set(counts) == {"did_not_learn"}
                else f"no point learned ({counts['did_not_learn']} did not learn, {counts['diverged']} diverged)")
        return f"{what}, so there is nothing to recommend: {listed}"
    if set(counts) == {"diverged"}:
        return (f"every point diverged ({len(points)} of {len(points)}), so there is nothing to recommend: "
                f"{_listed(points, diverged_text)}. {TRY_INSTEAD[:1].upper() + TRY_INSTEAD[1:]}")
    listed = ", ".join(f"{count} {status}" for status, count in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
    return f"no point finished ok: {listed}"


def _listed(points: List[PointSummary], text: Callable[[PointSummary], str]) -> str:
    """The first MAX_LISTED points with what happened to them, and how many more."""
    shown = "; ".join(f"{p.key} {text(p)}" for p in points[:MAX_LISTED])
    return shown + (f"; and {len(points) - MAX_LISTED} more" if len(points) > MAX_LISTED else "")


def budget_text(memory_budget_bytes: float) -> str:
    # The key's own value so it can be copied back, then the size in bytes' units.
    return f"report.memory_budget_gb={memory_budget_bytes / 2**30:g} ({bytes_text(memory_budget_bytes)})"


def bytes_text(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
