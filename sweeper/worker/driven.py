"""The measurement of a point whose optimizer steps someone else drives: your loop (worker.user_loop) or
Lightning's Trainer (worker.lightning_point). Told where each step begins and ends, it does at those edges what
the built-in loop (worker.train) does around its own steps: the timed windows (Clock: whole steps, data loading
included), the memory-tracked warm-up step (and a simulated budget's out-of-memory), the profiler, divergence
checked at the windows' edges, the evaluations left out of the windows, the time to a target; and it makes the
same PointResult from the same Training state (worker.train.result_of), with the evaluations the driver
reported. Knows torch only.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from sweeper.measure import telemetry, timing
from sweeper.schema import PointResult
from sweeper.worker import divergence
from sweeper.worker.deadline import Deadline
from sweeper.worker.divergence import Diverged
from sweeper.worker.evaluate import Progress
from sweeper.worker.gns import MicroGradients
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.step import Training
from sweeper.worker.train import Clock, Profiling, profiler_of, result_of
from sweeper.workloads.splits import Splits

# Evaluation metrics with a home in the result's accuracy section; any other name is one of yours (val_metric/).
ACCURACY, LOSS = "val_accuracy", "val_loss"


def training(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, budget_mode: str, model: nn.Module,
             optimizer: torch.optim.Optimizer, train_set: Any, scaler=None, schedule=None,
             backward_divided: bool = True) -> Training:
    """The Training state a driven point is measured from: every step's loss, items and gradient norm on the
    device, as the built-in step keeps them (worker.step.setup). `backward_divided`: whether each micro-batch's
    backward ran on its loss divided by the accumulation steps (Lightning's does; your loop's does not, and
    Training.finish divides the gradient instead): the noise scale's micro-gradients are read accordingly."""
    from sweeper.worker import state

    point = spec.point

    def per_step() -> torch.Tensor:
        return torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)
    clips = spec.train.grad_clip_norm is not None
    micro = None
    if spec.gns.enabled and point.accumulation_steps * point.num_workers > 1:
        micro = MicroGradients(model, spec.steps, point.accumulation_steps if backward_divided else 1,
                               device.torch_device, spec.gns.every_steps)
    return Training(spec, ctx, device, Splits(train_set, None, 0, has_real_labels=False), model, optimizer, iter(()),
                    budget_mode, per_step(), scaler=scaler, scales=[scaler.get_scale()] if scaler is not None else [],
                    grad_norms=per_step() if spec.divergence.check or micro is not None or clips else None,
                    schedule=schedule, micro_grads=micro, history=state.History(), step_items=per_step(),
                    clipped=per_step() if clips else None, sums_micro_means=not backward_divided)


