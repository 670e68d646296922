"""One grid point on one data-parallel worker: train `spec.steps` optimizer steps and measure them
(timed windows, memory, utilization, an optional profiler trace, divergence, evaluations and the time
to a target) into a PointResult. Every rank returns the same result.

Knows torch only, like the rest of worker/.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from sweeper.measure import collective_count, telemetry, timing
from sweeper.schema import PointResult
from sweeper.worker import collectives as comm
from sweeper.worker import divergence, gns, sharding
from sweeper.worker.deadline import Deadline
from sweeper.worker.divergence import Diverged
from sweeper.worker import evaluate as evaluation
from sweeper.worker.evaluate import Progress
from sweeper.worker.recipe_figures import emulation, items_figures, recipe_figures, sync_figures
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.step import Training, setup
from sweeper.workloads import datasets, models

TRACE_FILE = "rank0.pt.trace.json.gz"


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
        self.closed: List[int] = []  # windows timed to their end (a point stopped early has fewer)
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
        self.closed.append(window)

    def leave_out(self, seconds: float) -> None:
        """Work inside an open window that is not training (an evaluation): not timed as throughput."""
        self._opened += seconds

    def stop(self) -> None:
        # Also on failure: the sampler may not outlive this point into the next one's measurement.
        if self.sampler is not None and self.utilization is None:
            self.utilization = self.sampler.stop()


def train_point(
    spec: PointSpec,
    ctx: WorkerContext,
    device: Optional[telemetry.Device] = None,
    splits: Optional[datasets.Splits] = None,
    deadline: Optional[Deadline] = None,
) -> PointResult:
    """Train `spec.steps` optimizer steps and measure them (with train.batch_schedule, each span in turn).
    Every rank returns the same result. `deadline`, if given, is projected from the warm-up once the first
    timed window opens."""
    if spec.later_spans:
        return _train_schedule(spec, ctx, device, splits, deadline)
    with sharding.process_group_for(spec.point.parallelism, ctx.world_size):
        return _train_span(spec, ctx, device, splits, deadline)


def _train_schedule(spec: PointSpec, ctx: WorkerContext, device: Optional[telemetry.Device],
                    splits: Optional[datasets.Splits], deadline: Optional[Deadline]) -> PointResult:
    """train.batch_schedule: each span trains on from the one before's training state (handed over in
    memory by the same capture and apply a checkpoint on disk uses), at its own layout and LR. The point's
    result is the last span's (its throughput and memory, at the schedule's last layout) with the whole
    loss curve, the samples and time of every span, and the schedule."""
    from dataclasses import replace as with_

    splits = splits or datasets.load(spec.data, spec.model.input_shape)
    spans = [(0, spec.point, spec.lr, spec.steps)]
    spans += [(s.start_samples, s.point, s.lr, s.steps) for s in spec.later_spans]
    # The LR schedule spans the whole schedule's samples, whichever span trains.
    budget = spec.schedule_samples or spans[-1][0] + spans[-1][3] * spans[-1][1].global_batch_size
    first = with_(spec, later_spans=[], save_state_to=None, schedule_samples=budget)
    losses: List[float] = []
    seconds = 0.0
    start, result = None, None
    actual: List[Tuple[int, int]] = []  # (global batch, optimizer steps) each span did
    earlier: List[PointResult] = []  # the spans before the last one run, for their evaluations
    for i, (_, point, lr, steps) in enumerate(spans):
        last = i == len(spans) - 1
        if i and deadline is not None:  # each span's deadline is projected from its own pace
            deadline.arm(spec.point.key)
        span = first if i == 0 else with_(first, point=point, lr=lr, steps=steps, start_from=None)
        # Every span evaluates on the point's cadence; only the last is judged (did_not_learn, an unrecovered
        # spike): the point's end. A target reached stops the point in whichever span it is reached.
        span = with_(span, save_state_to=spec.save_state_to if last else None, partial=spec.partial or not last)
        out = _train_span(span, ctx, device, splits, deadline, start, hand_over=not last)
        result, start = (out, None) if last else out
        losses += list(result["train_loss"] or [])
        seconds += result.cost.train_seconds or 0.0
        actual.append((point.global_batch_size, int(result.get("optimizer_steps") or 0)))
        if result.status != "ok" or (not last and result.progress.reached_target and spec.eval.stop_at_target):
            break
        if not last:
            earlier.append(result)
    done = spans[:i + 1]
    samples = sum(batch * n for batch, n in actual)
    result.noise.follow([r.noise for r in earlier])
    result.divergence.follow([r.divergence for r in earlier], sum(n for _, n in actual[:-1]))
    result.train_loss = losses
    result.update(dict(train_seconds=seconds, samples_seen=samples, optimizer_steps=sum(n for _, n in actual)))
    if models.positions(spec.model):
        result.update(dict(tokens_seen=samples * models.positions(spec.model)))
    result.schedule.update(dict(
        schedule_start_samples=[float(s) for s, *_ in done],
        schedule_global_batch_size=[float(p.global_batch_size) for _, p, _, _ in done],
        schedule_accumulation_steps=[float(p.accumulation_steps) for _, p, _, _ in done],
        schedule_steps=[float(n) for _, n in actual], schedule_lr=[float(lr) for _, _, lr, _ in done]))
    result.trial_key = spec.point.key
    return result


def _train_span(spec: PointSpec, ctx: WorkerContext, device: Optional[telemetry.Device] = None,
                splits: Optional[datasets.Splits] = None, deadline: Optional[Deadline] = None, start=None,
                hand_over: bool = False):
    """One run of `spec.steps` steps (from `start`, a Snapshot in memory, when given). With `hand_over`,
    returns (result, the training state it ended at) for the next span."""
    if spec.point.num_workers != ctx.world_size:
        raise ValueError(f"grid point wants {spec.point.num_workers} workers, world size is {ctx.world_size}")
    cfg = spec.measure
    device = device or telemetry.select(spec.use_gpu, ctx.local_rank)
    run = setup(spec, ctx, device, splits or datasets.load(spec.data, spec.model.input_shape), start)
    track_memory = cfg.memory_breakdown or run.budget_mode == "simulated"
    roles = timing.step_roles(spec.steps, cfg.warmup_steps, spec.profile_steps, cfg.windows, track_memory)
    clock = Clock(run, sum(role.opens_window is not None for role in roles), deadline)
    profiler = Profiling(profiler_of(spec, ctx, device))
    progress = Progress.of(spec)
    progress.start_samples, progress.start_steps = run.start_samples, run.steps_before
    progress.start_seconds = run.seconds_before
    if _has_accuracy(run):  # a run that evaluates records the point's evaluations before it first
        progress.carry(run.history)
    train_start, loop_started = time.perf_counter(), time.time()
    run.loop_started = loop_started
    run.model.train()
    try:
        breakdown, diverged = _loop(run, roles, clock, profiler, progress, loop_started)
    finally:
        clock.stop()
        profiler.stop()
    train_seconds = time.perf_counter() - train_start
    # Saved at the step boundary the loop ended on, before the final evaluation draws from torch's RNG.
    saved = _save_state(run, spec.save_state_to, progress, clock) if spec.save_state_to and diverged is None else None
    handed = _capture(run, progress, clock) if hand_over and diverged is None else None
    result = result_of(run, clock, breakdown, train_seconds, loop_started, progress, diverged)
    _with_final_evaluation(run, progress, result, saved, handed)
    _state_figures(result, run, saved)
    return (result, handed) if hand_over else result


def _with_final_evaluation(run: Training, progress: Progress, result: PointResult, saved, handed) -> None:
    """The run's final evaluation (after the state was taken: it draws from torch's RNG, which the state
    must hold as the training left it) added to the history of the state saved and handed over, so the
    run that goes on from it records it as the point's."""
    from sweeper.worker import state

    snapshots = [s for s in (saved, handed) if isinstance(s, state.Snapshot)]
    if not snapshots or not progress.curve:
        return
    reached = None
    if result.progress.reached_target:
        reached = {name: result.progress.get(name) for name in TARGET_FIGURES}
    evaluations, seconds, target = _evaluation_history(run, progress, reached)
    for snapshot in snapshots:
        snapshot.history.evaluations, snapshot.history.eval_seconds = evaluations, seconds
        snapshot.history.target, snapshot.history.target_of = target, progress.target_of
    if isinstance(saved, state.Snapshot) and run.ctx.rank == 0:
        state.write_history(saved.history, run.spec.save_state_to)


