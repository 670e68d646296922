"""Communication per optimizer step of the two layouts that span nodes differently (issue 57): `zero1` and
`hsdp`, the bytes one rank sends in groups within one node and in groups that span nodes. Pure (standard library
and measure.sharded_memory's units: each unit's parameters, padded to the shard group as FSDP2 pads them).

Per rank, the mean of what a collective puts on the wire over its group of G ranks (what any algorithm without
redundant sends moves; ring all-reduce and all-gather send exactly it on every rank): an all-reduce of B bytes
2 (G-1)/G B, a reduce-scatter of an input of B bytes (G-1)/G B, an all-gather into B bytes (G-1)/G B, a broadcast
of B bytes (G-1)/G B (B reaches G-1 other ranks); nothing in a group of one.
- zero1 (torch 2.14's ZeroRedundancyOptimizer over DDP): DDP's all-reduce of every gradient, once per optimizer
  step (`no_sync` on the micro-steps before the last), then `_sync_params`: each rank broadcasts the parameters it
  stepped to all the others, every parameter once. Over N ranks: 2 (N-1)/N G + (N-1)/N P, one and a half times
  DDP's all-reduce in fp32 (the ZeRO paper's ZeRO-1, a reduce-scatter then an all-gather, would send DDP's).
  Its group is every rank: across nodes as soon as the ranks span two.
- hsdp over R nodes of S ranks (FSDP2 on the mesh (R, S), `reshard_after_forward=True` for the blocks): within
  the node, ZeRO-3's traffic over S (every unit all-gathered for forward and every block again for backward, at
  every micro-step; every unit's gradients reduce-scattered once per step); across the nodes only an all-reduce
  of the rank's gradient shards (1/S of the gradients) over its column of R ranks, once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from sweeper.measure.sharded_memory import Unit


@dataclass(frozen=True)
class NodeTraffic:
    """One rank's bytes sent in one optimizer step: in groups within one node, in groups spanning nodes, and the
    payloads by kind (the bytes the collectives were called with: a gathered output, a reduce-scatter's input)."""

    within_node_bytes: int
    across_nodes_bytes: int
    all_reduce_payload_bytes: int = 0
    all_gather_payload_bytes: int = 0
    reduce_scatter_payload_bytes: int = 0
    broadcast_payload_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.within_node_bytes + self.across_nodes_bytes


def share(group: int) -> float:
    """(G-1)/G: the part of a payload one rank of a group of `group` sends (0 alone)."""
    return (group - 1) / group if group > 1 else 0.0


def per_step(units: Sequence[Unit], parallelism: str, workers: int, accumulation_steps: int, nodes: int = 1,
             bytes_per_value: int = 4, gather_bytes_per_value: Optional[int] = None) -> NodeTraffic:
    """One rank's traffic in one optimizer step of `parallelism` (zero1 | hsdp) at `workers` ranks on `nodes` nodes
    (1: a local Ray; hsdp's hold workers / nodes each), `accumulation_steps` micro-steps. Gradients are reduced at
    `bytes_per_value` (fp32: 4), hsdp's weights gathered at `gather_bytes_per_value` (bf16: 2)."""
    if parallelism not in ("zero1", "hsdp") or not 1 <= nodes <= workers or (parallelism == "hsdp" and workers % nodes):
        raise ValueError(f"node_traffic: parallelism {parallelism!r} at {workers} workers on {nodes} nodes: zero1, or "
                         "hsdp on nodes holding the same number of ranks")
    per_node = workers // nodes
    if parallelism == "zero1":
        values = sum(u.numel() for u in units)
        reduce, broadcast = values * bytes_per_value, values * bytes_per_value
        sent = int(round(2 * share(workers) * reduce + share(workers) * broadcast))
        return NodeTraffic(sent if nodes == 1 else 0, sent if nodes > 1 else 0, all_reduce_payload_bytes=reduce,
                           broadcast_payload_bytes=broadcast)
    gather = gather_bytes_per_value or bytes_per_value
    held = [u for u in units if u.numel()]  # FSDP2 makes no collective for a unit without parameters
    gathered = sum(u.numel(per_node) for u in held) + sum(u.numel(per_node) for u in held if u.name != "root")
    gathered *= gather * accumulation_steps
    scattered = sum(u.numel(per_node) for u in held) * bytes_per_value
    reduced = scattered // per_node  # this rank's gradient shards
    return NodeTraffic(int(round(share(per_node) * (gathered + scattered))),
                       int(round(2 * share(nodes) * reduced)),
                       all_reduce_payload_bytes=reduced if nodes > 1 else 0, all_gather_payload_bytes=gathered,
                       reduce_scatter_payload_bytes=scattered)
