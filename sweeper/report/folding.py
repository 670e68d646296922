"""Seed replicates folded into one mark per point (or per layout and recipe), and the sweep-level
figures built from the points: the critical batch size's observations and the mean B_simple. Pure."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from sweeper.report.critical_batch import CriticalBatch, fit_with_interval
from sweeper.report.trials import Trial, mean_metrics, replicates
from sweeper.schema import STATUSES

# Figures a folded point carries as the mean over its ok replicates.
MEAN_FIELDS = (
    "samples_per_second", "samples_per_second_cv", "peak_memory_bytes", "val_accuracy", "train_seconds",
    "samples_seen", "val_loss", "train_loss", "steps_to_target", "samples_to_target", "time_to_target_seconds",
    "gns_b_simple", "gns_b_simple_train_avg", "tokens_per_second", "val_bits_per_byte",
)
# Of those, the figures a point's layout determines (its seed and LR multiplier do not).
LAYOUT_FIELDS = ("samples_per_second", "samples_per_second_cv", "peak_memory_bytes")
DEFAULT_RECIPE = ("fp32", "none")


def recipe(t: Trial) -> Tuple[str, str]:
    """(precision, activation checkpointing); a record from before recipes trained fp32 without it."""
    return t.precision or DEFAULT_RECIPE[0], t.activation_checkpointing or DEFAULT_RECIPE[1]


def recipe_label(r: Tuple[str, str]) -> str:
    """fp32, bf16, fp32 + ckpt, bf16 + ckpt."""
    return r[0] + ("" if r[1] == "none" else " + ckpt")


def recipe_order(r: Tuple[str, str]) -> Tuple[bool, str, bool]:
    """A sort key: fp32, fp32 + ckpt, then the other precisions, each without checkpointing first."""
    return r[0] != DEFAULT_RECIPE[0], r[0], r[1] != DEFAULT_RECIPE[1]


def multiplier(t: Trial) -> float:
    return 1.0 if t.lr_multiplier is None else float(t.lr_multiplier)


def layout_key(t: Trial) -> str:
    """The point's key without its LR multiplier: the same layout and recipe (throughput and memory
    do not depend on the LR)."""
    return re.sub(r"-lrx[^-]*", "", t.point)


def single_context(trials: Sequence[Trial]) -> Optional[int]:
    """A language model's sequence length when every run trained at one (None: not a language model, or
    several contexts from sweep.context_lengths): what turns a batch in sequences into tokens."""
    contexts = {t.context for t in trials}
    return next(iter(contexts)) if len(contexts) == 1 else None


def mean(values: Sequence[Optional[float]]) -> Optional[float]:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.fmean(finite) if finite else None


def fold(trials: Sequence[Trial], by: Callable[[Trial], str] = lambda t: t.point) -> List[Trial]:
    """One Trial per group (`by`: the point, by default; `layout_key` folds LR multipliers too) in
    the order first seen: its figures the mean over the group's ok replicates, status ok when one
    was ok, else the worst (a diverged point keeps its reason and step). `reached_target` holds
    only when every replicate reached it; `throughput_stable` fails when one was unstable."""
    groups: Dict[str, List[Trial]] = {}
    for t in trials:
        groups.setdefault(by(t), []).append(t)
    return [_fold_one(key, members) for key, members in groups.items()]


def fold_layouts(trials: Sequence[Trial]) -> List[Trial]:
    """One Trial per layout and recipe: seeds and LR multipliers folded (what throughput and memory
    depend on), its LR and multiplier left unset. A point sweep.strategy=smart stopped early counts
    here as measured: its throughput and memory come whole from its layout's own run; only its
    accuracy figures (a rung's) are left out."""
    measured = [_layout_figures_only(t) if t.status == "stopped" else t for t in trials]
    return [replace(t, lr=None, lr_multiplier=None) for t in fold(measured, layout_key)]


def _layout_figures_only(t: Trial) -> Trial:
    return replace(t, status="ok", **{name: None for name in MEAN_FIELDS if name not in LAYOUT_FIELDS},
                   reached_target=None)


def _fold_one(key: str, members: List[Trial]) -> Trial:
    ok = [t for t in members if t.status == "ok"]
    if not ok:
        worst = max(members, key=lambda t: STATUSES.index(t.status) if t.status in STATUSES else len(STATUSES))
        return replace(worst, key=key, point_key=key, seed=None)
    figures = {name: mean([getattr(t, name) for t in ok]) for name in MEAN_FIELDS}
    reached = [t.reached_target for t in members]
    stable = [t.throughput_stable for t in ok if t.throughput_stable is not None]
    return replace(
        ok[0], key=key, point_key=key, seed=None, **figures, val_metrics=mean_metrics(ok),
        reached_target=None if all(r is None for r in reached) else all(bool(r) for r in reached),
        throughput_stable=all(stable) if stable else None,
    )


def spread(trials: Sequence[Trial], name: str) -> Optional[Tuple[float, float, float]]:
    """(mean, lowest, highest) of figure `name` over a point's ok replicates, or None."""
    values = [getattr(t, name) for t in trials if t.status == "ok" and getattr(t, name) is not None
              and math.isfinite(getattr(t, name))]
    return (statistics.fmean(values), min(values), max(values)) if values else None


def target_in_every_seed(members: Sequence[Trial]) -> bool:
    """Every replicate ended ok, reached the target and recorded its steps to it."""
    return bool(members) and all(t.status == "ok" and t.reached_target and t.steps_to_target is not None
                                 for t in members)


def fitted_points(trials: Sequence[Trial]) -> Dict[str, List[Trial]]:
    """The points the critical-batch fit uses, with their replicates: per global batch, the LR
    multiplier whose points reach the target in the fewest steps (mean over seeds, as Shallue et al.
    2019 tune the LR per batch size), and among its points only those that reached the target in
    every seed."""
    reaching = {key: members for key, members in replicates(trials).items() if target_in_every_seed(members)}
    by_batch: Dict[int, Dict[float, Dict[str, List[Trial]]]] = {}
    for key, members in reaching.items():
        first = members[0]
        by_batch.setdefault(first.global_batch_size, {}).setdefault(multiplier(first), {})[key] = members
    def steps(groups: Dict[str, List[Trial]]) -> float:
        return statistics.fmean(statistics.fmean(t.steps_to_target for t in g) for g in groups.values())

    out: Dict[str, List[Trial]] = {}
    for _, by_multiplier in sorted(by_batch.items()):
        out.update(by_multiplier[min(by_multiplier, key=lambda m: (steps(by_multiplier[m]), m))])
    return out


def critical_batch_observations(trials: Sequence[Trial]) -> List[Tuple[float, float]]:
    """(global batch, steps to target) of every replicate of the `fitted_points`. One pair per
    replicate: the fit averages a global batch's pairs (the mean over seeds and layouts), and the
    bootstrap resamples replicates."""
    return [(float(t.global_batch_size), float(t.steps_to_target))
            for members in fitted_points(trials).values() for t in members]


def critical_batch(trials: Sequence[Trial]) -> Optional[CriticalBatch]:
    """The critical batch size fitted to `critical_batch_observations`, with its bootstrap interval;
    None with fewer than two global batches or no diminishing return, or over several contexts (steps
    to a target at one context say nothing of another's: a fit per context is not built)."""
    if len({t.context for t in trials}) > 1:
        return None
    return fit_with_interval(critical_batch_observations(trials))


def no_fit_reason(trials: Sequence[Trial]) -> str:
    """Why `critical_batch` found no fit, in words."""
    if not any(t.steps_to_target is not None for t in trials):
        return "no point recorded steps_to_target (set eval.target_accuracy or eval.target_loss)"
    if len({t.context for t in trials}) > 1:
        return ("the points trained at several contexts (sweep.context_lengths): the fit needs one; sweep one "
                "context to fit its critical batch size")
    batches = {batch for batch, _ in critical_batch_observations(trials)}
    if len(batches) < 2:
        return (f"{len(batches)} global batch size(s) reached the target in every seed: the fit of "
                "S = S_min (1 + B_crit / B) needs two or more")
    return ("no diminishing return measured: the fit of S = S_min (1 + B_crit / B) gave S_min or B_crit <= 0 "
            "(steps fell at least as fast as 1 / B); sweep larger global batches")


def b_simple(trial: Trial) -> Optional[float]:
    """A point's B_simple over its whole training (the ratio of its averages of tr(Sigma) and |G|^2),
    else its final moving ratio. The whole-training figure is the one to set beside a critical batch
    fitted to steps to a target: the final one grows as the loss falls (McCandlish et al. 2018, 4.1)
    and says where training ended, not the path to the target."""
    value = trial.gns_b_simple_train_avg if trial.gns_b_simple_train_avg is not None else trial.gns_b_simple
    return value if value is not None and value > 0 else None


def b_simple_mean(trials: Sequence[Trial]) -> Optional[float]:
    """The mean over ok points (each point's mean over its ok seeds) of their B_simple."""
    return mean([b_simple(p) for p in fold(trials) if p.status == "ok"])


def critical_batch_metrics(found: Optional[CriticalBatch], b_simple: Optional[float]) -> Dict[str, float]:
    """The parent run's sweep-level figures, by MLflow name (those measured)."""
    out: Dict[str, float] = {}
    if found is not None:
        out.update(critical_batch_size=found.critical_batch_size, critical_batch_s_min=found.s_min,
                   critical_batch_e_min=found.e_min, critical_batch_r_squared=found.r_squared,
                   critical_batch_points=float(found.points))
        if found.low is not None:
            out.update(critical_batch_size_low=found.low, critical_batch_size_high=found.high)
    if b_simple is not None:
        out["gns_b_simple_mean"] = b_simple
    return out