class Driven:
    """A driven point's steps, measured at their edges: `begin(step)` before its first micro-batch is loaded,
    `loaded()` / `computed()` after each micro-batch's loading and backward, `end(step)` once the step is done;
    `evaluated(figures, seconds)` for each evaluation the driver ran. `going` turns false when training must
    stop early (diverged, or the target reached with eval.stop_at_target)."""

    def __init__(self, run: Training, deadline: Optional[Deadline] = None):
        spec, cfg = run.spec, run.spec.measure
        self.run = run
        track = cfg.memory_breakdown or run.budget_mode == "simulated"
        self.roles = timing.step_roles(spec.steps, cfg.warmup_steps, spec.profile_steps, cfg.windows, track)
        self.clock = Clock(run, sum(role.opens_window is not None for role in self.roles), deadline)
        self.profiler = Profiling(profiler_of(spec, run.ctx, run.device))
        self.progress = Progress.of(spec)
        self.breakdown = None
        self.diverged: Optional[Diverged] = None
        self.going = True
        self.figures: Dict[str, float] = {}  # the latest evaluation's, by name
        self._tracker = None  # the memory tracker's context while the tracked step runs
        self._read = None
        self._checked = -1  # the last step boundary checked for divergence
        self._marks: Optional[List[Any]] = None
        self._began = 0.0
        self._train_start: Optional[float] = None
        self.train_seconds = 0.0
        self.loop_started = time.time()

    @property
    def steps(self) -> int:
        return len(self.roles)

    def begin(self, step: int) -> None:
        """Before the step's first micro-batch: a window opened (after a divergence check), the profiler
        started, the memory tracker entered, as the step's role says."""
        run, role = self.run, self.roles[step]
        if self._train_start is None:
            self._train_start, self.loop_started = time.perf_counter(), time.time()
            run.loop_started = self.loop_started
        if run.micro_grads is not None:
            run.micro_grads.step = step
        if role.opens_window is not None:
            # Checked before the clock starts: the check's collectives and reads stay out of the window.
            if self._checked != step and self._stopped(divergence.check(run, run.spec.divergence)):
                return
            self.clock.open(role.opens_window)
        self._began = time.perf_counter()
        if role.starts_profiler:
            self.profiler.start()
        if role.kind == timing.TRACKED:
            from sweeper.measure import memory  # loads DTensor (~1.5 s): only when the breakdown is on

            budget = run.spec.memory_budget_bytes if run.budget_mode == "simulated" else None
            self._tracker = memory.tracking(run.model, run.optimizer, run.device.torch_device, budget)
            self._read = self._tracker.__enter__()
        self._marks = [run.device.mark()] if role.kind == timing.TIMED else None

    def loaded(self) -> None:
        """A micro-batch loaded (the data phase of a timed step ends)."""
        if self._marks is not None:
            self._marks.append(self.run.device.mark())

    def computed(self) -> None:
        """A micro-batch's forward and backward done (its compute phase ends)."""
        if self._marks is not None:
            self._marks.append(self.run.device.mark())

    def end(self, step: int) -> None:
        """After the step (its optimizer step, and what the driver did after it): the tracker left, the window
        closed (then divergence checked), and after the last step the final check."""
        run, role = self.run, self.roles[step]
        self._leave_tracker(None)
        if self._marks is not None:
            self._marks.append(run.device.mark())
            if len(self._marks) == 2 * run.spec.point.accumulation_steps + 2:  # every phase marked
                self.clock.step_marks.append(self._marks)
            self._marks = None
        self.profiler.after(role)
        if role.kind in (timing.TRACKED, timing.PROFILED) or role.starts_profiler or role.stops_profiler:
            self.progress.instrumented_seconds += time.perf_counter() - self._began
            self.progress.instrumented_steps += 1
        self.clock.after_step()
        if role.closes_window is not None:
            self.clock.close(role.closes_window)
            self._checked = step + 1
            if self._stopped(divergence.check(run, run.spec.divergence)):
                return
        if step + 1 == self.steps:
            self._stopped(divergence.check(run, run.spec.divergence, final=not run.spec.partial))

    def due(self, steps_done: int) -> bool:
        """Whether an evaluation is due after `steps_done` steps (eval.every_samples) before the last one."""
        return self.progress.due(steps_done) and steps_done < self.steps

    def evaluated(self, figures: Dict[str, float], seconds: float) -> None:
        """An evaluation the driver ran after the steps done so far, its `figures` by name (val_accuracy and
        val_loss where it has them) and its `seconds` (left out of an open window, counted on the time to
        target's clock); the point's evaluation curve, its target and its figures."""
        progress, run = self.progress, self.run
        self.clock.leave_out(seconds)
        progress.seconds += seconds
        at = progress.start_samples + run.steps_done * progress.samples_per_step
        accuracy, loss = (float(figures.get(name, math.nan)) for name in (ACCURACY, LOSS))
        if progress.curve and progress.curve[-1][0] == at:  # evaluated again at the same step: the later counts
            progress.curve.pop()
        elapsed = time.time() - self.loop_started
        progress.curve.append((at, accuracy, loss, elapsed, progress.instrumented_seconds,
                               progress.instrumented_steps, progress.seconds))
        self.figures = {name: float(value) for name, value in figures.items()}
        hit = (progress.target_accuracy is not None and accuracy >= progress.target_accuracy) or (
            progress.target_loss is not None and loss <= progress.target_loss)
        if hit and progress.reached is None:
            progress.reached = (run.steps_done, elapsed, progress.seconds, progress.instrumented_seconds,
                                progress.instrumented_steps)
        if progress.stop:
            self.going = False

    def _stopped(self, diverged: Optional[Diverged]) -> bool:
        if diverged is not None:
            self.diverged, self.going = diverged, False
        return diverged is not None

    def _leave_tracker(self, exc: Optional[BaseException]) -> None:
        if self._tracker is None:
            return
        tracker, self._tracker = self._tracker, None
        tracker.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        if exc is None:
            self.breakdown = self._read()

    def close(self, exc: Optional[BaseException] = None) -> None:
        """Always, when the driver is done (`exc`: what it raised): the tracker left, the training's seconds
        taken, the utilization sampler and the profiler stopped."""
        self._leave_tracker(exc)
        if self._train_start is not None and not self.train_seconds:
            self.train_seconds = time.perf_counter() - self._train_start
        self.clock.stop()
        self.profiler.stop()

    def finish_training(self) -> None:
        """The training's end (the last step done, or stopped early): its seconds, before a final evaluation."""
        if self._train_start is not None and not self.train_seconds:
            self.train_seconds = time.perf_counter() - self._train_start

    def result(self) -> PointResult:
        """The point's result, as the built-in loop makes it, with the driver's evaluations (collectives: every
        rank calls it)."""
        self.finish_training()
        result = result_of(self.run, self.clock, self.breakdown, self.train_seconds, self.loop_started, self.progress,
                           self.diverged)
        if self.figures and (self.diverged is None or self.diverged.reason != divergence.NONFINITE):
            figures = {k: v for k, v in self.figures.items() if math.isfinite(v)}
            result.accuracy.update({name: figures[name] for name in (ACCURACY, LOSS) if name in figures})
            yours = {k: v for k, v in figures.items() if k not in (ACCURACY, LOSS)}
            if yours:
                result.accuracy.val_metrics = yours
                directions = self.run.spec.loop.metrics
                said = {k: directions[k] for k in sorted(yours) if k in directions}
                result.accuracy.val_metric_directions = ",".join(f"{k}={v}" for k, v in said.items()) or None
        return result
