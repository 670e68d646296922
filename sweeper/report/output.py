"""The answer as output: the Hydra override line that trains the recommended point, and the YAML
report (recommendation.yaml). Pure (stdlib, PyYAML)."""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import yaml

from sweeper.report import classes, elastic, headline, parallelism
from sweeper.report.lr import lr_table
from sweeper.report.quality import judged_by, resolve
from sweeper.config.report import LR_SCALING_RULES, invalid_choice
from sweeper.stats import Interval
from sweeper.report.trials import PointSummary, Recommendation, Trial, seconds_to_train


def override_line(best: Trial, lr_scaling: Optional[str] = None) -> str:
    """Hydra overrides that train `best`'s configuration, to append to the sweep's own command line:
    the layout (its parallelism when sharded), the recipe it recorded (precision, activation checkpointing,
    optimizer group, `train.compile=true` when compiled) and its LR.

    `optim.lr` and `sweep.lr_multipliers=[m]` together give the LR the trial trained with: the LR
    already scaled by the sweep's `lr_scaling` rule for its global batch, divided by the multiplier
    m the sweep put on top (so the multiplier chosen is named), to 4 significant figures. Scaling it
    again would change it, so unless the sweep's rule is known to be "none" (`lr_scaling`; None:
    unknown) the line also sets `train.lr_scaling=none`. The LR is left out when the trial did not record one.
    """
    problem = None if lr_scaling is None else invalid_choice("lr_scaling", lr_scaling, LR_SCALING_RULES)
    if problem:
        raise ValueError(problem)
    parts = [
        f"sweep.micro_batch_sizes=[{best.micro_batch_size}]",
        f"sweep.accumulation_steps=[{best.accumulation_steps}]",
        f"sweep.num_workers=[{best.num_workers}]",
    ]
    if parallelism.of(best) != parallelism.DEFAULT:  # ddp is the default: the headline stays within its 3 lines
        parts.append(f"sweep.parallelism=[{parallelism.of(best)}]")
    if best.gradient_sync == "every":  # final is the default, as the worker did it (param gradient_sync)
        parts.append("sweep.gradient_sync=[every]")
    if best.precision is not None:
        parts.append(f"sweep.precisions=[{best.precision}]")
    if best.activation_checkpointing is not None:
        parts.append(f"sweep.activation_checkpointing=[{best.activation_checkpointing}]")
    if best.compiled:
        parts.append("train.compile=true")
    if best.optimizer is not None:
        parts.append(f"optim={best.optimizer}")
    if best.lr is not None:
        base = _lr_before_multiplier(float(best.lr), best.lr_multiplier)
        # 4 significant figures: readable, and closer than any LR sweep resolves.
        parts.append(f"optim.lr={base:.4g}")
        if lr_scaling != "none":
            parts.append("train.lr_scaling=none")
    if best.lr_multiplier is not None:
        parts.append(f"sweep.lr_multipliers=[{float(best.lr_multiplier)!r}]")
    return " ".join(parts)


def _lr_before_multiplier(lr: float, multiplier: Optional[float]) -> float:
    """The optim.lr that the multiplier turns into `lr` exactly (lr / m, or a neighbouring float when
    rounding puts lr / m * m one ulp off)."""
    if multiplier is None or multiplier == 1.0 or not multiplier > 0:
        return lr
    base = lr / multiplier
    for candidate in (base, math.nextafter(base, math.inf), math.nextafter(base, -math.inf)):
        if candidate * multiplier == lr:
            return candidate
    return base


def _figures(trial: Trial) -> Dict[str, object]:
    # Plain Python types only: figures read back from MLflow or numpy would make safe_dump fail.
    return {
        "key": trial.key,
        "samples_per_second": _num(trial.samples_per_second),
        "samples_per_second_cv": _num(trial.samples_per_second_cv),
        "throughput_stable": None if trial.throughput_stable is None else bool(trial.throughput_stable),
        "throughput_emulated": trial.throughput_emulated,
        "peak_memory_bytes": _byte_count(trial.peak_memory_bytes),
        "val_accuracy": _num(trial.val_accuracy),
        "seconds_to_train": _num(seconds_to_train(trial)),
        # A language model's: tokens/s and the losses (nats per token; bits per byte for byte-level text).
        **({} if trial.tokens_per_second is None else {
            "tokens_per_second": _num(trial.tokens_per_second), "val_loss": _num(trial.val_loss),
            "val_bits_per_byte": _num(trial.val_bits_per_byte), "context": trial.context,
            "tokens_per_step": None if trial.context is None else int(trial.global_batch_size * trial.context),
            "activation_bytes_per_token": _num(trial.activation_bytes_per_token)}),
    }


def _point_figures(point: PointSummary, quality: str = "val_accuracy", level: float = 0.95) -> Dict[str, object]:
    """A point's seeds, statuses and intervals (the quality's too when it is not accuracy), and its
    target figures when it has them."""
    out: Dict[str, object] = {
        "seeds": [None if s is None else int(s) for s in point.seeds],
        "statuses": [t.status for t in point.replicates],
        "accuracy_interval": _interval(point.accuracy),
        "train_loss_interval": _interval(point.loss),
    }
    if quality != "val_accuracy":
        out["quality_interval"] = _interval(resolve(quality, point.replicates).interval(point, level))
    t = point.trial
    if t.reached_target is not None:
        out.update(reached_target_seeds=point.reached, time_to_target_seconds=_num(t.time_to_target_seconds),
                   samples_to_target=_num(t.samples_to_target), steps_to_target=_num(t.steps_to_target))
    return out


