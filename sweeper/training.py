"""One trial on one data-parallel worker: gradient accumulation, timing windows, validation accuracy.

Knows torch only. Runs the same under Ray Train, under a plain `torch.distributed` gloo group, or in
one process (world size 1, no DDP wrapper).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from sweeper import data as data_mod
from sweeper import measure, models, telemetry
from sweeper.config import DataConfig, ModelConfig, TrainConfig
from sweeper.plan import GridPoint

EVAL_BATCH_SIZE = 256


@dataclass
class TrialSpec:
    """Everything a worker needs to run one grid point (picklable, sent to every worker)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    point: GridPoint
    lr: float
    steps: int
    use_gpu: bool = False
    # Wall-clock time (time.time()) the trial started, to measure the start-up overhead.
    trial_start_time: Optional[float] = None
    noisy_cv_threshold: float = 0.05


@dataclass
class WorkerContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def accumulation_context(model: nn.Module, micro_step: int, accumulation_steps: int):
    """Skip DDP's gradient all-reduce on every micro-step but the last of an optimizer step.

    Gradients then accumulate locally and are averaged across workers once per optimizer step.
    Without DDP (one worker) there is nothing to skip.
    """
    is_last = micro_step == accumulation_steps - 1
    if isinstance(model, nn.parallel.DistributedDataParallel) and not is_last:
        return model.no_sync()
    return contextlib.nullcontext()


def run_trial(spec: TrialSpec, ctx: WorkerContext) -> Dict[str, Any]:
    """Train `spec.steps` optimizer steps and measure them. Every rank returns the same dict."""
    point, train = spec.point, spec.train
    if point.num_workers != ctx.world_size:
        raise ValueError(f"grid point wants {point.num_workers} workers, world size is {ctx.world_size}")
    device = telemetry.select(spec.use_gpu, ctx.local_rank)
    splits = data_mod.load(spec.data, spec.model.input_shape)

    device.start_memory_window()
    torch.manual_seed(train.seed)  # same initial weights on every layout (DDP also broadcasts rank 0's)
    model: nn.Module = models.build(spec.model, splits.num_classes).to(device.torch_device)
    if ctx.world_size > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if device.is_cuda else None
        )
    optimizer = torch.optim.SGD(
        model.parameters(), lr=spec.lr, momentum=train.momentum, weight_decay=train.weight_decay
    )
    sampler = data_mod.GlobalBatchSampler(len(splits.train), point, ctx.rank, spec.steps, train.seed)
    loader = DataLoader(
        splits.train,
        batch_size=point.micro_batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=spec.data.loader_workers,
        pin_memory=device.is_cuda,
    )

    ends = measure.window_ends(spec.steps, train.warmup_steps, train.timing_windows)
    starts = {train.warmup_steps, *(end + 1 for end in ends[:-1])} if ends else set()
    step_losses = torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)
    window_seconds: List[float] = []
    first_step_time: Optional[float] = None
    model.train()
    batches = iter(loader)
    clock = 0.0  # set at the start of each window
    for step in range(spec.steps):
        # Whole optimizer steps are timed, data loading included (internal per-phase timers
        # overestimate throughput).
        if step in starts:
            device.synchronize()
            clock = time.perf_counter()
        for micro_step in range(point.accumulation_steps):
            inputs, targets = next(batches)
            inputs = inputs.to(device.torch_device, non_blocking=True)
            targets = targets.to(device.torch_device, non_blocking=True)
            with accumulation_context(model, micro_step, point.accumulation_steps):
                loss = F.cross_entropy(model(inputs), targets)
                # Each micro-batch loss is a mean over its samples; dividing by the accumulation
                # steps makes the summed gradient the mean over the worker's whole share.
                (loss / point.accumulation_steps).backward()
            step_losses[step] += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if first_step_time is None:
            device.synchronize()
            first_step_time = time.time()
        if len(window_seconds) < len(ends) and step == ends[len(window_seconds)]:
            device.synchronize()
            window_seconds.append(time.perf_counter() - clock)

    # Mean over micro-steps, then over workers: the loss of the whole global batch at each step.
    step_losses /= point.accumulation_steps
    _all_reduce(step_losses, ctx, dist.ReduceOp.SUM)
    step_losses /= ctx.world_size
    peak = torch.tensor([float(device.peak_memory_bytes())], dtype=torch.float64, device=device.torch_device)
    _all_reduce(peak, ctx, dist.ReduceOp.MAX)

    result: Dict[str, Any] = {
        "train_loss": step_losses.cpu().tolist(),
        "optimizer_steps": spec.steps,
        "samples_seen": spec.steps * point.global_batch_size,
        "peak_memory_bytes": int(peak.item()),
        "memory_measure": device.memory_measure,
        "device": str(device.torch_device.type),
    }
    if spec.trial_start_time is not None and first_step_time is not None:
        result["startup_seconds"] = first_step_time - spec.trial_start_time
    if window_seconds:
        steps_per_window = ends[0] - train.warmup_steps + 1
        tp = measure.summarize(
            window_seconds, steps_per_window, point.global_batch_size, spec.noisy_cv_threshold
        )
        result.update(
            samples_per_second=tp.samples_per_second,
            samples_per_second_cv=tp.samples_per_second_cv,
            step_time_seconds=tp.step_time_seconds,
            window_samples_per_second=tp.window_samples_per_second,
            throughput_noisy=tp.noisy,
        )
    if splits.val is not None and splits.has_real_labels:
        result["val_accuracy"] = evaluate(model, splits.val, device, ctx)
    return result


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device: telemetry.Device, ctx: WorkerContext) -> float:
    """Accuracy over the whole held-out split: each rank scores a disjoint share, nothing padded."""
    model.eval()
    share = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    counts = torch.zeros(2, dtype=torch.float64, device=device.torch_device)
    for inputs, targets in DataLoader(share, batch_size=EVAL_BATCH_SIZE):
        logits = model(inputs.to(device.torch_device))
        counts[0] += (logits.argmax(dim=1).cpu() == targets).sum().item()
        counts[1] += len(targets)
    _all_reduce(counts, ctx, dist.ReduceOp.SUM)
    model.train()
    return float(counts[0] / counts[1])


def _all_reduce(tensor: torch.Tensor, ctx: WorkerContext, op) -> None:
    if ctx.world_size > 1:
        dist.all_reduce(tensor, op=op)
