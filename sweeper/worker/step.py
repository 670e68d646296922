"""Grid points on one data-parallel worker: gradient accumulation, timed windows, memory breakdown,
FLOPs, utilization, an optional profiler trace and validation accuracy.

Knows torch only. Runs the same under Ray Train, under a plain `torch.distributed` gloo group, or in
one process (world size 1, no DDP wrapper). Every rank returns the same result.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from sweeper import data as data_mod
from sweeper import models
from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.measure import flops as flops_mod
from sweeper.measure import telemetry
from sweeper.measure import timing as measure
from sweeper.plan import GridPoint

EVAL_BATCH_SIZE = 256
STATUS_ORDER = ("ok", "oom", "failed")  # the worst status over ranks wins
# Ranks that failed together reach the status exchange within seconds of each other; a rank still
# training after this long means the failure was one rank's alone.
STATUS_TIMEOUT = datetime.timedelta(seconds=120)
TRACE_FILE = "rank0.pt.trace.json.gz"


@dataclass
class TrialSpec:
    """Everything a worker needs to run one grid point (picklable, sent to every worker)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    point: GridPoint
    lr: float
    steps: int
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    use_gpu: bool = False
    # FLOPs per sample of this model, counted once per sweep by the driver (None: not counted).
    flop_count: Optional[flops_mod.FlopCount] = None
    # profile=true: a torch.profiler trace of `measure.profile_steps` untimed steps, written under
    # `profile_dir` (the driver sets it once it knows where Ray keeps results).
    profile: bool = False
    profile_dir: Optional[str] = None
    # device.memory_budget_gb in bytes: enforced on GPU, simulated against the tracked step on CPU.
    memory_budget_bytes: Optional[int] = None
    # The fake-tensor estimate of this point's tracked peak (memory.estimate_step), to report its error.
    memory_estimate_bytes: Optional[int] = None
    # False for frontier probes: memory only, no validation pass.
    evaluate: bool = True

    @property
    def first_timed_step(self) -> int:
        """Warm-up steps, then (when profiling) one profiler warm-up step and the profiled steps."""
        profiled = self.measure.profile_steps + 1 if self.profile else 0
        return self.measure.warmup_steps + profiled


@dataclass
class WorkerContext:
    """This worker's place in the process group a point trains with: the whole worker group, or
    (for a point with fewer workers than the group) the sub-group of its first ranks."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    group: Any = None  # a torch.distributed ProcessGroup; None: the default (whole) group
    # A gloo group of the same ranks with a short timeout, for agreeing on a point's status.
    status_group: Any = None
    # The node this worker runs on (Ray's node id), to record how many nodes a point spanned.
    node: str = ""


@dataclass(frozen=True)
class GroupFacts:
    """Measured once per worker group and shared by its points: the device's peak FLOP/s (a table
    entry on GPU, the faster of a matmul and a convolution measured on this worker's CPU share)."""

    peak: Optional[flops_mod.PeakFlops] = None


def accumulation_context(model: nn.Module, micro_step: int, accumulation_steps: int):
    """Skip DDP's gradient all-reduce on every micro-step but the last of an optimizer step.

    Gradients then accumulate locally and are averaged across workers once per optimizer step.
    Without DDP (one worker) there is nothing to skip.
    """
    is_last = micro_step == accumulation_steps - 1
    if isinstance(model, nn.parallel.DistributedDataParallel) and not is_last:
        return model.no_sync()
    return contextlib.nullcontext()


