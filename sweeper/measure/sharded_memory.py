"""Peak memory per worker of a training step under DDP, ZeRO-2 and ZeRO-3 (FSDP2), predicted before launch from
the model's parameter shapes, the layout and the activation bytes per sample. Standard library only (and the
layouts' names from plan.py, itself standard library only).

Where the peak is and what is resident there (FSDP2 in torch 2.14, read from its source and checked against
torch's MemTracker per rank in scripts/bench_sharding.py; docs/parallelism.md has the figures): the top of
backward of the last micro-step, when everything forward keeps for backward is alive, and
- every rank's own weights: all of them under DDP, its shards under ZeRO (each parameter's dim 0 padded to a
  multiple of the shard group, as FSDP2 pads it), and the optimizer state of those;
- the gathered (unsharded) weights: none under DDP (it holds them whole anyway); under ZeRO-2 every unit's,
  kept from its forward until its backward (`reshard_after_forward=False`); under ZeRO-3 the root's (never
  resharded after forward) and the last block's, gathered again for backward first;
- across workers, all-gather buffers: under ZeRO-2 the forward's last gather's output (FSDP2 keeps a
  reference to it for overlap until the next gather's copy-out, which ZeRO-2's backward never does); under
  ZeRO-3 the next block's gather in flight (its backward prefetch): its output buffer, the unsharded
  weights being copied out of it, and the backend's staging of this rank's shard (gloo's copy: a shard's
  size). One worker gathers nothing: FSDP2 copies the weights in place;
- gradients held from micro-steps before the last: DDP's accumulated `.grad` (the whole model), the
  *unsharded* gradients FSDP2 accumulates when the reduce is skipped (`set_requires_gradient_sync(False)`:
  the whole model too), or the sharded ones when every micro-step reduces;
- DDP's gradient buckets (one flat copy of the gradients) with more than one worker.
zero1 and hsdp are priced from those (issue 57, below `peak`'s three): zero1 is DDP's peak with the largest
rank's share of the optimizer state (ZeroRedundancyOptimizer's partition by whole tensors), hsdp ZeRO-3's within
a node (its shard group is a node's ranks; the all-reduce across nodes runs on the sharded gradients in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from sweeper.plan import PARALLELISMS

SCALAR_BYTES = 4  # Adam's per-tensor `step`: a float32 scalar on every rank, never sharded


@dataclass(frozen=True)
class Unit:
    """What `fully_shard` groups: a block (or the root: every parameter no block holds), by parameter shape."""

    name: str
    shapes: Tuple[Tuple[int, ...], ...]

    def numel(self, shard_group: int = 1) -> int:
        """Elements of the whole unit, each parameter's dim 0 padded to a multiple of `shard_group`."""
        return sum(_padded(shape, shard_group) for shape in self.shapes)


def _padded(shape: Sequence[int], group: int) -> int:
    rest = math.prod(shape[1:]) if len(shape) > 1 else 1
    first = shape[0] if shape else 1
    return math.ceil(first / group) * group * rest


def units_of(model: Any, blocks: Iterable[Any]) -> List[Unit]:
    """The units of `model` (a torch module, read through `named_parameters`/`parameters` only): each block in
    `blocks` (recipe.blocks: the ones sharding wraps), then the root with every parameter left. A parameter shared
    by two places (a tied head) counts once, where `named_parameters` first names it."""
    owner = {}
    units: List[Unit] = []
    for i, block in enumerate(blocks):
        shapes = []
        for p in block.parameters():
            if id(p) not in owner:
                owner[id(p)] = i
                shapes.append(tuple(p.shape))
        units.append(Unit(f"block{i}", tuple(shapes)))
    root = tuple(tuple(p.shape) for _, p in model.named_parameters() if id(p) not in owner)
    return units + [Unit("root", root)]


@dataclass(frozen=True)
class Prediction:
    """Bytes per worker at the step's peak, by what holds them; `total` is the prediction."""

    parameters_bytes: int  # the rank's own weights: whole (DDP) or its shards
    gathered_bytes: int  # unsharded weights resident at the peak, beyond the rank's own
    gradients_bytes: int  # gradients held across micro-steps before the last
    buckets_bytes: int  # DDP's gradient buckets
    optimizer_state_bytes: int
    activations_bytes: int
    gather_buffers_bytes: int  # an all-gather in flight: output, its copy-out, the backend's staging

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


