"""Batch arithmetic, written once: the grid, global batch sizes, LR scaling and the step budget.

Pure functions on plain values (standard library only), so they are tested without processes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence


@dataclass(frozen=True, order=True)
class GridPoint:
    """One trial: `micro_batch_size` samples per worker per forward/backward, `accumulation_steps`
    micro-batches per optimizer step on each of `num_workers` data-parallel workers."""

    micro_batch_size: int
    accumulation_steps: int
    num_workers: int

    @property
    def global_batch_size(self) -> int:
        # Samples behind one optimizer step: every worker accumulates, then gradients are averaged.
        return self.micro_batch_size * self.accumulation_steps * self.num_workers

    @property
    def key(self) -> str:
        """A stable name for the point, used for Ray trial names and to avoid duplicate MLflow runs."""
        return f"mb{self.micro_batch_size}-acc{self.accumulation_steps}-w{self.num_workers}"

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


def expand_grid(
    micro_batch_sizes: Sequence[int],
    accumulation_steps: Sequence[int],
    num_workers: Sequence[int],
    global_batch_sizes: Optional[Iterable[int]] = None,
) -> List[GridPoint]:
    """The product of the three lists (duplicates removed, order kept), optionally filtered to the
    points whose global batch size is one of `global_batch_sizes`."""
    keep = None if global_batch_sizes is None else set(global_batch_sizes)
    points: List[GridPoint] = []
    for micro, accum, workers in itertools.product(
        micro_batch_sizes, accumulation_steps, num_workers
    ):
        point = GridPoint(int(micro), int(accum), int(workers))
        if point in points:
            continue
        if keep is not None and point.global_batch_size not in keep:
            continue
        points.append(point)
    return points


def scaled_lr(lr: float, global_batch_size: int, base_batch_size: int, rule: str) -> float:
    """The learning rate for `global_batch_size` under an LR-scaling rule relative to `base_batch_size`
    (linear: Goyal et al. 2017; sqrt: Krizhevsky 2014 / Hoffer et al. 2017)."""
    ratio = global_batch_size / base_batch_size
    if rule == "none":
        return lr
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    raise ValueError(f"lr_scaling {rule!r} is invalid. Should be one of ('none', 'linear', 'sqrt').")


def optimizer_steps(num_train_samples: int, epochs: int, global_batch_size: int) -> int:
    """Optimizer steps for a budget of `epochs` passes over the training set.

    The training stream is the concatenation of one shuffled permutation per epoch, cut into global
    batches, so every trial sees the same number of samples up to one global batch (not up to one
    global batch per epoch, as a per-epoch drop_last would give).
    """
    return (num_train_samples * epochs) // global_batch_size


def stream_indices(
    permutations: Sequence[Sequence[int]],
    step_begin: int,
    step_end: int,
    point: GridPoint,
    rank: int,
) -> List[int]:
    """Sample indices rank `rank` consumes for optimizer steps [step_begin, step_end), in order.

    Global step k is stream[k*G:(k+1)*G] of the concatenated permutations, cut into micro-batches
    of consecutive samples; micro-batch m*num_workers + r is rank r's micro-step m. Whatever the
    layout, step k covers the same samples, so layouts with the same global batch compute the same
    gradient (up to float summation order). Layouts that also share the micro-batch size put the
    same samples in each micro-batch, so BatchNorm normalizes over the same groups too: (16, 2, 1)
    and (16, 1, 2) then train the same model, not just on the same data.
    """
    g, micro, workers = point.global_batch_size, point.micro_batch_size, point.num_workers
    chained = itertools.chain.from_iterable(permutations)
    stream = [int(i) for i in itertools.islice(chained, step_begin * g, step_end * g)]
    out: List[int] = []
    for step in range(0, len(stream), g):
        for micro_step in range(point.accumulation_steps):
            first = step + (micro_step * workers + rank) * micro
            out.extend(stream[first : first + micro])
    return out


def worker_groups(points: Sequence[GridPoint], points_per_group: Optional[int] = None) -> List[List[GridPoint]]:
    """The points cut into groups of at most `points_per_group` (None: one group), each measured in
    one Ray Train worker group sized to its largest point; a point with fewer workers runs on the
    group's first ranks while the others wait. Points are ordered by worker count (stable), so
    groups are as uniform as they can be. Worker start-up is then paid once per group. Within a
    worker count, smaller micro-batches (then fewer accumulation steps) come first, so a point
    that runs out of memory marks the larger ones after it as out of memory without running them."""
    ordered = sorted(points, key=lambda p: (p.num_workers, p.micro_batch_size, p.accumulation_steps))
    size = points_per_group or max(len(ordered), 1)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]
