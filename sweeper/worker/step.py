"""One grid point on one data-parallel worker: build the model, train `spec.steps` optimizer steps with
gradient accumulation, and measure them (timed windows, memory, utilization, an optional profiler
trace, validation accuracy) into a PointResult.

Knows torch only. Runs the same under Ray Train, under a plain `torch.distributed` gloo group, or in
one process (world size 1, no DDP wrapper). Every rank returns the same result.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from sweeper import data as data_mod
from sweeper import models
from sweeper.measure import telemetry, timing
from sweeper.schema import PointResult
from sweeper.worker import collectives as comm
from sweeper.worker.deadline import Deadline
from sweeper.worker.evaluate import evaluate, recalibrate_batchnorm
from sweeper.worker.spec import PointSpec, WorkerContext

TRACE_FILE = "rank0.pt.trace.json.gz"
# No batch of these datasets takes a healthy loader worker anywhere near this long.
LOADER_TIMEOUT_SECONDS = 300


def accumulation_context(model: nn.Module, micro_step: int, accumulation_steps: int):
    """Skip DDP's gradient all-reduce on every micro-step but the last of an optimizer step.

    Gradients then accumulate locally and are averaged across workers once per optimizer step.
    Without DDP (one worker) there is nothing to skip.
    """
    is_last = micro_step == accumulation_steps - 1
    if isinstance(model, nn.parallel.DistributedDataParallel) and not is_last:
        return model.no_sync()
    return contextlib.nullcontext()


@dataclass
class Training:
    """A point's training state on this rank: the model, its optimizer and the batches to come."""

    spec: PointSpec
    ctx: WorkerContext
    device: telemetry.Device
    splits: data_mod.Splits
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[Any]
    budget_mode: str  # enforced | simulated | none (telemetry.Device.limit_memory)
    step_losses: torch.Tensor  # the worker's mean micro-batch loss per step, on the device
    started: float = field(default_factory=time.time)

    def step(self, step: int, marks: Optional[List[Any]] = None, loaded: Optional[List[Any]] = None) -> None:
        """One optimizer step: every micro-batch's forward and backward, then the optimizer.

        Whole optimizer steps, data loading included: internal per-phase timers alone would
        overestimate throughput. Marks do not synchronize the device (events on GPU).
        """
        point, target = self.spec.point, self.device.torch_device
        for micro_step in range(point.accumulation_steps):
            inputs, targets = next(self.batches) if loaded is None else loaded[micro_step]
            # Batches loaded beforehand are copied, as a GPU copies them in from the host: the
            # tracked step then counts the batch on the device and not the host-side dataset.
            copy = loaded is not None
            inputs = inputs.to(target, non_blocking=True, copy=copy)
            targets = targets.to(target, non_blocking=True, copy=copy)
            if marks is not None:
                marks.append(self.device.mark())
            with accumulation_context(self.model, micro_step, point.accumulation_steps):
                loss = F.cross_entropy(self.model(inputs), targets)
                # Each micro-batch loss is a mean over its samples; dividing by the accumulation
                # steps makes the summed gradient the mean over the worker's whole share.
                (loss / point.accumulation_steps).backward()
            if marks is not None:
                marks.append(self.device.mark())
            self.step_losses[step] += loss.detach()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def tracked_step(self, step: int):
        """A warm-up step under torch's MemTracker (and a simulated CPU budget): the memory breakdown.

        A warm-up step, so the tracker's cost is never timed; after step 0, so the optimizer state
        exists as it does for every later step. Every step has the same shapes, so this step's peak
        is every step's: a CPU budget is enforced on it."""
        from sweeper.measure import memory  # loads DTensor (~1.5 s): only when the breakdown is on

        # Loaded outside the tracker: indexing an in-memory dataset yields views of its whole
        # storage, which the tracker would count as device memory.
        loaded = [next(self.batches) for _ in range(self.spec.point.accumulation_steps)]
        return memory.track_step(
            self.model,
            self.optimizer,
            lambda: self.step(step, loaded=loaded),
            self.device.torch_device,
            budget_bytes=self.spec.memory_budget_bytes if self.budget_mode == "simulated" else None,
        )

    @property
    def inner_model(self) -> nn.Module:
        return self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel) else self.model


