"""The few collectives a worker group uses outside DDP: reductions of measured figures, object
exchange, and the process sub-groups a smaller point trains in. All are no-ops in one process.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from sweeper.plan import mesh_by_node
from sweeper.worker.spec import NodeMesh, WorkerContext


def reduce_numbers(values: Dict[str, float], ctx: WorkerContext, device: torch.device, op, mean: bool = False
                   ) -> Dict[str, float]:
    """Reduce a dict of numbers (same keys on every rank) across ranks; ints stay ints."""
    if not values:
        return {}
    names = sorted(values)
    tensor = torch.tensor([float(values[n]) for n in names], dtype=torch.float64, device=device)
    all_reduce(tensor, ctx, op)
    if mean:
        tensor /= ctx.world_size
    return {n: (int(v) if isinstance(values[n], int) else v) for n, v in zip(names, tensor.cpu().tolist())}


def barrier(ctx: WorkerContext) -> None:
    if ctx.world_size > 1:
        dist.barrier(group=ctx.group)


def all_reduce(tensor: torch.Tensor, ctx: WorkerContext, op) -> None:
    if ctx.world_size > 1:
        dist.all_reduce(tensor, op=op, group=ctx.group)


def gather_objects(obj: Any, ctx: WorkerContext, group: Any = None) -> List[Any]:
    if ctx.world_size == 1:
        return [obj]
    out: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=group or ctx.group)
    return out


def broadcast_object(obj: Any, ctx: WorkerContext) -> Any:
    if ctx.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ctx.group)
    return box[0]


def status_group(ctx: WorkerContext, timeout: datetime.timedelta) -> Any:
    """A gloo group of the whole context with a short timeout, to agree on a status (None alone)."""
    if ctx.world_size == 1:
        return None
    return dist.new_group(ranks=list(range(ctx.world_size)), backend="gloo", timeout=timeout)


def subgroups(sizes: Sequence[int], ctx: WorkerContext, timeout: datetime.timedelta) -> Dict[int, Tuple[Any, Any]]:
    """For each point size n > 1: the process group of ranks 0..n-1 to train in (the whole group
    when n is its size) and a gloo group of the same ranks with a short timeout to agree on the
    point's status; for n = 1 in a larger group, rank 0's own (FSDP2 shards a one-worker point over
    its group, which must not hold the idle ranks). Every rank takes part in creating each group,
    members or not."""
    groups: Dict[int, Tuple[Any, Any]] = {}
    for n in sizes:
        if n > 1 or ctx.world_size > 1:
            ranks = list(range(n))
            train_group = ctx.group if n == ctx.world_size else dist.new_group(ranks=ranks)
            groups[n] = (train_group, dist.new_group(ranks=ranks, backend="gloo", timeout=timeout))
    return groups


def node_meshes(sizes: Sequence[int], rank_nodes: Sequence[str], ctx: WorkerContext
                ) -> Dict[int, Union[Optional[NodeMesh], str]]:
    """For each size n of the group's hsdp points: the mesh of ranks 0..n-1 by node (plan.mesh_by_node of
    `rank_nodes`, the node of every rank of the group) with this rank's groups in it (None for a rank outside
    those n), or the one line why those ranks make no mesh (their nodes hold unequal counts: the point's error).
    Every rank takes part in creating each group, members or not, in one order. {} in one process (a group of
    one makes its own mesh (1, 1): sharding.apply)."""
    meshes: Dict[int, Union[Optional[NodeMesh], str]] = {}
    if ctx.world_size == 1:
        return meshes
    for n in sizes:
        try:
            rows = mesh_by_node(rank_nodes[:n])
        except ValueError as exc:
            meshes[n] = str(exc)
            continue
        shards = [dist.new_group(ranks=row) for row in rows]
        replicas = [dist.new_group(ranks=list(column)) for column in zip(*rows)]
        meshes[n] = next((NodeMesh(rows, replicas[row.index(ctx.rank)], shards[i])
                          for i, row in enumerate(rows) if ctx.rank in row), None)
    return meshes
