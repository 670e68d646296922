"""The largest micro-batch a point's stream holds, for its memory-tracked step: with data.collate_fn batches
may differ in shape (dynamic padding), and the step that is tracked (and held to a CPU budget) would otherwise
be whichever came first. Knows torch only.

The stream is scanned once (this rank's micro-batches, as its loader makes them); when any rank holds a larger
one than the tracked step's, every rank runs a forward and backward of its largest before that step, in the
gradient sync a step's last micro-step does (the same collectives on every rank), and drops what it changed:
the gradients, BatchNorm's statistics and the random state. The training is the same as without it.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import torch
import torch.distributed as dist

from sweeper.worker import collectives as comm
from sweeper.worker.sharding import accumulation_context
from sweeper.workloads import batches


def stream_largest(run: Any, loaded: List[Any], stream: Iterable[Any]) -> Optional[Any]:
    """This rank's largest micro-batch over its whole `stream` (a fresh loader of it; by elements), when some
    rank's is larger than every micro-batch of the tracked step (`loaded`); None when no rank's is (agreed: one
    all-reduce)."""
    biggest, most = None, -1
    for batch in stream:
        size = batches.element_count(batch)
        if size > most:
            biggest, most = batch, size
    larger = torch.tensor([float(most > max(batches.element_count(b) for b in loaded))],
                          device=run.device.torch_device)
    comm.all_reduce(larger, run.ctx, dist.ReduceOp.MAX)
    return biggest if bool(larger.item()) else None


def probe(run: Any, batch: Any) -> None:
    """`batch`'s forward and backward as a step's last micro-step runs them (the gradient reduced across
    ranks), then its gradients, the model's buffers and the random state as they were before it."""
    point, device = run.spec.point, run.device.torch_device
    batch = batches.to_device(batch, device, copy=True)
    buffers = [b.detach().clone() for b in run.model.buffers()]
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if run.device.is_cuda else []
    with torch.random.fork_rng(devices=devices):
        with accumulation_context(run.model, point.accumulation_steps - 1, point.accumulation_steps):
            run._forward_backward(batch)
    run.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for buffer, saved in zip(run.model.buffers(), buffers):
            buffer.copy_(saved)
    if run.micro_grads is not None:
        run.micro_grads.pending.clear()  # its micro-gradient is no step's