def setup(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, splits: data_mod.Splits) -> Training:
    """A fresh model (seeded: the same initial weights on every layout), its optimizer and its batches."""
    point = spec.point
    budget_mode = device.limit_memory(spec.memory_budget_bytes)
    device.start_memory_window()
    torch.manual_seed(spec.train.seed)  # same initial weights on every layout (DDP also broadcasts rank 0's)
    model: nn.Module = models.build(spec.model, splits.num_classes).to(device.torch_device)
    if ctx.world_size > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if device.is_cuda else None, process_group=ctx.group
        )
    optimizer = torch.optim.SGD(
        model.parameters(), lr=spec.lr, momentum=spec.train.momentum, weight_decay=spec.train.weight_decay
    )
    sampler = data_mod.GlobalBatchSampler(len(splits.train), point, ctx.rank, spec.steps, spec.train.seed)
    loader = DataLoader(
        splits.train,
        batch_size=point.micro_batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=spec.data.loader_workers,
        pin_memory=device.is_cuda,
        # A loader worker process that stalls (NFS, a deadlock) raises instead of hanging the group.
        timeout=LOADER_TIMEOUT_SECONDS if spec.data.loader_workers > 0 else 0,
    )
    losses = torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)
    return Training(spec, ctx, device, splits, model, optimizer, iter(loader), budget_mode, losses)


class Clock:
    """The timed windows of a point: opened and closed on step boundaries, the device synchronized at
    each edge (and nowhere else), with the utilization sampler running from the first timed step."""

    def __init__(self, run: Training, windows: int, deadline: Optional[Deadline] = None):
        self.run, self.deadline = run, deadline
        self.window_seconds: List[float] = [0.0] * windows
        self.step_marks: List[List[Any]] = []
        self.sampler: Optional[telemetry.UtilizationSampler] = None
        self.utilization: Optional[telemetry.Utilization] = None
        self.first_step_time: Optional[float] = None
        self._opened = 0.0

    def open(self, window: int) -> None:
        device = self.run.device
        if window == 0:
            if self.deadline is not None:
                spec = self.run.spec
                self.deadline.project(spec.first_timed_step, spec.steps, time.time() - self.run.started)
            self.sampler = device.utilization_sampler(self.run.spec.measure.utilization_interval_seconds).start()
            # Ranks leave warm-up (and rank 0 the profiler's trace export) at different times; line
            # them up so the first window does not time the wait.
            comm.barrier(self.run.ctx)
        device.synchronize()
        self._opened = time.perf_counter()

    def timed_step(self, step: int) -> None:
        marks = [self.run.device.mark()]
        self.run.step(step, marks)
        marks.append(self.run.device.mark())
        self.step_marks.append(marks)

    def after_step(self) -> None:
        if self.first_step_time is None:
            self.run.device.synchronize()
            self.first_step_time = time.time()

    def close(self, window: int) -> None:
        self.run.device.synchronize()
        self.window_seconds[window] = time.perf_counter() - self._opened

    def stop(self) -> None:
        # Also on failure: the sampler may not outlive this point into the next one's measurement.
        if self.sampler is not None and self.utilization is None:
            self.utilization = self.sampler.stop()


