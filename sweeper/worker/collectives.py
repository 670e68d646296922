"""The few collectives a worker group uses outside DDP: reductions of measured figures, object
exchange, and the process sub-groups a smaller point trains in. All are no-ops in one process.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist

from sweeper.worker.spec import WorkerContext


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