def run_points(
    specs: Sequence[TrialSpec],
    ctx: WorkerContext,
    report: Callable[[Dict[str, Any]], None],
    group_start_time: Optional[float] = None,
    threads: int = 1,
    status_timeout: datetime.timedelta = STATUS_TIMEOUT,
) -> None:
    """Measure grid points one after another in this worker group, calling `report(result)` on every
    rank after each. The data and the per-group facts are loaded and measured once.

    A point with fewer workers than the group trains on ranks 0..n-1 (a sub-group) while the other
    ranks wait in `report`, Ray Train's own barrier: they hold no model and use no CPU meanwhile.

    Where a group's start-up goes (from `group_start_time`, the Tune trial's start) is logged on
    its first point; on every later point, the harness's gap since the previous one
    (`between_points_seconds`: reporting it, the checkpoint, Ray Train's report barrier).
    """
    entered = time.time()
    first = specs[0]
    device = telemetry.select(first.use_gpu, ctx.local_rank)
    splits = data_mod.load(first.data, first.model.input_shape)
    facts = group_facts(first, device, ctx, threads)
    subgroups = _subgroups(sorted({s.point.num_workers for s in specs}), ctx, status_timeout)
    nodes = _gather_objects(ctx.node, ctx) if ctx.node else []
    _freeze_long_lived_objects()
    ready = time.time()
    out_of_memory: List[GridPoint] = []
    previous_end: Optional[float] = None
    for i, spec in enumerate(specs):
        point_start = time.time()
        members = spec.point.num_workers
        cause = implied_oom(spec.point, out_of_memory)
        if cause is not None:
            # Every member saw the same agreed oom, so every member skips the same points.
            result = {
                "trial_key": spec.point.key,
                "status": "oom",
                "oom_implied_by": cause.key,
                "error": f"oom (implied): {cause.key} ran out of memory and this point needs at least as much",
            }
        elif ctx.rank < members:
            group, status_group = subgroups.get(members, (ctx.group, None))
            member = WorkerContext(ctx.rank, members, ctx.local_rank, group, status_group)
            result = run_point(spec, member, device, splits, facts)
            if result["status"] == "oom":
                out_of_memory.append(spec.point)
        else:
            result = {"trial_key": spec.point.key, "status": "idle"}  # rank 0's result is the one used
        result["worker_group_points"] = len(specs)
        if nodes:
            result["num_nodes"] = len(set(nodes[:members]))
        if i == 0 and group_start_time is not None:
            # Paid once by the group (Ray trial start to a worker ready to train): logged on the
            # group's first point only, so summing it over trials does not count it twice.
            result.update(startup_split(group_start_time, telemetry.process_start_time(), entered, ready))
        if previous_end is not None:
            result["between_points_seconds"] = point_start - previous_end
        # Stamped before reporting: the report's round trip is the harness's cost between points.
        previous_end = time.time()
        report(result)


def startup_split(group_start: float, process_start: Optional[float], entered: float, ready: float) -> Dict[str, float]:
    """A worker group's start-up, from the Tune trial's start to a worker ready to train, in its
    parts (wall-clock seconds; the clocks are one machine's when the trial and rank 0 share a node):
    launch, the Ray Train controller and worker actors up to the worker's process (0 when Ray reused
    a process it had started before the trial); init, that process's imports (torch, Ray Train)
    and Ray Train's process-group setup, up to the training function; setup, the group's own
    work: the dataset, the peak FLOP/s measurement, the sub-groups."""
    launched = min(max(process_start, group_start), entered) if process_start is not None else group_start
    split = {
        "worker_group_startup_seconds": ready - group_start,
        "worker_group_init_seconds": entered - launched,
        "worker_group_setup_seconds": ready - entered,
    }
    if process_start is not None:
        split["worker_group_launch_seconds"] = launched - group_start
    return split


@dataclass
class FrontierSpec:
    """A frontier search on one worker count: probes are `template` at another micro-batch, run for
    its warm-up steps only (the last one memory-tracked, under the budget)."""

    template: TrialSpec
    budget_bytes: Optional[int]  # None: the device's whole memory (GPU only)
    search: Dict[str, int]  # FrontierSearch's knobs (frontier.* in the config)
    upper: int  # the largest micro-batch the data allows: one worker's share of the training set
    # The grid the frontier is for: whether it will accumulate decides if that frontier is searched too.
    accumulation_steps: List[int] = field(default_factory=lambda: [1])
    global_batch_sizes: Optional[List[int]] = None

    @property
    def num_workers(self) -> int:
        return self.template.point.num_workers