def train_point(
    spec: PointSpec,
    ctx: WorkerContext,
    device: Optional[telemetry.Device] = None,
    splits: Optional[data_mod.Splits] = None,
    deadline: Optional[Deadline] = None,
) -> PointResult:
    """Train `spec.steps` optimizer steps and measure them. Every rank returns the same result.
    `deadline`, if given, is projected from the warm-up once the first timed window opens."""
    if spec.point.num_workers != ctx.world_size:
        raise ValueError(f"grid point wants {spec.point.num_workers} workers, world size is {ctx.world_size}")
    cfg = spec.measure
    device = device or telemetry.select(spec.use_gpu, ctx.local_rank)
    run = setup(spec, ctx, device, splits or data_mod.load(spec.data, spec.model.input_shape))
    track_memory = cfg.memory_breakdown or run.budget_mode == "simulated"
    roles = timing.step_roles(spec.steps, cfg.warmup_steps, spec.profile_steps, cfg.windows, track_memory)
    clock = Clock(run, sum(role.opens_window is not None for role in roles), deadline)
    profiler = _profiler(spec, ctx, device)
    breakdown = None
    train_start = time.perf_counter()
    run.model.train()
    try:
        for step, role in enumerate(roles):
            if role.opens_window is not None:
                clock.open(role.opens_window)
            if role.starts_profiler:
                profiler.start()
            if role.kind == timing.TRACKED:
                breakdown = run.tracked_step(step)
            elif role.kind == timing.TIMED:
                clock.timed_step(step)
            else:
                run.step(step)
            if role.kind == timing.PROFILED:
                profiler.step()
            if role.stops_profiler:
                profiler.stop()
                profiler = None
            clock.after_step()
            if role.closes_window is not None:
                clock.close(role.closes_window)
    finally:
        clock.stop()
        if profiler is not None:
            profiler.stop()
    train_seconds = time.perf_counter() - train_start

    result = PointResult(trial_key=spec.point.key, device=device.torch_device.type, train_loss=_losses(run))
    result.cost.update(dict(
        train_seconds=train_seconds,
        optimizer_steps=spec.steps,
        samples_seen=spec.steps * spec.point.global_batch_size,
    ))
    if clock.first_step_time is not None:
        result.cost.startup_seconds = clock.first_step_time - run.started
    _memory(result, run, breakdown)
    _throughput(result, run, clock)
    _utilization(result, run, clock.utilization)
    if spec.profile and ctx.rank == 0:
        result.profile_trace_dir = _trace_dir(spec)
    _accuracy(result, run)
    return result


def _losses(run: Training) -> List[float]:
    """The loss of the whole global batch at each step: mean over micro-steps, then over workers."""
    losses = run.step_losses / run.spec.point.accumulation_steps
    comm.all_reduce(losses, run.ctx, dist.ReduceOp.SUM)
    return (losses / run.ctx.world_size).cpu().tolist()


def _memory(result: PointResult, run: Training, breakdown) -> None:
    """Memory: the largest over workers, each figure under a name that says what it measures; the
    headline peak_memory_bytes is the best measure this device has."""
    memory, device, spec = result.memory, run.device, run.spec
    memory.update(comm.reduce_numbers(dict(device.memory_metrics()), run.ctx, device.torch_device, dist.ReduceOp.MAX))
    if breakdown is not None:
        # The whole breakdown of the worker with the largest peak, so its parts still add up.
        breakdowns = comm.gather_objects(breakdown.as_metrics(), run.ctx)
        memory.update(max(breakdowns, key=lambda b: b["memory_tracked_peak_bytes"]))
    if device.is_cuda:
        memory.peak_memory_bytes = memory.cuda_max_memory_allocated_bytes
        memory.memory_measure = "cuda: torch.cuda.max_memory_allocated over the point, largest worker"
    elif breakdown is not None:
        memory.peak_memory_bytes = memory.memory_tracked_peak_bytes
        memory.memory_measure = (
            "cpu: peak tensor memory of one training step (torch MemTracker), largest worker; "
            "process RSS above its pre-point baseline is cpu_rss_peak_above_baseline_bytes"
        )
    elif memory.cpu_rss_peak_above_baseline_bytes is not None:
        memory.peak_memory_bytes = memory.cpu_rss_peak_above_baseline_bytes
        memory.memory_measure = (
            "cpu: process RSS high-water mark above its pre-point baseline (measure.memory_breakdown=false, "
            "so no tensor-level peak), largest worker"
        )
    if run.budget_mode != "none":
        memory.memory_budget_bytes = spec.memory_budget_bytes
        memory.memory_budget_mode = run.budget_mode


