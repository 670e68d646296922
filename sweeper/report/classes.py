"""Quality belongs to the class, speed to the layout: the points of a sweep that train the same model (one
accuracy class, as sweep.strategy=smart's: one global batch, LR multiplier, recipe and context; one
micro-batch too when the model has batch-coupled layers such as BatchNorm) folded into one quality
observation per seed, judged once; and the words saying which layouts share a class and why.
Pure (stdlib; scipy.stats via report.trials)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from sweeper.report.quality import Quality
from sweeper.report.trials import PointSummary, Trial, accuracy_interval

Classes = Dict[str, PointSummary]  # point key -> its class's quality (the point itself when alone)


def class_key(trial: Trial, coupled: bool) -> str:
    """gb32-lrx2 (no batch-coupled layer), gb32-mb16 (batch-coupled), with the recipe and context when not
    the defaults: sweeper.smart.class_key's names, from a record."""
    key = f"gb{trial.global_batch_size}" + (f"-mb{trial.micro_batch_size}" if coupled else "")
    if trial.precision not in (None, "fp32"):
        key += f"-{trial.precision}"
    if trial.activation_checkpointing not in (None, "none"):
        key += "-ckpt"
    multiplier = 1.0 if trial.lr_multiplier is None else float(trial.lr_multiplier)
    if multiplier != 1.0:
        key += f"-lrx{multiplier:g}"
    if trial.context is not None:
        key += f"-ctx{trial.context}"
    return key


def fold_by_seed(by_seed: Dict[Any, List[Trial]], name: str, quality: Quality) -> PointSummary:
    """Runs grouped by seed as one point with one replicate per seed: the mean quality over the seed's runs
    (they trained one model, or are averaged as one observation), the smallest validation set among them
    (one validation set scores them all: never the sum) and the largest standard error."""
    members = []
    for seed, runs in by_seed.items():
        samples = [t.val_samples for t in runs]
        ses = [quality.se(t) for t in runs]
        member = quality.put(runs[0], statistics.fmean(quality.value(t) for t in runs),
                             max(ses) if all(se is not None for se in ses) else None)
        members.append(replace(member, seed=seed, point_key=name, key=f"{name}-s{seed}",
                               val_samples=min(samples) if all(samples) else None))
    mean = statistics.fmean(quality.value(t) for t in members)
    first = quality.put(members[0], mean, quality.se(members[0]))
    summary = PointSummary(replace(first, key=name, point_key=name, seed=None), tuple(members))
    return replace(summary, accuracy=accuracy_interval(members))


def of(points: List[PointSummary], coupled: Optional[bool], quality: Quality) -> Classes:
    """Each point's class quality. `coupled` None (unknown: a record from before the report knew the
    model's layers): every point is its own class. A class of one point is that point."""
    groups: Dict[str, List[PointSummary]] = {}
    for point in points:
        groups.setdefault(point.key if coupled is None else class_key(point.trial, coupled), []).append(point)
    out: Classes = {}
    for key, members in groups.items():
        if len(members) == 1:
            out[members[0].key] = members[0]
            continue
        by_seed: Dict[Any, List[Trial]] = {}
        for point in members:
            for t in point.replicates:
                if t.status == "ok" and quality.value(t) is not None:
                    by_seed.setdefault(t.seed, []).append(t)
        if not by_seed:
            out.update({p.key: p for p in members})
            continue
        folded = fold_by_seed(by_seed, f"class {key}", quality)
        out.update({p.key: folded for p in members})
    return out


def shared(classes: Classes) -> List[Tuple[str, List[str]]]:
    """(class name, its layouts) for every class of two or more points."""
    groups: Dict[str, List[str]] = {}
    for point, folded in classes.items():
        if folded.key != point:
            groups.setdefault(folded.key, []).append(point)
    return sorted(groups.items())


def words(classes: Classes, coupled: Optional[bool]) -> str:
    """Which layouts share a class and why, for the report."""
    groups = shared(classes)
    if coupled is None:
        return ("Every point is judged on its own: the record does not say whether the model has batch-coupled "
                "layers (param batch_coupled_layers), so no two layouts are known to train the same model.")
    if not groups:
        return "No two points train the same model: each is its own accuracy class."
    why = ("the same global batch, micro-batch, LR and recipe: the model has batch-coupled layers, so only layouts "
           "that split the same micro-batches over workers or accumulation steps agree" if coupled else
           "the same global batch, LR and recipe on a model without batch-coupled layers: every step sees the same "
           "samples, so the gradients agree up to float summation order")
    listed = "; ".join(f"{name}: {', '.join(members)}" for name, members in groups)
    return (f"Layouts that train the same model ({why}) are one quality observation per seed, judged once; the "
            f"fastest of the class is the one recommended. {listed}.")
