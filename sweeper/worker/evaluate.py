"""A trained point's validation accuracy: BatchNorm statistics re-estimated, then the held-out split
scored across ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset

from sweeper.worker.collectives import all_reduce
from sweeper.worker.spec import WorkerContext

EVAL_BATCH_SIZE = 256


def recalibrate_batchnorm(
    model: nn.Module, dataset, micro_batch_size: int, samples: int, seed: int, device: torch.device
) -> int:
    """Re-estimate the BatchNorm running statistics of the trained weights, as a cumulative average
    (torch.optim.swa_utils.update_bn) over `samples` seeded training samples in micro-batches, the
    groups the layers normalized over in training. Every rank does the same, so they agree. Returns
    the samples used: whole micro-batches, at least one even when `samples` is smaller; 0 for a
    model without BatchNorm or `samples` 0.

    Why: running statistics are an exponential average updated once per micro-batch forward, and DDP
    keeps rank 0's. Layouts with the same global batch take different numbers of updates (two per step
    with accumulation 2 on one worker, one kept with two workers), and in a short sweep the initial
    mean 0 / variance 1 still weighs in: validation would measure the update count, not the weights.
    """
    if samples <= 0 or not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return 0
    # A cumulative average weighs every batch alike, so all are full micro-batches (the split's
    # size caps a single one only when it holds less than one micro-batch).
    batches = max(1, min(samples, len(dataset)) // micro_batch_size)
    used = min(batches * micro_batch_size, len(dataset))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:used].tolist()
    loader = DataLoader(Subset(dataset, order), batch_size=micro_batch_size)
    torch.optim.swa_utils.update_bn(loader, model, device=device)
    return used


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device: torch.device, ctx: WorkerContext) -> float:
    """Accuracy over the whole held-out split: each rank scores a disjoint share, nothing padded."""
    model.eval()
    share = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for inputs, targets in DataLoader(share, batch_size=EVAL_BATCH_SIZE):
        logits = model(inputs.to(device))
        counts[0] += (logits.argmax(dim=1).cpu() == targets).sum().item()
        counts[1] += len(targets)
    all_reduce(counts, ctx, dist.ReduceOp.SUM)
    model.train()
    return float(counts[0] / counts[1])