def peak(units: Sequence[Unit], parallelism: str, workers: int, micro_batch_size: int, accumulation_steps: int,
         activation_bytes_per_sample: float, activation_fixed_bytes: float = 0.0, bytes_per_value: int = 4,
         gather_bytes_per_value: Optional[int] = None, state_values_per_param: int = 2,
         reduce_every_micro_step: bool = False, ranks_per_node: Optional[int] = None) -> Prediction:
    """The peak per worker of one optimizer step at `workers` data-parallel workers (the shard group: FSDP2
    shards over all of them), `micro_batch_size` samples per micro-step and `accumulation_steps` micro-steps.

    `activation_bytes_per_sample` (and `activation_fixed_bytes`): what forward keeps for backward, per sample
    of a micro-batch (the sweep's slope); activations are never sharded. `bytes_per_value`: the weights',
    gradients' and optimizer state's dtype (fp32: 4); `gather_bytes_per_value`: the gathered weights' (bf16
    under MixedPrecisionPolicy: 2; default the same). `state_values_per_param`: AdamW 2 (its moments), SGD with
    momentum 1. `reduce_every_micro_step`: the sharded gradients are reduced at every micro-step instead of
    accumulating unsharded ones (less memory, a reduce-scatter per micro-step). `ranks_per_node`: hsdp's shard
    group (None: every worker on one node, as on a local Ray; the mesh across nodes is known once placed)."""
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism {parallelism!r} is invalid. Should be one of {list(PARALLELISMS)}.")
    if workers < 1 or micro_batch_size < 1 or accumulation_steps < 1:
        raise ValueError(f"workers {workers}, micro-batch {micro_batch_size} and accumulation {accumulation_steps} "
                         "must be at least 1")
    shape = dict(micro_batch_size=micro_batch_size, accumulation_steps=accumulation_steps,
                 activation_bytes_per_sample=activation_bytes_per_sample,
                 activation_fixed_bytes=activation_fixed_bytes, bytes_per_value=bytes_per_value,
                 gather_bytes_per_value=gather_bytes_per_value, state_values_per_param=state_values_per_param,
                 reduce_every_micro_step=reduce_every_micro_step)
    if parallelism == "zero1":
        return _zero1(peak(units, "ddp", workers, **shape), units, workers, bytes_per_value, state_values_per_param)
    if parallelism == "hsdp":
        return peak(units, "zero3", ranks_per_node or workers, **shape)
    gather = gather_bytes_per_value or bytes_per_value
    tensors = sum(len(u.shapes) for u in units)
    whole = sum(u.numel() for u in units) * bytes_per_value
    sharded = parallelism != "ddp"
    group = workers if sharded else 1
    own = sum(u.numel(group) for u in units) // group * bytes_per_value
    blocks = [u for u in units if u.name != "root"]
    root = next((u for u in units if u.name == "root"), Unit("root", ()))
    largest = max(blocks, key=lambda u: u.numel(group), default=Unit("none", ()))
    gathered = buffers = 0
    if parallelism == "zero2":
        gathered = sum(u.numel(group) for u in units) * gather
        if workers > 1:
            buffers = largest.numel(group) * gather
    elif parallelism == "zero3":
        gathered = (root.numel(group) + largest.numel(group)) * gather
        if workers > 1 and len(blocks) > 1:
            buffers = (2 * largest.numel(group) + largest.numel(group) // group) * gather
    held = 0
    if accumulation_steps > 1:
        held = own if (sharded and reduce_every_micro_step) else whole
    return Prediction(
        parameters_bytes=own,
        gathered_bytes=gathered,
        gradients_bytes=held,
        buckets_bytes=whole if (parallelism == "ddp" and workers > 1) else 0,
        optimizer_state_bytes=state_values_per_param * own + tensors * SCALAR_BYTES,
        activations_bytes=round(activation_fixed_bytes + activation_bytes_per_sample * micro_batch_size),
        gather_buffers_bytes=buffers,
    )


# zero1 (issue 57): DDP's peak, its optimizer state ZeroRedundancyOptimizer's share on the most loaded rank.

def zero1_shares(units: Sequence[Unit], workers: int) -> List[Tuple[int, int]]:
    """(parameter values, tensors) whose optimizer state each rank holds under ZeroRedundancyOptimizer (torch
    2.14's `_partition_parameters`): whole tensors, the largest first, each to the rank holding the fewest
    values so far (the lowest such rank on a tie)."""
    loads = [[0, 0] for _ in range(workers)]
    for numel in sorted((math.prod(shape) for u in units for shape in u.shapes), reverse=True):
        least = min(range(workers), key=lambda r: loads[r][0])
        loads[least][0] += numel
        loads[least][1] += 1
    return [(values, tensors) for values, tensors in loads]


def _zero1(ddp: Prediction, units: Sequence[Unit], workers: int, bytes_per_value: int,
           state_values_per_param: int) -> Prediction:
    values, tensors = max(zero1_shares(units, workers))
    return replace(ddp, optimizer_state_bytes=state_values_per_param * values * bytes_per_value
                   + tensors * SCALAR_BYTES)


def over_budget(prediction: Prediction, budget_bytes: int, what: str) -> Optional[str]:
    """Why a point is skipped before launch (None: it fits): one line with the prediction and its largest parts."""
    if prediction.total <= budget_bytes:
        return None
    parts = sorted(((getattr(prediction, f.name), f.name.replace("_bytes", "")) for f in fields(prediction)),
                   reverse=True)[:3]
    shown = ", ".join(f"{name} {value / 2 ** 20:.1f}" for value, name in parts)
    return (f"{what}: predicted {prediction.total / 2 ** 20:.1f} MiB per worker ({shown} MiB) is over "
            f"device.memory_budget_gb ({budget_bytes / 2 ** 20:.1f} MiB): skipped, not launched")
