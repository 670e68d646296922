"""Bytes each worker sends per optimizer step under each data-parallel layout and gradient sync: predicted from
the model's units (measure.layouts' collectives), and the same arithmetic applied to the collectives a worker
counted (measure.collective_count). Standard library only.

A collective's traffic is what one rank sends under the ring algorithm NCCL and gloo use for large tensors:
an all-reduce of B bytes sends 2 (N-1)/N B (a reduce-scatter then an all-gather), a reduce-scatter of an input
of B bytes (every rank's part) (N-1)/N B, an all-gather into an output of B bytes (N-1)/N B, a broadcast of B
bytes B (a pipelined chain: every rank but the last forwards it). So DDP sends about 2 x 4 bytes x the
parameters per reduce in fp32, ZeRO-2 and ZeRO-3 about 3 x (an all-gather and a reduce-scatter, ZeRO-3 one
all-gather more, again at every micro-step); nothing at one worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

from sweeper.measure.layouts import LAYOUTS, CommSizes
from sweeper.measure.sharded_memory import Unit

# Bytes one rank sends per byte of a collective's payload, at N ranks (ring algorithms).
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def ring_factor(kind: str, workers: int) -> float:
    """What one rank sends per payload byte of a `kind` collective over `workers` ranks (0 at one rank)."""
    if workers <= 1:
        return 0.0
    share = (workers - 1) / workers
    if kind == "all_reduce":
        return 2 * share
    if kind in ("reduce_scatter", "all_gather"):
        return share
    return 1.0  # broadcast and anything else: the payload once


@dataclass(frozen=True)
class Traffic:
    """One optimizer step's collectives on one worker: `bytes` sent (ring arithmetic), their count, and the
    payload bytes by kind."""

    bytes: int
    collectives: int
    payload_by_kind: Tuple[Tuple[str, int], ...] = ()


def traffic(calls: Iterable[Tuple[str, int]], workers: int) -> Traffic:
    """The traffic of (kind, payload bytes) collectives over `workers` ranks."""
    calls = list(calls)
    payload = {}
    for kind, size in calls:
        payload[kind] = payload.get(kind, 0) + size
    sent = sum(ring_factor(kind, workers) * size for kind, size in calls)
    return Traffic(int(round(sent)), len(calls), tuple(sorted(payload.items())))


def per_step(units: Sequence[Unit], parallelism: str, workers: int, accumulation_steps: int,
             gradient_sync: str = "final", bytes_per_value: int = 4,
             gather_bytes_per_value: Optional[int] = None) -> Traffic:
    """The predicted traffic of one optimizer step per worker (measure.layouts' collectives): DDP's bucketed
    all-reduce (once, or at every micro-step under `every`); FSDP2's all-gathers (ZeRO-2's once per step: the
    weights stay gathered across micro-steps; ZeRO-3's for every forward and again for every block's backward)
    and its reduce-scatters (once, or per micro-step). Payloads at FSDP2's padded sizes; gathered at
    `gather_bytes_per_value` (bf16: 2), reduced at `bytes_per_value`."""
    layout = LAYOUTS[parallelism]
    gather = gather_bytes_per_value or bytes_per_value
    group = workers if layout.sharded else 1
    held = [u for u in units if u.numel()]  # FSDP2 makes no group for a unit without parameters
    sizes = CommSizes(
        gradients=sum(u.numel(group) for u in units) * bytes_per_value,
        units_gathered=tuple(u.numel(group) * gather for u in held),
        blocks_gathered=tuple(u.numel(group) * gather for u in held if u.name != "root"),
        units_reduce=tuple(u.numel(group) * bytes_per_value for u in held),
        workers=workers, accumulation_steps=accumulation_steps, every=gradient_sync == "every")
    return traffic(layout.collectives(sizes), workers)