def run_frontier(
    fspec: FrontierSpec,
    ctx: WorkerContext,
    report: Callable[[Dict[str, Any]], None],
    threads: int = 1,
) -> None:
    """Find the largest micro-batch that fits the budget on this worker group: each probe is reported
    as it ends (`probe_role` fit | verify), then the frontier itself (`frontier_micro_batch_size`).
    When the grid will accumulate gradients, a second search finds the frontier with accumulation
    (`frontier_accumulating_*`): the accumulated gradients live beside the activations, so it is
    lower. Every rank runs the same probes: their results agree, so their searches do too."""
    from sweeper.measure import frontier as frontier_mod

    template = fspec.template
    device = telemetry.select(template.use_gpu, ctx.local_rank)
    splits = data_mod.load(template.data, template.model.input_shape)
    status_group = None
    if ctx.world_size > 1:
        status_group = dist.new_group(ranks=list(range(ctx.world_size)), backend="gloo", timeout=STATUS_TIMEOUT)
    member = WorkerContext(ctx.rank, ctx.world_size, ctx.local_rank, ctx.group, status_group)
    _freeze_long_lived_objects()
    # No budget given: a GPU's whole memory (a CPU sweep is refused one before it starts).
    budget = fspec.budget_bytes if fspec.budget_bytes is not None else device.total_memory_bytes()
    w = fspec.num_workers
    summary: Dict[str, Any] = {"trial_key": f"frontier-w{w}", "status": "ok", "memory_budget_bytes": budget}
    probe_count = [0]

    def search(accumulation_steps: int, upper: int, prefix: str) -> Optional[int]:
        finder = frontier_mod.FrontierSearch(budget_bytes=budget, upper=upper, **fspec.search)
        while (size := finder.next_size()) is not None:
            point = GridPoint(size, accumulation_steps, w)
            spec = replace(
                template,
                point=point,
                steps=template.measure.warmup_steps,  # no timed windows: memory is all a probe measures
                memory_budget_bytes=budget,
                measure=replace(template.measure, memory_breakdown=True),
                evaluate=False,
                flop_count=None,
                profile=False,
            )
            role = finder.pending_role
            result = run_point(spec, member, device, splits)
            probe_count[0] += 1
            result.update(
                probe_role=role,
                trial_key=f"probe{probe_count[0]}-{point.key}",
                micro_batch_size=size,
                accumulation_steps=accumulation_steps,
            )
            if result["status"] == "failed":
                # Not a memory answer: the model or data is broken at this size; say so and stop.
                report(result)
                summary.update(status="failed", error=result.get("error"))
                return None
            finder.record(size, result.get("peak_memory_bytes") if result["status"] == "ok" else None)
            report(result)
        found = finder.result()
        summary.update({
            f"{prefix}micro_batch_size": found.micro_batch_size,
            f"{prefix}predicted_micro_batch_size": found.predicted_micro_batch_size,
            f"{prefix}fit_probes": found.num_fit_probes,
            f"{prefix}verifications": found.num_verifications,
            f"{prefix}reason": found.reason,
        })
        if found.model is not None:
            summary.update({
                f"{prefix}fixed_bytes": found.model.fixed_bytes,
                f"{prefix}per_sample_bytes": found.model.per_sample_bytes,
                f"{prefix}fit_r_squared": found.model.r_squared,
                f"{prefix}fit_max_relative_residual": found.model.max_relative_residual,
                f"{prefix}fit_points": found.model.num_points,
            })
        return found.micro_batch_size

    largest = search(1, fspec.upper, "frontier_")
    if largest is not None and largest >= 1 and frontier_mod.needs_accumulating(
        largest, w, fspec.accumulation_steps, fspec.global_batch_sizes
    ):
        search(2, largest, "frontier_accumulating_")
    report(summary)


def _freeze_long_lived_objects() -> None:
    # The collection after each point (its model and optimizer must go) would otherwise walk every
    # object torch, Ray and the data left behind: ~0.2 s a point here. They live as long as the
    # process, so move them out of the collector's sight.
    gc.collect()
    gc.freeze()