TARGET_FIGURES = ("steps_to_target", "samples_to_target", "time_to_target_seconds", "eval_seconds_to_target")


def _evaluation_history(run: Training, progress: Progress, reached: Optional[Dict[str, float]]):
    """(evaluations, their seconds, the target's figures) of the point up to here: the checkpoint's this run
    went on from first (unless it took them in already: Progress.carry), then its own; the target where first
    reached (`reached`: this run's figures, if it reached it)."""
    from sweeper.worker.state import History

    before = run.history if run.history is not None and not progress.carried else History()
    target = progress.reached_before or (before.target if before.target_of == progress.target_of else None)
    return (list(before.evaluations) + list(progress.curve), before.eval_seconds + progress.seconds,
            target or reached)


def _capture(run: Training, progress: Progress, clock: Clock):
    from sweeper.worker.step import capture

    return capture(run, _history(run, progress, clock))


def _history(run: Training, progress: Progress, clock: Clock):
    """Everything up to here the next run goes on from: each step's loss and noise estimates, the steps
    before this run first (collectives: every rank calls it), the evaluations and the target's figures."""
    from sweeper.worker.state import History

    noise = [(e.trace_sigma, e.grad_sq_norm) for e in _noise_estimates(run)]
    evaluations, seconds, target = _evaluation_history(run, progress,
                                                       _target_figures(progress, _step_time_so_far(run, clock)))
    return History(divergence.prior_losses(run) + divergence.global_losses(run), _prior_noise(run) + noise,
                   evaluations, seconds, target, progress.target_of)


