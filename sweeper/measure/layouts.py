"""What each data-parallel layout (sweep.parallelism) holds at every phase of an optimizer step, and which
collectives it issues: one small class per parallelism, so a new one (ZeRO-1, HSDP) is one more class in
`LAYOUTS`. Pure arithmetic on bytes (standard library only); measure.sharded_memory and measure.communication
turn a model's units and a point into the numbers these read.

Where a term comes from (FSDP2 and DDP in torch 2.14, read from their source and matched per phase against
torch's MemTracker per rank over gloo, scripts/bench_sharding.py; docs/parallelism.md has the figures):
- forward's top: everything forward keeps for backward is alive; the gathered weights of the units forward has
  not freed; FSDP2's last all-gather output (kept for overlap until the next copy-out; two units' worth during
  the last unit's copy-out, before its activations exist: hence max(activations + a unit, two units)).
- backward: at its top, the activations with the first gradients; under ZeRO-3 the last unit gathered again and
  the next one's prefetch; at its end, the gradients (DDP's whole ones, FSDP2's sharded ones) with a unit's
  reduce in flight (its unsharded gradient and the reduce-scatter input, in the reduce dtype).
- the optimizer step: weights, gradients, state and the step's own temporaries (AdamW's foreach
  `exp_avg_sq_sqrt` over every tensor on CUDA, a tensor at a time on the CPU: OptimizerCost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

PHASES = ("forward", "backward", "optimizer")
# A new gradient and its accumulation's temporary, in units of the largest parameter tensor: what backward
# adds on top of what it holds when gradients are already held (MemTracker: 1.2-1.75 here).
BACKWARD_TRANSIENT_TENSORS = 1.5
# Units of gathered weights in flight at the top of ZeRO-3's backward beyond the one gathered for it (the
# re-gather's output and the next unit's prefetch, partly freed as the first gradients arrive): 1.6-1.8 here.
ZERO3_BACKWARD_TOP_UNITS = 1.75

Parts = Dict[str, int]


@dataclass(frozen=True)
class Sizes:
    """Bytes of one point's pieces on one worker, as a layout combines them (sharded_memory.sizes_of builds it).

    `own`: this rank's weights (whole under DDP, its shards under FSDP2); `whole`: every weight; `gathered`:
    every unit's weights at the gather dtype; `root`/`unit`: the root's and the largest block's at the gather
    dtype, `unit_reduce`/`root_reduce` at the reduce dtype; `gradients_whole`: every gradient at the reduce
    dtype (what FSDP2 holds unsharded across micro-steps, DDP's buckets); `sharded_gradients`: this rank's
    gradient shards; `largest`: the largest parameter tensor whole, `largest_own` this rank's part of it;
    `state`: the optimizer's state; `activations`: what forward keeps for backward; `optimizer_temporaries`:
    the optimizer step's own."""

    own: int
    whole: int
    gathered: int
    root: int
    unit: int
    root_reduce: int
    unit_reduce: int
    gradients_whole: int
    sharded_gradients: int
    largest: int
    state: int
    activations: int
    optimizer_temporaries: int
    workers: int
    accumulation_steps: int
    every: bool  # gradient_sync=every: reduce at every micro-step

    @property
    def accumulates(self) -> bool:
        return self.accumulation_steps > 1


def _sum(*parts: Tuple[str, float]) -> Parts:
    out: Parts = {}
    for name, value in parts:
        if value:
            out[name] = out.get(name, 0) + int(round(value))
    return out


class Layout:
    """A parallelism: its parts per phase (`phases`) and its collectives per optimizer step (`collectives`)."""

    name = ""
    sharded = False

    def phases(self, z: Sizes) -> Dict[str, Parts]:
        raise NotImplementedError

    def collectives(self, z: "CommSizes") -> List[Tuple[str, int]]:
        """(kind, payload bytes) of every collective one optimizer step issues: kind all_reduce (payload: the
        tensor), all_gather (the gathered output), reduce_scatter (the input, every rank's part)."""
        raise NotImplementedError


@dataclass(frozen=True)
class CommSizes:
    """What a step moves: every gradient at the reduce dtype (`gradients`: DDP's all-reduce), and per FSDP2
    unit with parameters, the blocks then the root, its weights at the gather dtype (`units_gathered`; the
    blocks alone: `blocks_gathered`) and its gradients at the reduce dtype (`units_reduce`); the workers and
    the mode."""

    gradients: int
    units_gathered: Tuple[int, ...]
    blocks_gathered: Tuple[int, ...]
    units_reduce: Tuple[int, ...]
    workers: int
    accumulation_steps: int
    every: bool


class Replicated(Layout):
    """DDP: every rank holds every weight, gradient and state; one all-reduce of the gradients (bucketed) per
    reduce, into buckets that hold a flat copy of the gradients with more than one worker."""

    name = "ddp"

    def phases(self, z: Sizes) -> Dict[str, Parts]:
        buckets = z.gradients_whole if z.workers > 1 else 0
        held = z.gradients_whole if z.accumulates else 0  # .grad accumulates whole in either mode
        base = (("parameters", z.whole), ("optimizer_state", z.state), ("buckets", buckets),
                ("held_gradients", held))
        # Backward frees activations as it makes gradients: its peak is the larger of the two, plus the
        # gradient in flight when it accumulates into held ones.
        fresh = 0 if z.accumulates else z.gradients_whole
        top = ("activations", z.activations) if z.activations >= fresh else ("gradients", fresh)
        return {
            "forward": _sum(*base, ("activations", z.activations)),
            "backward": _sum(*base, top, ("temporaries", BACKWARD_TRANSIENT_TENSORS * z.largest)),
            "optimizer": _sum(("parameters", z.whole), ("gradients", z.gradients_whole),
                              ("optimizer_state", z.state), ("buckets", buckets),
                              ("temporaries", z.optimizer_temporaries)),
        }

    def collectives(self, z: CommSizes) -> List[Tuple[str, int]]:
        reduces = z.accumulation_steps if z.every else 1
        return [("all_reduce", z.gradients)] * reduces


class _Fsdp(Layout):
    """FSDP2's `fully_shard` per block then the root: weights, gradients and state sharded 1/N between steps."""

    sharded = True
    keeps_gathered = False  # between micro-steps (set_reshard_after_backward(False) before the last)

    def _gathered_in_forward(self, z: Sizes) -> int:
        raise NotImplementedError

    def _forward(self, z: Sizes, held: int, gathers: bool) -> Parts:
        """A micro-step's forward top: `held` gradients from micro-steps before; `gathers`: whether it
        all-gathers (FSDP2 keeps its last output, two units' worth during the last copy-out)."""
        buffers = max(z.activations + z.unit, 2 * z.unit) - z.activations if gathers and z.workers > 1 else 0
        return _sum(("parameters", z.own), ("optimizer_state", z.state), ("held_gradients", held),
                    ("gathered", self._gathered_in_forward(z)), ("activations", z.activations),
                    ("gather_buffers", buffers))

    def _held(self, z: Sizes) -> int:
        """Gradients held from micro-steps before the last: unsharded (final: the reduce skipped) or this rank's
        shards (every)."""
        if not z.accumulates:
            return 0
        return z.sharded_gradients if z.every else z.gradients_whole

    def _forwards(self, z: Sizes) -> Parts:
        first = self._forward(z, 0, True)
        if not z.accumulates:
            return first
        later = self._forward(z, self._held(z), not self.keeps_gathered)
        return max(first, later, key=lambda parts: sum(parts.values()))

    def _optimizer(self, z: Sizes) -> Parts:
        return _sum(("parameters", z.own), ("gradients", z.sharded_gradients), ("optimizer_state", z.state),
                    ("temporaries", z.optimizer_temporaries))

    def _reduce_in_flight(self, z: Sizes) -> int:
        """A unit's reduce: its unsharded gradient as autograd made it (none when the reduce reads the held
        ones) and the reduce-scatter input, in the reduce dtype."""
        fresh = 0 if (z.accumulates and not z.every) else z.unit
        return fresh + z.unit_reduce

    def collectives(self, z: CommSizes) -> List[Tuple[str, int]]:
        reduces = z.accumulation_steps if z.every else 1
        return [("reduce_scatter", r) for _ in range(reduces) for r in z.units_reduce]


class Zero2(_Fsdp):
    """`reshard_after_forward=False`: every unit stays gathered from its forward to its backward (the whole
    model at the top of backward), and across micro-steps before the last."""

    name = "zero2"
    keeps_gathered = True

    def _gathered_in_forward(self, z: Sizes) -> int:
        return z.gathered

    def phases(self, z: Sizes) -> Dict[str, Parts]:
        base = (("parameters", z.own), ("optimizer_state", z.state), ("gathered", z.gathered),
                ("held_gradients", self._held(z)))
        top = z.activations + BACKWARD_TRANSIENT_TENSORS * z.largest
        in_flight = self._reduce_in_flight(z)
        last = ("activations", top) if top >= in_flight else ("reduce_buffers", in_flight)
        return {"forward": self._forwards(z), "backward": _sum(*base, last), "optimizer": self._optimizer(z)}

    def collectives(self, z: CommSizes) -> List[Tuple[str, int]]:
        # Gathered once per step: kept across micro-steps, freed after the last backward.
        return [("all_gather", g) for g in z.units_gathered] + super().collectives(z)


class Zero3(_Fsdp):
    """`reshard_after_forward=True` per block: a block's weights are gathered for its forward, freed, and
    gathered again for its backward; the root's stay from forward to backward."""

    name = "zero3"

    def _gathered_in_forward(self, z: Sizes) -> int:
        return z.root + z.unit

    def phases(self, z: Sizes) -> Dict[str, Parts]:
        held = self._held(z)
        top = _sum(("parameters", z.own), ("optimizer_state", z.state), ("gathered", z.root + z.unit),
                   ("held_gradients", held), ("activations", z.activations),
                   ("gather_buffers", ZERO3_BACKWARD_TOP_UNITS * z.unit))
        # At its end: the gradients reduced so far (every unit's but the last two, or all of an earlier
        # micro-step's), or the unsharded ones held (being reduced), a unit's reduce in flight, and the next
        # unit's gather (its output beyond the shard this rank already holds).
        if z.accumulates and not z.every:
            gradients = ("held_gradients", held)
        elif z.accumulates:
            gradients = ("gradients", z.sharded_gradients)
        else:
            gradients = ("gradients", z.sharded_gradients - (z.unit_reduce + z.root_reduce) / z.workers)
        added = z.unit_reduce / z.workers if (z.accumulates and z.every) else 0  # a reduced shard added to held
        end = _sum(("parameters", z.own), ("optimizer_state", z.state), ("gathered", z.root + z.unit), gradients,
                   ("reduce_buffers", self._reduce_in_flight(z) + added),
                   ("gather_buffers", (1 - 1 / z.workers) * z.unit))
        backward = max(top, end, key=lambda parts: sum(parts.values()))
        return {"forward": self._forwards(z), "backward": backward, "optimizer": self._optimizer(z)}

    def collectives(self, z: CommSizes) -> List[Tuple[str, int]]:
        # Every micro-step gathers every unit for forward (the root too: resharded after backward) and every
        # block again for backward (the root stays gathered from its forward to its backward).
        per_micro = [("all_gather", g) for g in z.units_gathered + z.blocks_gathered]
        return per_micro * z.accumulation_steps + super().collectives(z)


LAYOUTS: Dict[str, Layout] = {layout.name: layout for layout in (Replicated(), Zero2(), Zero3())}