def implied_oom(point: GridPoint, out_of_memory: Sequence[GridPoint]) -> Optional[GridPoint]:
    """The point already out of memory that implies `point` is too: same workers, a micro-batch at
    least as large, and accumulation if it accumulated (from the second micro-step on, the
    accumulated gradients are alive beside the next micro-batch's activations)."""
    for seen in out_of_memory:
        if seen.num_workers != point.num_workers or seen == point:
            continue
        # Accumulating (any number of steps > 1) holds gradients beside the activations: more memory
        # than one micro-batch per step, the same whatever the number of steps.
        if point.micro_batch_size >= seen.micro_batch_size and (
            (point.accumulation_steps > 1) >= (seen.accumulation_steps > 1)
        ):
            return seen
    return None


def _subgroups(sizes: Sequence[int], ctx: WorkerContext, timeout: datetime.timedelta) -> Dict[int, Tuple[Any, Any]]:
    """For each point size n > 1: the process group of ranks 0..n-1 to train in (the whole group
    when n is its size) and a gloo group of the same ranks with a short timeout to agree on the
    point's status. Every rank takes part in creating each group, members or not."""
    groups: Dict[int, Tuple[Any, Any]] = {}
    for n in sizes:
        if n > 1:
            ranks = list(range(n))
            train_group = ctx.group if n == ctx.world_size else dist.new_group(ranks=ranks)
            status_group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)
            groups[n] = (train_group, status_group)
    return groups


def group_facts(spec: TrialSpec, device: telemetry.Device, ctx: WorkerContext, threads: int) -> GroupFacts:
    if spec.flop_count is None:
        return GroupFacts()
    if device.is_cuda:
        peak = flops_mod.device_peak(device.name, True, spec.flop_count, threads)
    else:
        # Every worker gets the same CPU share; one measurement on rank 0 stands for all of them.
        peak = flops_mod.device_peak(device.name, False, spec.flop_count, threads) if ctx.rank == 0 else None
        peak = _broadcast_object(peak, ctx)
    return GroupFacts(peak=peak)


def run_point(
    spec: TrialSpec,
    ctx: WorkerContext,
    device: Optional[telemetry.Device] = None,
    splits: Optional[data_mod.Splits] = None,
    facts: GroupFacts = GroupFacts(),
) -> Dict[str, Any]:
    """One grid point, its failure included: every rank agrees on the status (ok | oom | failed).

    A point that raises on every rank (bad model code, an OOM of the same size everywhere) is
    recorded and the group goes on to the next point. A rank that fails alone cannot agree with
    ranks still inside the step: the status exchange times out and the failure is re-raised, so
    Ray Train ends the worker group instead of leaving it hung in a collective.
    """
    start = time.time()
    status, error, result, raised = "ok", None, {}, None
    try:
        result = run_trial(spec, ctx, device, splits)
    except Exception as exc:  # recorded as the point's result, never silently dropped
        status, error, result = telemetry.failure(exc)
        raised = exc
    finally:
        gc.collect()  # the point's model and optimizer go before the next point is measured
        if device is not None:
            device.release_cached_memory()
    try:
        outcomes = _gather_objects((status, error), ctx, ctx.status_group)
    except Exception:
        if raised is not None:
            raise raised from None
        raise
    worst = max(outcomes, key=lambda o: STATUS_ORDER.index(o[0]))
    if worst[0] != "ok":
        simulated = {"oom_simulated": result["oom_simulated"]} if "oom_simulated" in result else {}
        result = {"status": worst[0], "error": worst[1] or "failed on another rank", **simulated}
    else:
        result["status"] = "ok"
        result.update(_flops_metrics(spec, result, facts))
        tracked = result.get("memory_tracked_peak_bytes")
        if spec.memory_estimate_bytes is not None and tracked:
            result["memory_estimated_peak_bytes"] = spec.memory_estimate_bytes
            result["memory_estimate_error"] = spec.memory_estimate_bytes / tracked - 1.0
    result["trial_key"] = spec.point.key
    result["started_at"] = start  # epoch seconds: the MLflow run's start, so its duration is the point's
    result["trial_seconds"] = time.time() - start
    return result