def _throughput(result: PointResult, run: Training, clock: Clock) -> None:
    """Throughput of the timed windows, paced by the slowest rank, and the phases of a step."""
    if not clock.window_seconds:
        return
    cfg, device, spec = run.spec.measure, run.device, run.spec
    bounds = timing.window_bounds(spec.steps, spec.first_timed_step, cfg.windows)
    steps_per_window = [stop - start for start, stop in bounds]
    # The slowest rank sets the pace of a data-parallel step.
    seconds = torch.tensor(clock.window_seconds, dtype=torch.float64, device=device.torch_device)
    comm.all_reduce(seconds, run.ctx, dist.ReduceOp.MAX)
    tp = timing.summarize(
        seconds.cpu().tolist(), steps_per_window, run.spec.point.global_batch_size,
        cfg.stable_windows, cfg.stability_tolerance,
    )
    result.throughput.update(dict(
        samples_per_second=tp.samples_per_second,
        samples_per_second_cv=tp.samples_per_second_cv,
        step_time_seconds=tp.step_time_seconds,
        window_samples_per_second=tp.window_samples_per_second,
        throughput_stable=tp.stable,
        timing_windows=len(clock.window_seconds),
        stable_windows_used=tp.stable_window_count,
    ))
    phases = timing.phase_split([_phases(device, marks) for marks in clock.step_marks])
    result.throughput.update(comm.reduce_numbers(phases, run.ctx, device.torch_device, dist.ReduceOp.SUM, mean=True))


def _phases(device: telemetry.Device, marks: List[Any]):
    """(data, forward_backward, optimizer) seconds of one step from its marks:
    [start, (after data, after backward) per micro-step, end]."""
    data = compute = 0.0
    previous = marks[0]
    for loaded, backward_done in zip(marks[1:-1:2], marks[2:-1:2]):
        data += device.seconds_between(previous, loaded)
        compute += device.seconds_between(loaded, backward_done)
        previous = backward_done
    return data, compute, device.seconds_between(previous, marks[-1])


def _utilization(result: PointResult, run: Training, utilization: Optional[telemetry.Utilization]) -> None:
    """Utilization in the timed windows: maxima over workers, means averaged over workers."""
    if utilization is None:
        return
    util = utilization.as_metrics()
    util.pop("utilization_samples")
    device = run.device.torch_device
    maxima = {k: v for k, v in util.items() if k.endswith("_max")}
    means = {k: v for k, v in util.items() if not k.endswith("_max")}
    result.utilization.update(comm.reduce_numbers(maxima, run.ctx, device, dist.ReduceOp.MAX))
    result.utilization.update(comm.reduce_numbers(means, run.ctx, device, dist.ReduceOp.SUM, mean=True))
    if utilization.gpu_unavailable_reason:
        result.utilization.gpu_telemetry_note = f"no GPU utilization: {utilization.gpu_unavailable_reason}"


def _accuracy(result: PointResult, run: Training) -> None:
    spec, splits = run.spec, run.splits
    if not (spec.evaluate and splits.val is not None and splits.has_real_labels):
        return
    used = recalibrate_batchnorm(
        run.inner_model, splits.train, spec.point.micro_batch_size, spec.train.bn_recalibration_samples,
        spec.train.seed, run.device.torch_device,
    )
    if used:
        result.accuracy.bn_recalibration_samples = used
    result.accuracy.val_accuracy = evaluate(run.model, splits.val, run.device.torch_device, run.ctx)


def _profiler(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device):
    """torch.profiler for the untimed steps after warm-up (rank 0; one profiler warm-up step, then
    `profile_steps` recorded), written as a Chrome trace that TensorBoard's profiler plugin and
    Perfetto open. None when not profiling."""
    if not spec.profile or ctx.rank != 0:
        return _NoProfiler() if spec.profile else None
    from torch.profiler import ProfilerActivity, profile, schedule

    folder = _trace_dir(spec)
    os.makedirs(folder, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.is_cuda else [])
    return profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=spec.measure.profile_steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(folder, TRACE_FILE)),
        record_shapes=True,
        profile_memory=True,
    )


class _NoProfiler:
    """The other ranks' profiler: they run the profiled steps untimed and record nothing."""

    def start(self) -> None: ...

    def step(self) -> None: ...

    def stop(self) -> None: ...


def _trace_dir(spec: PointSpec) -> str:
    return os.path.join(spec.profile_dir or "profile", spec.point.key)
