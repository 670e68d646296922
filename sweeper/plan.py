"""Batch arithmetic, written once: the grid, global batch sizes, LR scaling and the step budget.

Pure functions on plain values (standard library only), so they are tested without processes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple


# The recipe axes' defaults: a point that uses them keeps the key it had before they existed.
DEFAULT_PRECISION, DEFAULT_CHECKPOINTING = "fp32", "none"
# The data-parallel layouts (sweep.parallelism): worker.sharding applies them, measure.sharded_memory prices
# them. The default, DDP: a DDP point keeps the key it had before the axis. zero1 is DDP with the optimizer
# state sharded; hsdp shards within a node and replicates across nodes (its mesh: mesh_by_node).
PARALLELISMS = ("ddp", "zero1", "zero2", "zero3", "hsdp")
DEFAULT_PARALLELISM = "ddp"
# How gradient accumulation reduces (sweep.gradient_sync): `final` skips the reduce until the last micro-step
# (the gradients held unsharded meanwhile), `every` reduces at every micro-step (sharded gradients held, more
# communication). The default: a point at it keeps the key it had before the axis.
GRADIENT_SYNCS = ("final", "every")
DEFAULT_GRADIENT_SYNC = "final"


@dataclass(frozen=True)
class GridPoint:
    """One point: `micro_batch_size` samples per worker per forward/backward, `accumulation_steps`
    micro-batches per optimizer step on each of `num_workers` data-parallel workers, trained in
    `precision` (fp32 | bf16 | fp16 autocast) with activation `checkpointing` (none | blocks), at the
    scaled LR times `lr_multiplier`. `seed`: one replicate of it (None: train.seed, one replicate).
    `parallelism`: how the workers hold the model (ddp | zero1 | zero2 | zero3 | hsdp:
    worker.sharding); `gradient_sync`: how
    accumulation reduces the gradients (final | every: worker.sharding.accumulation_context)."""

    micro_batch_size: int
    accumulation_steps: int
    num_workers: int
    precision: str = DEFAULT_PRECISION
    checkpointing: str = DEFAULT_CHECKPOINTING
    lr_multiplier: float = 1.0
    seed: Optional[int] = None
    context: Optional[int] = None
    # sweep.strategy=branch: a branch run, continued from its trunk's checkpoint at this many samples seen
    # (key -from<samples>); None for every grid point
    branch_from: Optional[int] = None
    parallelism: str = DEFAULT_PARALLELISM
    gradient_sync: str = DEFAULT_GRADIENT_SYNC

    @property
    def global_batch_size(self) -> int:
        # Samples behind one optimizer step: every worker accumulates, then gradients are averaged.
        return self.micro_batch_size * self.accumulation_steps * self.num_workers

    @property
    def key(self) -> str:
        """A stable name for the point, used for Ray trial names and to avoid duplicate MLflow runs:
        mb64-acc2-w1, then -zero1 / -zero2 / -zero3 / -hsdp for a sharded layout, -every for gradient_sync every,
        -bf16 / -ckpt for a recipe other than fp32 without checkpointing, -lrx2 for an LR multiplier other than 1,
        -ctx256 for a context from sweep.context_lengths, -s1 for one seed of several."""
        key = self.point_key
        return key if self.seed is None else f"{key}-s{self.seed}"

    @property
    def point_key(self) -> str:
        """The key its replicates share (tag sweeper.point): every axis but the seed."""
        key = f"mb{self.micro_batch_size}-acc{self.accumulation_steps}-w{self.num_workers}"
        if self.parallelism != DEFAULT_PARALLELISM:
            key += f"-{self.parallelism}"
        if self.gradient_sync != DEFAULT_GRADIENT_SYNC:
            key += f"-{self.gradient_sync}"
        if self.precision != DEFAULT_PRECISION:
            key += f"-{self.precision}"
        if self.checkpointing != DEFAULT_CHECKPOINTING:
            key += "-ckpt"
        if self.lr_multiplier != 1.0:
            key += f"-lrx{self.lr_multiplier:g}"
        if self.context is not None:
            key += f"-ctx{self.context}"
        if self.branch_from is not None:
            key += f"-from{self.branch_from}"
        return key

    @property
    def recipe(self) -> Tuple[str, str]:
        return self.precision, self.checkpointing

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def frontier_label(search: GridPoint) -> str:
    """A frontier search's name, from its template point (micro-batch and accumulation 1): its worker
    count and, beyond fp32 without checkpointing, its recipe: w2, w2-bf16-ckpt."""
    return search.key.split("-", 2)[2]


def gradient_sync(parallelism: str, num_workers: int, accumulation_steps: int, asked: str) -> str:
    """The gradient sync a point runs: `asked`, except where both modes are one and the same (one micro-step
    reduces once either way; one DDP or zero1 worker reduces nothing), which is `final`, so no point is measured
    twice."""
    if accumulation_steps == 1 or (parallelism in (DEFAULT_PARALLELISM, "zero1") and num_workers == 1):
        return DEFAULT_GRADIENT_SYNC
    return asked


def mesh_by_node(rank_nodes: Sequence[str]) -> List[List[int]]:
    """HSDP's mesh from the node each rank runs on (`rank_nodes[r]`: rank r's node): one row per node, in the
    order the nodes first appear, holding that node's ranks in rank order. A row is a shard group (one node's
    ranks, over its fast links), a column a replicate group (one rank per node). Ranks a node holds need not be
    contiguous (Ray Train 2.60 numbers them node by node, but nothing promises it): the mesh follows the nodes,
    not the rank order. ValueError, in one line, when the nodes hold different numbers of ranks: such ranks
    make no (nodes, ranks per node) mesh."""
    rows: Dict[str, List[int]] = {}
    for rank, node in enumerate(rank_nodes):
        rows.setdefault(node, []).append(rank)
    sizes = [len(r) for r in rows.values()]
    if len(set(sizes)) > 1:
        held = ", ".join(f"{n}" for n in sizes)
        raise ValueError(
            f"sweep.parallelism=hsdp at {len(rank_nodes)} workers: its nodes hold {held} ranks, and HSDP's mesh "
            "(nodes, ranks per node) needs the same number on every node; use a worker count the nodes split "
            "evenly (cluster.placement_strategy=PACK fills a node first), or parallelism zero3")
    return list(rows.values())


def expand_grid(
    micro_batch_sizes: Sequence[int],
    accumulation_steps: Sequence[int],
    num_workers: Sequence[int],
    global_batch_sizes: Optional[Iterable[int]] = None,
    precisions: Sequence[str] = (DEFAULT_PRECISION,),
    checkpointing: Sequence[str] = (DEFAULT_CHECKPOINTING,),
    lr_multipliers: Sequence[float] = (1.0,),
    seeds: Optional[Sequence[int]] = None,
    contexts: Optional[Sequence[int]] = None,
    parallelisms: Sequence[str] = (DEFAULT_PARALLELISM,),
    gradient_syncs: Sequence[str] = (DEFAULT_GRADIENT_SYNC,),
) -> List[GridPoint]:
    """The product of the axes (duplicates removed, order kept), optionally filtered to the points
    whose global batch size (in sequences) is one of `global_batch_sizes` (in every recipe and
    context). `seeds` None: one replicate per point (train.seed); else one per seed. `contexts` None:
    the model's own; else one point per context. `gradient_syncs`: per point where the modes differ
    (gradient_sync), else `final` once."""
    keep = None if global_batch_sizes is None else set(global_batch_sizes)
    points: List[GridPoint] = []
    for context, micro, accum, workers, parallelism, sync, precision, ckpt, multiplier, seed in itertools.product(
        contexts if contexts is not None else [None], micro_batch_sizes, accumulation_steps, num_workers,
        parallelisms, gradient_syncs, precisions, checkpointing, lr_multipliers,
        seeds if seeds is not None else [None],
    ):
        point = GridPoint(int(micro), int(accum), int(workers), str(precision), str(ckpt), float(multiplier),
                          None if seed is None else int(seed), None if context is None else int(context),
                          parallelism=str(parallelism),
                          gradient_sync=gradient_sync(str(parallelism), int(workers), int(accum), str(sync)))
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


def sample_budget(num_train_samples: int, epochs: int, samples: Optional[int] = None,
                  context: Optional[int] = None, model_context: Optional[int] = None) -> int:
    """The samples every point trains on: train.samples when set, else epochs x the train set
    (`num_train_samples`, at the point's context). A language model's train.samples counts sequences
    of `model_context`: at another `context` the budget is the same tokens, so contexts compare at
    equal data (train.samples x model_context / context sequences)."""
    if samples is None:
        return num_train_samples * epochs
    if context is None or model_context is None or context == model_context:
        return samples
    return samples * model_context // context


def optimizer_steps(num_train_samples: int, epochs: int, global_batch_size: int) -> int:
    """Optimizer steps for a budget of `epochs` passes over the training set.

    The training stream is the concatenation of one shuffled permutation per epoch, cut into global
    batches, so every trial sees the same number of samples up to one global batch (not up to one
    global batch per epoch, as a per-epoch drop_last would give).
    """
    return (num_train_samples * epochs) // global_batch_size


def rank_runs(step_begin: int, step_end: int, point: GridPoint, rank: int,
              sample_offset: int = 0) -> Iterator[Tuple[int, int]]:
    """(first stream position, length) of each micro-batch rank `rank` consumes for optimizer steps
    [step_begin, step_end), in order, lazily (nothing held per sample).

    The one rule of the sample stream, for a map-style dataset (positions through each epoch's
    permutation: sampler.GlobalBatchSampler) and a streamed one alike (positions read in stream order:
    workloads.streaming): global step k is positions [sample_offset + k*G, sample_offset + (k+1)*G),
    cut into micro-batches of consecutive positions; micro-batch m*num_workers + r is rank r's
    micro-step m. Whatever the layout, step k covers the same samples, so layouts with the same global
    batch compute the same gradient (up to float summation order). Layouts that also share the
    micro-batch size put the same samples in each micro-batch, so BatchNorm normalizes over the same
    groups too: (16, 2, 1) and (16, 1, 2) then train the same model, not just on the same data.
    `sample_offset`: where in the stream step 0 starts (a run continued from a checkpoint at that many
    samples seen, whatever the global batch before it: the stream is a function of sample position, so
    nothing repeats or is skipped)."""
    g, micro, workers = point.global_batch_size, point.micro_batch_size, point.num_workers
    for step in range(step_begin, step_end):
        first = sample_offset + step * g + rank * micro
        for micro_step in range(point.accumulation_steps):
            yield first + micro_step * workers * micro, micro


def stream_indices(
    permutations: Sequence[Sequence[int]],
    step_begin: int,
    step_end: int,
    point: GridPoint,
    rank: int,
    sample_offset: int = 0,
) -> List[int]:
    """Sample indices rank `rank` consumes for optimizer steps [step_begin, step_end), in order, when the
    stream is the concatenated `permutations` (one per epoch): rank_runs' positions looked up in them.
    Positions past the permutations' end are left out."""
    stream = list(itertools.islice(itertools.chain.from_iterable(permutations), sample_offset + step_end *
                                   point.global_batch_size))
    return [int(i) for first, length in rank_runs(step_begin, step_end, point, rank, sample_offset)
            for i in stream[first: first + length]]


def with_gradient_syncs(points: Sequence[GridPoint], syncs: Sequence[str]) -> List[GridPoint]:
    """Each point in every gradient sync of `syncs` where the modes differ (gradient_sync), duplicates removed,
    order kept (the frontier search's grid, built without the axis)."""
    out = [replace(p, gradient_sync=gradient_sync(p.parallelism, p.num_workers, p.accumulation_steps, s))
           for p in points for s in syncs]
    return list(dict.fromkeys(out))


def replicate(points: Sequence[GridPoint], lr_multipliers: Sequence[float] = (1.0,),
              seeds: Optional[Sequence[int]] = None) -> List[GridPoint]:
    """Each point at every LR multiplier and, with `seeds`, once per seed (what the frontier search's
    points leave to cross: memory depends on neither)."""
    return [replace(p, lr_multiplier=float(m), seed=s) for p in points for m in lr_multipliers
            for s in (seeds if seeds is not None else [None])]


def worker_groups(points: Sequence[GridPoint], points_per_group: Optional[int] = None) -> List[List[GridPoint]]:
    """The points cut into groups of at most `points_per_group` (None: one group), each measured in
    one Ray Train worker group sized to its largest point; a point with fewer workers runs on the
    group's first ranks while the others wait. Points are ordered by worker count (stable), so
    groups are as uniform as they can be. Worker start-up is then paid once per group. Within a
    worker count, smaller micro-batches (then fewer accumulation steps) come first, so a point
    that runs out of memory marks the larger ones after it as out of memory without running them."""
    ordered = sorted(points, key=lambda p: (p.num_workers, p.parallelism, p.gradient_sync, p.recipe, p.context or 0,
                                            p.micro_batch_size, p.accumulation_steps, p.lr_multiplier,
                                            -1 if p.seed is None else p.seed))
    size = points_per_group or max(len(ordered), 1)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]