def _interval(interval: Optional[Interval]) -> Optional[Dict[str, object]]:
    if interval is None:
        return None
    return {"mean": float(interval.mean), "low": float(interval.low), "high": float(interval.high),
            "n": int(interval.n), "sd": _num(interval.sd), "how": interval.how}


def _num(value: Optional[float]) -> Optional[float]:
    return None if value is None else float(value)


def _byte_count(value: Optional[float]) -> Optional[float]:
    # Whole bytes read back as an int (2147483648, not 2147483648.0), as a person would write them.
    if value is None:
        return None
    return int(value) if float(value).is_integer() else float(value)


def _chosen(rec: Recommendation) -> Dict[str, object]:
    best = rec.best
    chosen: Dict[str, object] = {
        "key": best.key,
        "micro_batch_size": int(best.micro_batch_size),
        "accumulation_steps": int(best.accumulation_steps),
        "num_workers": int(best.num_workers),
        "parallelism": parallelism.of(best),  # absent from a record before the axis: its key's, else ddp
        "gradient_sync": best.gradient_sync or "final",  # as the worker did it; absent before the axis: final
        "global_batch_size": int(best.global_batch_size),
        "lr": _num(best.lr),
        "lr_multiplier": _num(best.lr_multiplier),
        "precision": best.precision,
        "activation_checkpointing": best.activation_checkpointing,
        "optimizer": best.optimizer,
        "compiled": None if best.compiled is None else bool(best.compiled),
    }
    chosen.update(_figures(best))
    if best.key in rec.points:
        chosen.update(_point_figures(rec.points[best.key], rec.quality, rec.level))
    chosen["overrides"] = override_line(best)
    return chosen


def _lr_rows(rec: Recommendation) -> List[Dict[str, object]]:
    rows = lr_table([t for p in rec.points.values() for t in p.replicates], quality=judged_by(rec)).values()
    return [{"global_batch_size": int(r.global_batch_size), "multipliers": [float(m) for m in r.multipliers],
             "metric": r.metric, "best_multiplier": _num(r.best_multiplier), "best_value": _num(r.best_value),
             "largest_stable_multiplier": _num(r.largest_stable),
             "diverged_multipliers": [float(m) for m in r.diverged]}
            for r in rows]


def recommendation_yaml(
    rec: Recommendation,
    objective: Optional[str] = None,
    min_accuracy: Optional[float] = None,
    memory_budget_bytes: Optional[float] = None,
    max_accuracy_drop: Optional[float] = None,
    max_loss_rise: Optional[float] = None,
    extra: Optional[Dict[str, object]] = None,
    elastic_predict: Optional[elastic.Predictor] = None,
) -> str:
    """A small YAML report of `rec`: the objective and constraints, the confidence level, the chosen
    configuration with its measured figures (means over seeds), seeds and intervals and a Hydra
    override line, the reason, the runners-up, the excluded points, the ties (certified within the tie
    floor), the diverged points, every point's intervals, the LR table (`lr_table`), the accuracy classes
    of two or more layouts and the console's table of alternatives; when the recommended recipe was
    measured at more than one worker count, its elastic plan (report.elastic). With no
    eligible point, `recommendation: null` and the reason. `objective` defaults to `rec.objective`
    and must agree with it. `extra`: blocks appended as given (report/projection_sections.yaml_blocks: the run,
    the sweep's cost, the throughput model, goodput, report.target_workers); `elastic_predict`: the elastic plan's
    predicted rows from the throughput model."""
    objective = rec.objective if objective is None else objective
    if objective != rec.objective:
        raise ValueError(f"objective {objective!r} does not match the recommendation's {rec.objective!r}")
    doc: Dict[str, object] = {
        "objective": objective,
        "constraints": {
            "min_accuracy": _num(min_accuracy),
            "memory_budget_bytes": _byte_count(memory_budget_bytes),
            # The quality's own margin: report.max_accuracy_drop for accuracy, report.max_loss_rise for a loss.
            **({"max_accuracy_drop": _num(max_accuracy_drop)} if judged_by(rec).tolerance_key.endswith("drop")
               else {"max_loss_rise": _num(max_loss_rise)}),
        },
        "quality": rec.quality,
        "confidence_level": float(rec.level),
        "recommendation": None if rec.best is None else _chosen(rec),
        "reason": rec.reason,
        "runners_up": [_figures(t) for t in rec.runners_up],
        "excluded": dict(rec.excluded),
        "ties": dict(rec.ties),
        "unproven": dict(rec.unproven),
        "diverged": dict(rec.diverged),
        "points": {key: _point_figures(p, rec.quality, rec.level) for key, p in rec.points.items()},
        "lr_table": _lr_rows(rec),
        # Layouts that train the same model: one quality per seed, judged once (report/classes.py).
        "accuracy_classes": {name: members for name, members in classes.shared(rec.classes)},
        "alternatives": headline.alternatives(rec),
    }
    # Ray Train's elastic run: the layout that keeps this global batch at each worker count measured.
    resize = None if rec.best is None else elastic.plan([p.trial for p in rec.points.values()], rec.best,
                                                        memory_budget_bytes, elastic_predict)
    if resize is not None:
        doc["elastic_plan"] = resize
    doc.update(extra or {})
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)
