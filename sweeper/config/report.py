"""The report's settings (what the recommendation optimizes, under which limits) and their one set of
rules, shared by the sweep's config, `recommend()` and `python -m sweeper.report`. Standard library only:
the report and its analysis run without Hydra."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

OBJECTIVES = ("throughput", "accuracy", "time_to_accuracy", "time_to_target")
# report.quality: the metric every quality rule judges (sweeper.report.quality.QUALITIES, or auto).
QUALITY_CHOICES = ("auto", "val_accuracy", "val_loss", "val_bits_per_byte")
# How train.lr moves with the global batch (sweeper.plan.scaled_lr); the report pins the LR it used.
LR_SCALING_RULES = ("none", "linear", "sqrt")


@dataclass
class ReportConfig:
    # What "best" means: throughput | accuracy | time_to_accuracy (the time to train the sample budget
    # among points reaching min_accuracy, which it needs) | time_to_target (the mean time over seeds to
    # reach the sweep's eval.target_accuracy or eval.target_loss, evaluation on the clock).
    objective: str = "throughput"
    # Trials under this validation accuracy are not recommended (null: no minimum).
    min_accuracy: Optional[float] = None
    # Objectives throughput and time_to_accuracy: a point faster than the most accurate one is
    # recommended only when the data certify it not worse: the one-sided lower confidence bound (at
    # `confidence`) of its accuracy gap to the best lies above -max_accuracy_drop (a paired t interval
    # over shared seeds; with one seed, Newcombe's interval of the validation hits). Shown worse:
    # excluded; neither: unproven, never recommended (a fraction: 0.02 is 2 points; null: the objective
    # alone decides). time_to_target needs no guard: reaching the target is the accuracy criterion.
    max_accuracy_drop: Optional[float] = 0.02
    # Trials whose peak_memory_bytes exceeds this are not recommended (null: no budget).
    memory_budget_gb: Optional[float] = None
    # The knee of a throughput curve: the first micro-batch after which doubling gains less.
    knee_min_gain: float = 0.10
    # The confidence level of every interval and test behind the answer: a point's separation from
    # chance (a point not separated has status did_not_learn), its gap to the best point.
    confidence: float = 0.95
    # What "better" means for every quality rule above: auto (val_bits_per_byte for byte-level text,
    # val_loss for a language model on other tokens, else val_accuracy), or one of those names.
    quality: str = "auto"
    # The non-inferiority margin when the quality is a loss, in its units (bits per byte or nats per token;
    # 0.02 bits is 0.0139 nats): a faster point's loss must be certified no more than this above the best's.
    # report.max_accuracy_drop is the margin for val_accuracy; null: the objective alone decides.
    max_loss_rise: Optional[float] = 0.02
    # The run the answer configures (report/projection.py): the samples it will train (sequences for a language
    # model), or report.run_tokens for a language model (tokens: samples x its context), never both. The headline
    # then gives its wall time, device-hours and price at the recommended layout's measured throughput, with its
    # evaluations and checkpoints at their measured cost and the LR schedule stretched over it (train.samples on
    # the override line), and this sweep's own device-hours as a share of it. null: the sweep's budget only.
    run_samples: Optional[int] = None
    run_tokens: Optional[int] = None
    # Money per device-hour (one GPU, or one CPU worker, for an hour), in your currency: the run's price (null: none).
    price_per_device_hour: Optional[float] = None
    # Worker counts the throughput model predicts up to (the measured ones, powers of two and this; null: the
    # largest measured), each prediction with its measured error.
    max_workers: Optional[int] = None
    # A cluster you do not have: the micro-batch and accumulation that keep the recommended global batch at this
    # many workers, their predicted throughput, memory and time to the run's end (null: none).
    target_workers: Optional[int] = None
    # Judge by this recorded metric instead: the name of one that eval.metrics_fn computes (e.g. f1, its
    # direction the one the metrics class declares), or a built-in quality (val_accuracy, val_loss,
    # val_bits_per_byte). Its margin is report.max_accuracy_drop when higher is better, report.max_loss_rise
    # when lower is. null: report.quality decides (today's choice: val_accuracy, or a language model's loss).
    quality_metric: Optional[str] = None


def invalid_choice(key: str, value: Any, choices: Sequence[str]) -> Optional[str]:
    """The problem with a setting that must be one of `choices`, or None."""
    return None if value in choices else f"{key} {value!r} is invalid. Should be one of {tuple(choices)}."


def check(report: ReportConfig, key: Callable[[str], str] = lambda name: f"report.{name}") -> List[str]:
    """Every problem with the report's settings, each naming the setting by `key(field name)`: the
    sweep's `report.*` by default, `python -m sweeper.report` passes its option names. NaN and
    infinity break every rule (each range below is written so that they fall outside it)."""
    problems = [invalid_choice(key("objective"), report.objective, OBJECTIVES)]
    if report.objective == "time_to_accuracy" and report.min_accuracy is None:
        problems.append(
            f"{key('objective')}=time_to_accuracy needs {key('min_accuracy')} (the accuracy to reach), e.g. "
            f"{key('min_accuracy')}=0.9: accuracy is measured once, after training, so the fastest configuration "
            "is the one that trains its budget soonest among those reaching a target"
        )
    if report.min_accuracy is not None and not 0.0 <= report.min_accuracy <= 1.0:
        percent = f"use e.g. {report.min_accuracy / 100:g} for {report.min_accuracy:g} %" \
            if math.isfinite(report.min_accuracy) else "e.g. 0.9"
        problems.append(
            f"{key('min_accuracy')}={report.min_accuracy} must be a fraction between 0 and 1 (val_accuracy is a "
            f"fraction), or null: {percent}"
        )
    if report.max_accuracy_drop is not None and not 0.0 <= report.max_accuracy_drop <= 1.0:
        problems.append(
            f"{key('max_accuracy_drop')}={report.max_accuracy_drop}: must be between 0 and 1 (0.02 is 2 points "
            "of accuracy), or null to recommend on the objective alone"
        )
    if report.quality not in QUALITY_CHOICES:
        problems.append(invalid_choice(key("quality"), report.quality, QUALITY_CHOICES))
    named = report.quality_metric
    if named is not None and (not isinstance(named, str) or not named.strip()):
        problems.append(f"{key('quality_metric')}={named!r}: give the name of a recorded metric (e.g. f1), or null")
    elif named is not None and report.quality != "auto":
        problems.append(f"{key('quality_metric')}={named} with {key('quality')}={report.quality}: both name what "
                        f"the recommendation judges by; set one of them (the other null or auto)")
    rise = report.max_loss_rise
    if rise is not None and not (math.isfinite(rise) and rise >= 0):
        problems.append(f"{key('max_loss_rise')}={rise}: must be a loss difference >= 0 in the quality's units "
                        "(e.g. 0.02 bits per byte), or null to recommend on the objective alone")
    budget = report.memory_budget_gb
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        problems.append(f"{key('memory_budget_gb')}={budget}: must be a positive number of GiB, or null")
    problems += _run_problems(report, key)
    if not 0.5 <= report.confidence < 1.0:
        problems.append(f"{key('confidence')}={report.confidence}: must be a level in [0.5, 1), e.g. 0.95")
    if not 0.0 < report.knee_min_gain < 1.0:
        problems.append(f"{key('knee_min_gain')}={report.knee_min_gain}: must be between 0 and 1, e.g. 0.1")
    return [p for p in problems if p]


def target_problem(objective: str, target_accuracy: Optional[float], target_loss: Optional[float],
                   key: Callable[[str], str] = lambda name: f"report.{name}") -> Optional[str]:
    """The sweep-side rule of objective time_to_target: points record a time to the target only
    when the sweep sets one (eval.target_accuracy or eval.target_loss)."""
    if objective != "time_to_target" or target_accuracy is not None or target_loss is not None:
        return None
    return (f"{key('objective')}=time_to_target needs a target to time: set eval.target_accuracy (e.g. 0.9) or "
            "eval.target_loss (and eval.every_samples to evaluate during training, not only at its end)")


def _count(value: Any) -> bool:
    """A whole number >= 1 (YAML may hand over 1e6 as a float)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= 1 and float(value).is_integer()


def _run_problems(report: ReportConfig, key: Callable[[str], str]) -> List[str]:
    """The run the answer configures and the clusters it predicts for: whole counts >= 1, a price >= 0, and the
    run given once (in samples or in tokens)."""
    problems = []
    for name, what in (("run_samples", "samples the run will train (sequences for a language model), e.g. 1e6"),
                       ("run_tokens", "tokens a language model's run will train, e.g. 2e9"),
                       ("max_workers", "worker count to predict up to, e.g. 64"),
                       ("target_workers", "worker count of the cluster to answer for, e.g. 64")):
        value = getattr(report, name)
        if value is not None and not _count(value):
            problems.append(f"{key(name)}={value}: must be a whole number >= 1 ({what}), or null")
    if report.run_samples is not None and report.run_tokens is not None:
        problems.append(f"{key('run_samples')} and {key('run_tokens')} are both set: give the run once, in samples "
                        f"or (a language model) in tokens; set the other to null")
    price = report.price_per_device_hour
    if price is not None and not (isinstance(price, (int, float)) and math.isfinite(price) and price >= 0):
        problems.append(f"{key('price_per_device_hour')}={price}: must be a price >= 0 per device-hour, e.g. 2.5, "
                        "or null")
    return problems