def run_trial(
    spec: TrialSpec,
    ctx: WorkerContext,
    device: Optional[telemetry.Device] = None,
    splits: Optional[data_mod.Splits] = None,
) -> Dict[str, Any]:
    """Train `spec.steps` optimizer steps and measure them. Every rank returns the same dict."""
    point, cfg = spec.point, spec.measure
    if point.num_workers != ctx.world_size:
        raise ValueError(f"grid point wants {point.num_workers} workers, world size is {ctx.world_size}")
    point_start = time.time()
    device = device or telemetry.select(spec.use_gpu, ctx.local_rank)
    splits = splits or data_mod.load(spec.data, spec.model.input_shape)

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
    )
    batches = iter(loader)
    step_losses = torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)

    def train_step(step: int, marks: Optional[List[Any]] = None, loaded: Optional[List[Any]] = None) -> None:
        # Whole optimizer steps, data loading included: internal per-phase timers alone would
        # overestimate throughput. Marks do not synchronize the device (events on GPU).
        for micro_step in range(point.accumulation_steps):
            inputs, targets = next(batches) if loaded is None else loaded[micro_step]
            # Batches loaded beforehand are copied, as a GPU copies them in from the host: the
            # tracked step then counts the batch on the device and not the host-side dataset.
            copy = loaded is not None
            inputs = inputs.to(device.torch_device, non_blocking=True, copy=copy)
            targets = targets.to(device.torch_device, non_blocking=True, copy=copy)
            if marks is not None:
                marks.append(device.mark())
            with accumulation_context(model, micro_step, point.accumulation_steps):
                loss = F.cross_entropy(model(inputs), targets)
                # Each micro-batch loss is a mean over its samples; dividing by the accumulation
                # steps makes the summed gradient the mean over the worker's whole share.
                (loss / point.accumulation_steps).backward()
            if marks is not None:
                marks.append(device.mark())
            step_losses[step] += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    bounds = measure.window_bounds(spec.steps, spec.first_timed_step, cfg.windows)
    window_starts = {start: i for i, (start, _) in enumerate(bounds)}
    window_stops = {stop - 1: i for i, (_, stop) in enumerate(bounds)}
    window_seconds: List[float] = [0.0] * len(bounds)
    step_marks: List[List[Any]] = []
    breakdown = None
    sampler_thread: Optional[telemetry.UtilizationSampler] = None
    utilization: Optional[telemetry.Utilization] = None
    first_step_time: Optional[float] = None
    train_start = time.perf_counter()
    clock = 0.0
    model.train()
    profiler = _profiler(spec, ctx, device)
    try:
        for step in range(spec.steps):
            if step in window_starts:
                if step == spec.first_timed_step:
                    sampler_thread = device.utilization_sampler(cfg.utilization_interval_seconds).start()
                    # Ranks leave warm-up (and rank 0 the profiler's trace export) at different
                    # times; line them up so the first window does not time the wait.
                    _barrier(ctx)
                device.synchronize()
                clock = time.perf_counter()
            if profiler is not None and step == cfg.warmup_steps:
                profiler.start()
            if step == cfg.warmup_steps - 1 and (cfg.memory_breakdown or budget_mode == "simulated"):
                # A warm-up step, so the tracker's cost is never timed; after step 0, so the
                # optimizer state exists as it does for every later step. Every step has the same
                # shapes, so this step's peak is every step's: a CPU budget is enforced on it.
                from sweeper.measure import memory  # loads DTensor (~1.5 s): only when the breakdown is on

                # Loaded outside the tracker: indexing an in-memory dataset yields views of its
                # whole storage, which the tracker would count as device memory.
                loaded = [next(batches) for _ in range(point.accumulation_steps)]
                breakdown = memory.track_step(
                    model,
                    optimizer,
                    lambda step=step, loaded=loaded: train_step(step, loaded=loaded),
                    device.torch_device,
                    budget_bytes=spec.memory_budget_bytes if budget_mode == "simulated" else None,
                )
            elif step >= spec.first_timed_step:
                marks = [device.mark()]
                train_step(step, marks)
                marks.append(device.mark())
                step_marks.append(marks)
            else:
                train_step(step)
            if profiler is not None and cfg.warmup_steps <= step < spec.first_timed_step:
                profiler.step()
                if step == spec.first_timed_step - 1:
                    profiler.stop()
                    profiler = None
            if first_step_time is None:
                device.synchronize()
                first_step_time = time.time()
            if step in window_stops:
                device.synchronize()
                window_seconds[window_stops[step]] = time.perf_counter() - clock
    finally:
        # Also on failure: neither may outlive this point into the next one's measurement.
        if sampler_thread is not None:
            utilization = sampler_thread.stop()
        if profiler is not None:
            profiler.stop()
    train_seconds = time.perf_counter() - train_start

    # Mean over micro-steps, then over workers: the loss of the whole global batch at each step.
    step_losses /= point.accumulation_steps
    _all_reduce(step_losses, ctx, dist.ReduceOp.SUM)
    step_losses /= ctx.world_size

    result: Dict[str, Any] = {
        "train_loss": step_losses.cpu().tolist(),
        "optimizer_steps": spec.steps,
        "samples_seen": spec.steps * point.global_batch_size,
        "device": str(device.torch_device.type),
        "train_seconds": train_seconds,
    }
    if first_step_time is not None:
        result["startup_seconds"] = first_step_time - point_start
    # Memory: the largest over workers, each under a name that says what it measures.
    result.update(_reduce(dict(device.memory_metrics()), ctx, device, dist.ReduceOp.MAX))
    if breakdown is not None:
        # The whole breakdown of the worker with the largest peak, so its parts still add up.
        breakdowns = _gather_objects(breakdown.as_metrics(), ctx)
        result.update(max(breakdowns, key=lambda b: b["memory_tracked_peak_bytes"]))
    if device.is_cuda:
        result["peak_memory_bytes"] = result["cuda_max_memory_allocated_bytes"]
        result["memory_measure"] = "cuda: torch.cuda.max_memory_allocated over the trial, largest worker"
    elif breakdown is not None:
        result["peak_memory_bytes"] = result["memory_tracked_peak_bytes"]
        result["memory_measure"] = (
            "cpu: peak tensor memory of one training step (torch MemTracker), largest worker; "
            "process RSS above its pre-trial baseline is cpu_rss_peak_above_baseline_bytes"
        )
    elif "cpu_rss_peak_above_baseline_bytes" in result:
        result["peak_memory_bytes"] = result["cpu_rss_peak_above_baseline_bytes"]
        result["memory_measure"] = (
            "cpu: process RSS high-water mark above its pre-trial baseline (measure.memory_breakdown=false, "
            "so no tensor-level peak), largest worker"
        )

    if bounds:
        # The slowest rank sets the pace of a data-parallel step.
        seconds = torch.tensor(window_seconds, dtype=torch.float64, device=device.torch_device)
        _all_reduce(seconds, ctx, dist.ReduceOp.MAX)
        tp = measure.summarize(
            seconds.cpu().tolist(),
            [stop - start for start, stop in bounds],
            point.global_batch_size,
            cfg.stable_windows,
            cfg.stability_tolerance,
        )
        result.update(
            samples_per_second=tp.samples_per_second,
            samples_per_second_cv=tp.samples_per_second_cv,
            step_time_seconds=tp.step_time_seconds,
            window_samples_per_second=tp.window_samples_per_second,
            throughput_stable=tp.stable,
            timing_windows=len(bounds),
            stable_windows_used=tp.stable_window_count,
        )
        phases = measure.phase_split([_phases(device, marks) for marks in step_marks])
        result.update(_reduce(phases, ctx, device, dist.ReduceOp.SUM, mean=True))
    if utilization is not None:
        util = utilization.as_metrics()
        maxima = {k: v for k, v in util.items() if k.endswith("_max")}
        means = {k: v for k, v in util.items() if not k.endswith("_max") and k != "utilization_samples"}
        result.update(_reduce(maxima, ctx, device, dist.ReduceOp.MAX))
        result.update(_reduce(means, ctx, device, dist.ReduceOp.SUM, mean=True))
        if utilization.gpu_unavailable_reason:
            result["gpu_telemetry_note"] = f"no GPU utilization: {utilization.gpu_unavailable_reason}"
    if spec.profile and ctx.rank == 0:
        result["profile_trace_dir"] = _trace_dir(spec)
    if budget_mode != "none":
        result["memory_budget_bytes"] = spec.memory_budget_bytes
        result["memory_budget_mode"] = budget_mode
    if spec.evaluate and splits.val is not None and splits.has_real_labels:
        inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        used = recalibrate_batchnorm(
            inner, splits.train, point.micro_batch_size, spec.train.bn_recalibration_samples, spec.train.seed, device
        )
        if used:
            result["bn_recalibration_samples"] = used
        result["val_accuracy"] = evaluate(model, splits.val, device, ctx)
    return result