def _prior_noise(run: Training) -> List[Tuple[float, float]]:
    return list(run.history.noise) if run.history is not None else []


def _save_state(run: Training, folder: str, progress: Progress, clock: Clock):
    """Rank 0 writes the training state into `folder` (DDP keeps every rank's alike). A write that fails
    (a full disk, an unwritable path) is the checkpoint's error, recorded on the point: raising on rank 0
    alone would leave the other ranks waiting in the result's collectives."""
    from sweeper.worker import state
    from sweeper.worker.step import capture

    snapshot = capture(run, _history(run, progress, clock))
    if run.ctx.rank != 0:
        return snapshot
    try:
        return state.write(snapshot, folder)
    except (OSError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _state_figures(result: PointResult, run: Training, saved) -> None:
    spec = run.spec
    if spec.start_from is not None:
        result.state.update(dict(continued_from=spec.start_from, start_samples=run.start_samples,
                                 checkpoint_read_seconds=run.read_seconds))
    if isinstance(saved, str):
        result.state.update(dict(checkpoint_error=saved))
    elif saved is not None:
        result.state.update(dict(saved_state_path=spec.save_state_to, checkpoint_samples=saved.position.samples_seen,
                                 checkpoint_write_seconds=saved.write_seconds, checkpoint_bytes=saved.bytes))
    if run.saved_on_the_way:  # spec.save_states_at: where each was written, or why not
        errors = [f"at {at}: {s}" for at, s in run.saved_on_the_way if isinstance(s, str)]
        written = [(at, s) for at, s in run.saved_on_the_way if not isinstance(s, str)]
        result.state.update(dict(saved_at_samples=[float(at) for at, _ in written],
                                 saved_write_seconds=[s.write_seconds for _, s in written
                                                      if s.write_seconds is not None]))
        if errors:
            result.state.checkpoint_error = "; ".join(errors)


def _loop(run: Training, roles: List[timing.StepRole], clock: Clock, profiler: "Profiling", progress: Progress,
          since: float) -> Tuple[Any, Optional[Diverged]]:
    """The steps, each in its role; evaluations when due; divergence checked where the device is
    synchronized anyway (the window edges). Returns the memory breakdown and the divergence, if any."""
    breakdown, check = None, run.spec.divergence
    checked = -1  # the last step boundary checked: a window's close is the next one's opening
    for step, role in enumerate(roles):
        if role.opens_window is not None:
            # Checked before the clock starts: the check's collectives and reads stay out of the window.
            if checked != step and (diverged := divergence.check(run, check)):
                return breakdown, diverged
            clock.open(role.opens_window)
        instrumented = role.kind in (timing.TRACKED, timing.PROFILED) or role.starts_profiler or role.stops_profiler
        began = time.perf_counter()
        if role.starts_profiler:
            profiler.start()
        # The last warm-up step's collectives, counted where they reach the process group (untimed).
        counter = collective_count.CollectiveCounter() if step == run.spec.measure.warmup_steps - 1 else None
        with counter if counter is not None else contextlib.nullcontext():
            if role.kind == timing.TRACKED:
                breakdown = run.tracked_step(step)
            elif role.kind == timing.TIMED:
                clock.timed_step(step)
            else:
                run.step(step)
        if counter is not None:
            run.collectives = counter.calls
        profiler.after(role)
        if instrumented:
            progress.instrumented_seconds += time.perf_counter() - began
            progress.instrumented_steps += 1
        clock.after_step()
        stop = False
        if progress.due(step + 1) and step + 1 < len(roles) and _has_accuracy(run):
            clock.leave_out(_evaluate(run, progress, since))
            stop = progress.stop
        # Saved after an evaluation due at the same step, which the checkpoint then holds (the uninterrupted
        # run evaluates there too: the random state saved is the one it goes on with).
        at = run.start_samples + (step + 1) * run.spec.point.global_batch_size
        if at in run.spec.save_states_at and step + 1 < len(roles):
            began = time.perf_counter()
            run.saved_on_the_way.append((at, _save_state(run, run.spec.save_states_at[at], progress, clock)))
            clock.leave_out(time.perf_counter() - began)
        if stop:
            return breakdown, None
        if role.closes_window is not None:
            clock.close(role.closes_window)
            if diverged := divergence.check(run, check):
                return breakdown, diverged
            checked = step + 1
    return breakdown, divergence.check(run, check, final=not run.spec.partial)


def _has_accuracy(run: Training) -> bool:
    spec, splits = run.spec, run.splits
    return spec.evaluate and splits.val is not None and splits.has_real_labels


def _evaluate(run: Training, progress: Progress, since: float) -> float:
    spec = run.spec
    # The last step's queued device work finishes first: the seconds returned are left out of the
    # window, and must hold the evaluation alone, not the training it waited for.
    run.device.synchronize()
    return progress.evaluate(run.inner_model, run.splits.train,
                             run.splits.val, spec.point.micro_batch_size, spec.train.bn_recalibration_samples,
                             spec.seed, run.device.torch_device, run.ctx, run.steps_done, since)


class Profiling:
    """The profiler (or none) through the steps: started, stepped over the profiled steps, stopped once."""

    def __init__(self, profiler):
        self.profiler = profiler

    def start(self) -> None:
        if self.profiler is not None:
            self.profiler.start()

    def after(self, role: timing.StepRole) -> None:
        if self.profiler is None:
            return
        if role.kind == timing.PROFILED:
            self.profiler.step()
        if role.stops_profiler:
            self.stop()

    def stop(self) -> None:
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.stop()


def result_of(run: Training, clock: "Clock", breakdown, train_seconds: float, loop_started: float,
            progress: Progress, diverged: Optional[Diverged]) -> PointResult:
    """The point's result, section by section: loss, cost, memory, throughput, utilization, recipe,
    accuracy and its progress, divergence."""
    spec = run.spec
    result = PointResult(trial_key=spec.point.key, device=run.device.torch_device.type,
                         train_loss=divergence.global_losses(run))
    result.cost.update(dict(
        train_seconds=train_seconds,
        optimizer_steps=run.steps_done,
        samples_seen=run.steps_done * spec.point.global_batch_size,
    ))
    positions = models.positions(spec.model)
    if positions is not None:
        result.cost.tokens_seen = result.cost.samples_seen * positions
    if clock.first_step_time is not None:
        result.cost.startup_seconds = clock.first_step_time - run.started
    result.cost.mesh = sharding.mesh_text(run.model) if spec.point.parallelism == "hsdp" else None
    result.cost.update(sharding.traffic(run.model, spec.point, run.ctx))  # zero1, hsdp: bytes per step (collective)
    _memory(result, run, breakdown)
    _throughput(result, run, clock)
    _utilization(result, run, clock.utilization)
    recipe_figures(result, run, clock.first_step_time, loop_started)
    items_figures(result, run)
    emulation(result, run)
    sync_figures(result, run)
    if spec.profile and run.ctx.rank == 0:
        result.profile_trace_dir = _trace_dir(spec)
    if diverged is None or diverged.reason != divergence.NONFINITE:
        _accuracy(result, run, progress, loop_started)
    _progress(result, progress)
    _divergence(result, run, diverged)
    _noise_scale(result, run)
    return result


def _noise_scale(result: PointResult, run: Training) -> None:
    """B_simple from the point's micro-gradients (worker.gns), or why there is none."""
    spec, point = run.spec, run.spec.point
    if not spec.gns.enabled:
        return
    if run.micro_grads is None:
        result.noise.gns_note = ("no estimate: one micro-batch per step (accumulation x workers = 1); "
                                 "a point with accumulation or workers > 1 measures it")
        return
    run.micro_grads.remove()
    n = len(run.splits.train)
    steps = _noise_estimates(run)
    if not steps:
        result.noise.gns_note = "no estimate: no step had finite gradients"
        return
    # The decay per optimizer step stays gns.ema_beta when only one step in every_steps is measured. A
    # continued run's moving averages go on from the steps before it (its checkpoint's history).
    before = [gns.Estimate(g2, trace) for trace, g2 in _prior_noise(run)]
    ema = gns.ema_ratio(before + steps, spec.gns.ema_beta ** spec.gns.every_steps)[len(before):]
    trace = sum(e.trace_sigma for e in steps) / len(steps)
    g2 = sum(e.grad_sq_norm for e in steps) / len(steps)
    if not math.isfinite(ema[-1]) or g2 <= 0:
        result.noise.gns_note = ("no estimate: the gradient's squared norm averaged to <= 0 (the noise "
                                 "swamps the signal: more steps or a larger global batch)")
    result.noise.update(dict(
        gns_b_simple=ema[-1] if math.isfinite(ema[-1]) else None, gns_b_simple_ema=ema,
        gns_b_simple_train_avg=trace / g2 if g2 > 0 else None,
        gns_trace_sigma_per_step=[e.trace_sigma for e in steps],
        gns_grad_sq_norm_per_step=[e.grad_sq_norm for e in steps],
        gns_trace_sigma=trace, gns_grad_sq_norm=g2, gns_small_batch=point.micro_batch_size,
        gns_big_batch=point.global_batch_size, gns_train_samples=n, gns_every_steps=spec.gns.every_steps,
    ))


def _noise_estimates(run: Training) -> List[gns.Estimate]:
    """This run's per-step noise estimates so far, the finite ones (one all-reduce: every rank calls it);
    [] when it measures none (one micro-batch per step, or gns.enabled false)."""
    if run.micro_grads is None:
        return []
    point = run.spec.point
    done, k = run.steps_done, point.accumulation_steps * point.num_workers
    small = run.micro_grads.mean_sq(run.ctx, k, done, run.scale_values()[:done] if run.scaler is not None else None)
    big = (run.grad_norms[:done] ** 2).cpu().tolist()
    measured = run.micro_grads.measured(done)  # gns.every_steps: the steps whose micro-gradients were read
    small, big = [small[i] for i in measured], [big[i] for i in measured]
    n = len(run.splits.train)
    steps = [gns.estimate(s, g, point.micro_batch_size, point.global_batch_size, n) for s, g in zip(small, big)]
    return [e for e in steps if math.isfinite(e.grad_sq_norm) and math.isfinite(e.trace_sigma)]


def _memory(result: PointResult, run: Training, breakdown) -> None:
    """Memory: the largest over workers, each figure under a name that says what it measures; the
    headline peak_memory_bytes is the best measure this device has."""
    memory, device, spec = result.memory, run.device, run.spec
    memory.update(comm.reduce_numbers(dict(device.memory_metrics()), run.ctx, device.torch_device, dist.ReduceOp.MAX))
    if breakdown is not None:
        # The whole breakdown of the worker with the largest peak, so its parts still add up.
        breakdowns = comm.gather_objects(breakdown.as_metrics(), run.ctx)
        memory.update(max(breakdowns, key=lambda b: b["memory_tracked_peak_bytes"]))
    if run.ctx.world_size > 1:  # how the layout split the optimizer state (zero1: by whole tensors)
        held = comm.gather_objects(sharding.optimizer_state_bytes(run.optimizer), run.ctx)
        memory.memory_optimizer_state_bytes_by_rank = [float(b) for b in held]
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
    if not clock.closed:
        return
    device, spec = run.device, run.spec
    # The slowest rank sets the pace of a data-parallel step.
    seconds = torch.tensor([clock.window_seconds[i] for i in clock.closed], dtype=torch.float64,
                           device=device.torch_device)
    comm.all_reduce(seconds, run.ctx, dist.ReduceOp.MAX)
    tp = _windows(run, clock, seconds.cpu().tolist())
    result.throughput.update(dict(
        samples_per_second=tp.samples_per_second,
        samples_per_second_cv=tp.samples_per_second_cv,
        step_time_seconds=tp.step_time_seconds,
        window_samples_per_second=tp.window_samples_per_second,
        throughput_stable=tp.stable,
        timing_windows=len(clock.closed),
        stable_windows_used=tp.stable_window_count,
    ))
    positions = models.positions(spec.model)
    if positions is not None and tp.samples_per_second is not None:
        result.throughput.tokens_per_second = tp.samples_per_second * positions
    phases = timing.phase_split([_phases(device, marks) for marks in clock.step_marks])
    phases = comm.reduce_numbers(phases, run.ctx, device.torch_device, dist.ReduceOp.SUM, mean=True)
    result.throughput.update(phases)
    result.throughput.data_wait_fraction = timing.data_wait_fraction(phases)


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


def _accuracy(result: PointResult, run: Training, progress: Progress, since: float) -> None:
    """The final evaluation (the last one during training, when it came after the last step)."""
    if not _has_accuracy(run):
        return
    if progress.evaluated_at != run.samples_seen:
        _evaluate(run, progress, since)
    evaluation.record(result.accuracy, progress, run.splits, models.is_language_model(run.spec.model))


def _progress(result: PointResult, progress: Progress) -> None:
    if not progress.curve:
        return
    result.progress.update(dict(
        val_accuracy_curve=[(e[0], e[1]) for e in progress.curve],
        val_loss_curve=[(e[0], e[2]) for e in progress.curve],
        evaluations=len(progress.curve),
        eval_seconds=progress.seconds,
    ))
    # The wall clock at each evaluation (a bench reads a time to a target from it, the target chosen after
    # the run): the instrumented steps counted at the point's step time, as the time to target counts them.
    clocked = [e for e in progress.curve if len(e) >= 7]
    step_time = result.throughput.step_time_seconds or 0.0
    if clocked:
        result.progress.update(dict(
            val_wall_seconds_curve=[(e[0], e[3] - e[4] + e[5] * step_time) for e in clocked],
            val_eval_seconds_curve=[(e[0], e[6]) for e in clocked]))
    if progress.has_target:
        result.progress.reached_target = int(progress.reached_before is not None or progress.reached is not None)
    target = progress.reached_before or _target_figures(progress, result.throughput.step_time_seconds)
    if target is not None:
        result.progress.update(target)


def _target_figures(progress: Progress, step_time: Optional[float]) -> Optional[Dict[str, float]]:
    """Steps, samples, seconds and evaluating seconds to the target this run reached (None: not reached),
    the instrumented steps' excess over as many plain steps (at `step_time`) taken out of the seconds."""
    if progress.reached is None:
        return None
    steps, seconds, evaluating, instrumented, count = progress.reached
    if step_time is not None:
        seconds -= max(0.0, instrumented - count * step_time)
    # Samples: the steps before this run at their own global batches (start_samples), then this run's.
    samples = progress.start_samples + (steps - progress.start_steps) * progress.samples_per_step
    return dict(steps_to_target=steps, samples_to_target=samples, time_to_target_seconds=seconds,
                eval_seconds_to_target=evaluating)


def _step_time_so_far(run: Training, clock: Clock) -> Optional[float]:
    """This rank's step time over the windows timed so far (a checkpoint's target figures), or None."""
    if not clock.closed:
        return None
    return _windows(run, clock, [clock.window_seconds[i] for i in clock.closed]).step_time_seconds


def _windows(run: Training, clock: Clock, seconds: List[float]):
    """The closed windows' summary (timing.summarize) from their `seconds`."""
    cfg, spec = run.spec.measure, run.spec
    bounds = timing.window_bounds(spec.steps, spec.first_timed_step, cfg.windows)
    return timing.summarize(seconds, [bounds[i][1] - bounds[i][0] for i in clock.closed],
                            spec.point.global_batch_size, cfg.stable_windows, cfg.stability_tolerance)


def _divergence(result: PointResult, run: Training, diverged: Optional[Diverged]) -> None:
    """Diverged during training (status `diverged`), or trained to an accuracy not separated from a
    guess (status `did_not_learn`); a loss spike it came back from is a warning."""
    spec = run.spec
    if run.grad_norms is not None:
        result.divergence.grad_norm = run.grad_norms[: run.steps_done].cpu().tolist()
    before = divergence.prior_losses(run)
    spike = divergence.recovered_spike(before + list(result["train_loss"] or []), spec.divergence, len(before))
    if spike is not None:
        result.divergence.update(dict(
            spike_at_step=spike.step, spike_peak_over_mean=spike.peak_over_mean,
            spike_recovered_after_steps=spike.recovered_after_steps,
            spike_warning=divergence.spike_warning(spike, spec.divergence)))
    if diverged is None and not spec.partial:
        # A spike with no steps left to come back in: its height kept, the point judged by its quality.
        unresolved = divergence.unresolved_spike(before + list(result["train_loss"] or []), spec.divergence,
                                                 len(before))
        if unresolved is not None:
            result.divergence.update(dict(
                spike_at_step=unresolved.step, spike_peak_over_mean=unresolved.peak_over_mean,
                spike_recovered_after_steps=None,
                spike_warning=divergence.unresolved_warning(unresolved, spec.divergence)))
    accuracy, samples = result.accuracy.val_accuracy, result.accuracy.val_samples
    if diverged is None and not spec.partial and samples:
        diverged = divergence.worse_than_guess(result.accuracy.val_loss, result.accuracy.val_loss_se,
                                               run.splits.num_classes, run.steps_done, spec.divergence)
    if diverged is not None:
        result.status = "diverged"
        result.error = f"diverged ({diverged.reason}): {diverged.detail}"
        result.divergence.update(dict(diverged_at_step=diverged.step, divergence_reason=diverged.reason))
        return
    if accuracy is None or samples is None or spec.partial:
        return  # a rung before the last (smart): a model still learning, not one that learned nothing
    if models.is_language_model(spec.model):
        why = divergence.did_not_learn_tokens(result.accuracy.val_loss, result.accuracy.val_loss_se,
                                              run.splits.unigram_entropy_bits, run.steps_done, spec.divergence)
    else:
        why = divergence.did_not_learn(accuracy, samples, run.splits.num_classes, run.steps_done, spec.divergence)
    if why is not None:
        result.status = divergence.DID_NOT_LEARN
        result.divergence.status_detail = why


def profiler_of(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device):
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
