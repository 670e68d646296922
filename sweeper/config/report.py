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