def recalibrate_batchnorm(
    model: nn.Module, dataset, micro_batch_size: int, samples: int, seed: int, device: telemetry.Device
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
    torch.optim.swa_utils.update_bn(loader, model, device=device.torch_device)
    return used


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


def _phases(device: telemetry.Device, marks: List[Any]) -> Tuple[float, float, float]:
    """(data, forward_backward, optimizer) seconds of one step from its marks:
    [start, (after data, after backward) per micro-step, end]."""
    data = compute = 0.0
    previous = marks[0]
    for loaded, backward_done in zip(marks[1:-1:2], marks[2:-1:2]):
        data += device.seconds_between(previous, loaded)
        compute += device.seconds_between(loaded, backward_done)
        previous = backward_done
    return data, compute, device.seconds_between(previous, marks[-1])


def _flops_metrics(spec: TrialSpec, result: Dict[str, Any], facts: GroupFacts) -> Dict[str, Any]:
    count = spec.flop_count
    if count is None or "samples_per_second" not in result:
        return {}
    achieved = count.train_per_sample * result["samples_per_second"]
    out: Dict[str, Any] = {
        "flops_per_sample_forward": count.forward_per_sample,
        "flops_per_sample_train": count.train_per_sample,
        "achieved_flops_per_second": achieved,
    }
    if facts.peak is not None:
        # Every worker has the same device: the trial's peak is one device's times the workers,
        # and its utilization is each device's share of the work against one device's peak.
        out.update(
            peak_flops_per_second=facts.peak.flops_per_second * spec.point.num_workers,
            peak_flops_source=facts.peak.source,
            mfu=flops_mod.mfu(achieved / spec.point.num_workers, facts.peak),
        )
    return out


def _profiler(spec: TrialSpec, ctx: WorkerContext, device: telemetry.Device):
    """torch.profiler for the untimed steps after warm-up (rank 0; one profiler warm-up step, then
    `profile_steps` recorded), written as a Chrome trace that TensorBoard's profiler plugin and
    Perfetto open. None when not profiling."""
    if not spec.profile or ctx.rank != 0:
        return None
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


def _trace_dir(spec: TrialSpec) -> str:
    return os.path.join(spec.profile_dir or "profile", spec.point.key)


def _reduce(
    values: Dict[str, float], ctx: WorkerContext, device: telemetry.Device, op, mean: bool = False
) -> Dict[str, float]:
    """Reduce a dict of numbers (same keys on every rank) across ranks."""
    if not values:
        return {}
    names = sorted(values)
    tensor = torch.tensor([float(values[n]) for n in names], dtype=torch.float64, device=device.torch_device)
    _all_reduce(tensor, ctx, op)
    if mean:
        tensor /= ctx.world_size
    return {
        n: (int(v) if isinstance(values[n], int) else v) for n, v in zip(names, tensor.cpu().tolist())
    }


def _barrier(ctx: WorkerContext) -> None:
    if ctx.world_size > 1:
        dist.barrier(group=ctx.group)


def _all_reduce(tensor: torch.Tensor, ctx: WorkerContext, op) -> None:
    if ctx.world_size > 1:
        dist.all_reduce(tensor, op=op, group=ctx.group)


def _gather_objects(obj: Any, ctx: WorkerContext, group: Any = None) -> List[Any]:
    if ctx.world_size == 1:
        return [obj]
    out: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=group or ctx.group)
    return out


def _broadcast_object(obj: Any, ctx: WorkerContext) -> Any:
    if ctx.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ctx.group)
    return box[0]
