"""A point's training state and its optimizer step: the model in its recipe (checkpointing, DDP or
sharding, compile), the optimizer, the loss, mixed precision, and gradient accumulation.

Knows torch only. Runs the same under Ray Train, under a plain `torch.distributed` gloo group, or in
one process (world size 1, no DDP wrapper).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from sweeper import recipe
from sweeper.lr_schedule import Schedule
from sweeper.measure import telemetry
from sweeper.sampler import rank_share
from sweeper.worker import collectives as comm
from sweeper.worker import losses, sharding
from sweeper.worker.gns import MicroGradients, total_norm
from sweeper.worker.losses import MicroLoss
from sweeper.worker.sharding import accumulation_context
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads import batches, datasets, models

# No batch of these datasets takes a healthy loader worker anywhere near this long.
LOADER_TIMEOUT_SECONDS = 300


@dataclass
class Training:
    """A point's training state on this rank: the model, its optimizer and the batches to come."""

    spec: PointSpec
    ctx: WorkerContext
    device: telemetry.Device
    splits: datasets.Splits
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[Any]
    budget_mode: str  # enforced | simulated | none (telemetry.Device.limit_memory)
    # This rank's loss per step on the device: the sum of its micro-batches' means, or (a loss that counts
    # items) of their sums over items; divergence.global_losses makes the global batch's of it.
    step_losses: torch.Tensor
    # A micro-batch's loss (worker.losses): train.step_fn's, the model's own, or the built-in one.
    loss_of: Callable[[nn.Module, Any], MicroLoss] = None  # type: ignore[assignment]
    scaler: Optional[torch.amp.GradScaler] = None  # fp16's loss scaling
    checkpointed_blocks: int = 0
    started: float = field(default_factory=time.time)
    # fp16: the scale before the first step, then after each, kept on the device (GradScaler.get_scale
    # would read it back every step, a second host sync per step); scale_values() reads them once.
    scales: List[Any] = field(default_factory=list)
    # The gradient's norm at every step (before clipping), on the device (divergence.check, the noise scale,
    # train.grad_clip_norm; read only at window edges).
    grad_norms: Optional[torch.Tensor] = None
    # train.warmup_steps and train.lr_schedule: the LR at each step, counted in samples so it survives a change
    # of layout.
    schedule: Optional["LRSchedule"] = None
    # The micro-gradients' squared norms, for the gradient noise scale (worker.gns).
    micro_grads: Optional[MicroGradients] = None
    steps_done: int = 0
    # A run continued from a checkpoint (spec.start_from): samples seen and optimizer steps before it.
    start_samples: int = 0
    steps_before: int = 0
    seconds_before: float = 0.0  # training seconds before it (the time to target's clock goes on)
    loop_started: Optional[float] = None  # when its training loop began (the time to target's clock)
    read_seconds: Optional[float] = None
    # The steps before a continued run (worker.state.History): its loss and noise-scale checks go on from them.
    history: Any = None
    # spec.save_states_at: (samples seen, the Snapshot written, or why it was not) for each one saved so far
    saved_on_the_way: List[Any] = field(default_factory=list)
    # How accumulation reduced, read back from the wrapped model at the first step (sharding.observed_sync):
    # final | every | none; what the point's param gradient_sync records.
    gradient_sync: Optional[str] = None
    # The collectives of the last warm-up step, (kind, payload bytes) each (measure.collective_count).
    collectives: Optional[List[Any]] = None
    # A loss that counts items (worker.losses): whether it does (None until the first micro-batch says), and
    # this rank's items at each step.
    counts_items: Optional[bool] = None
    step_items: Optional[torch.Tensor] = None
    # The figures train.step_fn returned beside its loss: each one's sum over a step's micro-batches, per step.
    step_metrics: Dict[str, torch.Tensor] = field(default_factory=dict)
    # train.grad_clip_norm: 1 at each step whose gradient was clipped.
    clipped: Optional[torch.Tensor] = None
    samples_fn: Optional[Callable[[Any], int]] = None  # data.samples_fn
    batch_checked: bool = False  # the first micro-batch's samples were counted against the micro-batch size
    # Your loop (loop.fn, worker.user_loop): its backward ran on each micro-batch's own mean, not divided by the
    # accumulation steps, so `finish` divides the summed gradient by them (the mean over the worker's share).
    sums_micro_means: bool = False

    @property
    def samples_seen(self) -> int:
        """Samples seen since the point's start (a continued run counts those before it)."""
        return self.start_samples + self.steps_done * self.spec.point.global_batch_size

    def step(self, step: int, marks: Optional[List[Any]] = None, loaded: Optional[List[Any]] = None) -> None:
        """One optimizer step: every micro-batch's forward and backward, then the optimizer.

        Whole optimizer steps, data loading included: internal per-phase timers alone would
        overestimate throughput. Marks do not synchronize the device (events on GPU).
        """
        point = self.spec.point
        if self.micro_grads is not None:
            self.micro_grads.step = step
        for micro_step in range(point.accumulation_steps):
            batch = self._batch(next(self.batches) if loaded is None else loaded[micro_step], loaded is not None)
            if marks is not None:
                marks.append(self.device.mark())
            with accumulation_context(self.model, micro_step, point.accumulation_steps, point.gradient_sync,
                                      point.parallelism):
                if micro_step == 0 and self.gradient_sync is None:
                    self.gradient_sync = sharding.observed_sync(self.model, micro_step, point.accumulation_steps)
                micro = self._forward_backward(batch)
            self._record(step, micro)
            if self.micro_grads is not None:
                self.micro_grads.flush(self._micro_weight(micro))
            if marks is not None:
                marks.append(self.device.mark())
        self.finish(step)

    def _batch(self, batch: Any, copy: bool) -> Any:
        """The micro-batch on the device, whole (any nesting of tensors). Batches loaded beforehand are copied,
        as a GPU copies them in from the host: the tracked step then counts the batch on the device and not the
        host-side dataset. The first one's samples are counted against the micro-batch size."""
        moved = batches.to_device(batch, self.device.torch_device, copy=copy)
        if not self.batch_checked:
            self.batch_checked = True
            problem = batch_problem(moved, self.spec.point.micro_batch_size, self.samples_fn)
            if problem:
                raise ValueError(problem)
        return moved

    def _forward_backward(self, batch: Any) -> MicroLoss:
        """One micro-batch's loss under autocast, and its backward: a mean over the micro-batch divided by the
        accumulation steps (the summed gradient is the mean over the worker's share); a sum over items divided
        by the samples of the worker's share, which `_normalize` turns into the mean over the global batch's
        items once every rank's are counted."""
        point = self.spec.point
        with recipe.autocast(self.device.torch_device, point.precision):
            micro = self.loss_of(self.model, batch)
        divisor = point.accumulation_steps * (point.micro_batch_size if micro.items is not None else 1)
        scaled = micro.loss / divisor
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return micro

    def _record(self, step: int, micro: MicroLoss) -> None:
        """The micro-batch's loss, items and figures added to its step's, on the device."""
        counts = micro.items is not None
        if self.counts_items is None:
            self.counts_items = counts
        elif self.counts_items != counts:
            raise ValueError("a micro-batch's loss counted items and another's did not: a step of your own "
                             f"(train.step_fn) returns {losses.ITEMS!r} with every loss, or with none")
        self.step_losses[step] += micro.loss.detach()
        if counts:
            self.step_items[step] += micro.items
        for name, value in micro.metrics.items():
            if name not in self.step_metrics:
                self.step_metrics[name] = torch.zeros_like(self.step_losses)
            self.step_metrics[name][step] += value

    def _micro_weight(self, micro: MicroLoss) -> Optional[torch.Tensor]:
        """The noise scale's micro-gradient of a loss that counts items, as a mean over its own items (its
        backward ran on the sum / the micro-batch's samples)."""
        if micro.items is None:
            return None
        return (self.spec.point.micro_batch_size / micro.items.double().clamp(min=1)) ** 2

    def finish(self, step: int) -> None:
        """After the last micro-step's backward (the gradients reduced across ranks): made the mean over the global
        batch (`_normalize`), unscaled (fp16), measured, clipped; then the optimizer's step, the gradients zeroed
        and the next step's LR. The one end of an optimizer step: the built-in step's, and your loop's
        (sweeper.loop.step(), worker.user_loop)."""
        self._normalize(step)
        clip = self.spec.train.grad_clip_norm
        if self.scaler is not None and (self.grad_norms is not None or clip):
            self.scaler.unscale_(self.optimizer)  # GradScaler.step then knows not to unscale again
        if self.grad_norms is not None:
            self.grad_norms[step] = self._grad_norm()
        if clip:
            self._clip(step, clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when a gradient is not finite
            self.scaler.update()
            self.scales.append(self.scaler._get_scale_async().detach().clone())
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            self.schedule.set(step + 1)
        self.steps_done = step + 1

    def _normalize(self, step: int) -> None:
        """The gradient as the mean over the global batch, whichever layout holds it. A loss that counts items: the
        gradient, summed over every micro-batch's items / the worker's samples and averaged over the ranks, divided
        by the global batch's items (all ranks' counted: one all-reduce), as Hugging Face's num_items_in_batch
        makes it. Your loop's sum of its micro-batches' means: divided by the accumulation steps. Otherwise the
        backward already divided it."""
        if self.counts_items:
            items = self.step_items[step].clone()
            comm.all_reduce(items, self.ctx, dist.ReduceOp.SUM)
            factor = (self.spec.point.global_batch_size / items.clamp(min=1)).float()
        elif self.sums_micro_means and self.spec.point.accumulation_steps > 1:
            factor = 1.0 / self.spec.point.accumulation_steps
        else:
            return
        grads = self._local_grads()
        if grads:
            torch._foreach_mul_(grads, factor)

    def _local_grads(self) -> List[torch.Tensor]:
        """This rank's gradients as plain tensors (a sharded model's: its DTensors' local shards)."""
        return [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                for p in self.model.parameters() if p.grad is not None]

    def _grad_norm(self) -> torch.Tensor:
        """The whole gradient's norm (after DDP's average; fp16's unscaled), kept on the device."""
        if sharding.is_sharded(self.model):  # DTensor shards: their squares summed across ranks
            return sharding.grad_norm(self.model, self.ctx.group)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return total_norm(grads) if grads else torch.zeros((), dtype=torch.float64, device=self.device.torch_device)

    def _clip(self, step: int, max_norm: float) -> None:
        """train.grad_clip_norm: the whole gradient scaled to at most `max_norm`, as
        torch.nn.utils.clip_grad_norm_ scales it (max_norm / (norm + 1e-6), at most 1), on every rank's
        shards alike; no host sync."""
        norm = self.grad_norms[step]
        factor = (max_norm / (norm + 1e-6)).clamp(max=1.0).float()
        grads = self._local_grads()
        if grads:
            torch._foreach_mul_(grads, factor)
        self.clipped[step] = (norm > max_norm).double()

    def scale_values(self) -> List[float]:
        """fp16: every scale as a float, read from the device in one go (after training)."""
        kept = [s.reshape(()) for s in self.scales if isinstance(s, torch.Tensor)]
        read = iter(torch.stack(kept).cpu().tolist()) if kept else iter(())
        return [next(read) if isinstance(s, torch.Tensor) else float(s) for s in self.scales]

    def tracked_step(self, step: int):
        """A warm-up step under torch's MemTracker (and a simulated CPU budget): the memory breakdown.

        A warm-up step, so the tracker's cost is never timed; after step 0, so the optimizer state
        exists as it does for every later step. With data.collate_fn, batches may differ in shape: when the
        stream holds a larger micro-batch than this step's, its forward and backward run first, on every rank,
        their gradients and statistics then dropped (largest.probe): the peak and the budget are the largest
        batch's, and the training is the same as without it."""
        from sweeper.measure import memory  # loads DTensor (~1.5 s): only when the breakdown is on
        from sweeper.worker import largest

        # Loaded outside the tracker: indexing an in-memory dataset yields views of its whole
        # storage, which the tracker would count as device memory.
        loaded = [next(self.batches) for _ in range(self.spec.point.accumulation_steps)]
        biggest = None
        if self.spec.data.collate_fn:
            stream = _loader(self.spec, self.ctx, self.device, self.splits, self.start_samples)
            biggest = largest.stream_largest(self, loaded, stream)

        def run() -> None:
            if biggest is not None:
                largest.probe(self, biggest)
            self.step(step, loaded=loaded)
        return memory.track_step(
            self.model,
            sharding.local_optimizer(self.optimizer),  # zero1: the one holding this rank's state
            run,
            self.device.torch_device,
            budget_bytes=self.spec.memory_budget_bytes if self.budget_mode == "simulated" else None,
        )

    @property
    def inner_model(self) -> nn.Module:
        return sharding.inner(self.model)


def batch_problem(batch: Any, micro_batch_size: int, samples_fn: Optional[Callable[[Any], int]]) -> Optional[str]:
    """Why a micro-batch is not one of the point's (its samples cannot be read, or are not the micro-batch
    size), in one line naming the key to fix; None when it is."""
    count = batches.sample_count(batch, samples_fn)
    if count is None:
        return (f"a batch is {batches.describe(batch)}: its samples cannot be read from it (no `labels`, "
                "`input_ids` or tensor with a leading dimension): set data.samples_fn to fn(batch) -> samples")
    if count != micro_batch_size:
        return (f"a micro-batch holds {count} samples, not the point's micro-batch of {micro_batch_size}: "
                "data.collate_fn must batch each sample it is given (or data.samples_fn counts them wrongly)")
    return None


class LRSchedule:
    """The optimizer's LR at each step: each parameter group's own LR times the schedule's factor
    (sweeper.lr_schedule: train.warmup_steps, then train.lr_schedule), counted in samples: the step that
    trains samples [s, s + G) takes the factor at s. The warm-up's samples are train.warmup_steps times the
    global batch the point started at, and the decay spans the point's whole sample budget: a run continued
    at another global batch goes on from where the schedule stood. A warm-up alone at one global batch gives
    (step + 1) / warmup_steps exactly (the same rational, so the same float)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule, start_samples: int,
                 global_batch: int):
        self.optimizer, self.schedule = optimizer, schedule
        self.start_samples, self.global_batch = start_samples, global_batch
        self.base = [group["lr"] for group in optimizer.param_groups]

    def set(self, step: int) -> None:
        """The LR of this run's step `step`."""
        factor = self.schedule.factor(self.start_samples + step * self.global_batch, self.global_batch)
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * factor


def setup(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, splits: datasets.Splits,
          start=None) -> Training:
    """A fresh model (seeded: the same initial weights on every layout), its optimizer and its batches;
    with spec.start_from (or `start`, a Snapshot in memory: a batch schedule's previous span), the
    weights, optimizer state and stream position of that training state instead."""
    from sweeper.worker import state

    point = spec.point
    start = start if start is not None else _read_start(spec)
    budget_mode = device.limit_memory(spec.memory_budget_bytes)
    device.start_memory_window()
    model, bare, blocks, optimizer = _model_and_optimizer(spec, ctx, device, splits, start)
    start_samples = start.position.samples_seen if start is not None else 0
    loader = _loader(spec, ctx, device, splits, start_samples)
    scaler = recipe.grad_scaler(device.torch_device, point.precision)
    if scaler is not None and start is not None and start.scaler:
        scaler.load_state_dict(start.scaler)
    # A step with more than one micro-batch holds what the noise scale needs (K = accumulation x workers).
    measures_noise = spec.gns.enabled and point.accumulation_steps * point.num_workers > 1
    micro = MicroGradients(model, spec.steps, point.accumulation_steps, device.torch_device,
                           spec.gns.every_steps) if measures_noise else None
    schedule = lr_schedule(spec, optimizer, start, start_samples)
    stream = iter(loader)  # draws from torch's RNG: the saved RNG state goes back after it
    if start is not None and start.rng is not None:
        torch.set_rng_state(start.rng)
    if start is not None and start.cuda_rng is not None and device.is_cuda:
        torch.cuda.set_rng_state(start.cuda_rng, device.torch_device)

    def per_step() -> torch.Tensor:
        return torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)
    clips = spec.train.grad_clip_norm is not None
    return Training(spec, ctx, device, splits, model, optimizer, stream, budget_mode, per_step(),
                    loss_of=losses.build(spec.train.step_fn, recipe.build_loss(spec.loss), bare),
                    scaler=scaler, checkpointed_blocks=blocks,
                    scales=[scaler.get_scale()] if scaler is not None else [],
                    grad_norms=per_step() if spec.divergence.check or micro is not None or clips else None,
                    schedule=schedule, micro_grads=micro, start_samples=start_samples,
                    steps_before=start.position.optimizer_steps if start is not None else 0,
                    seconds_before=start.position.train_seconds if start is not None else 0.0,
                    read_seconds=None if start is None else start.extra.get("read_seconds"),
                    history=start.history if start is not None else state.History(),
                    step_items=per_step(), clipped=per_step() if clips else None,
                    samples_fn=batches.samples_fn_of(spec.data.samples_fn))


def _model_and_optimizer(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, splits: datasets.Splits,
                         start) -> tuple:
    """(the model as trained, the bare model it wraps, the blocks checkpointed, its optimizer), from `start`'s
    weights and optimizer state when given."""
    from sweeper.worker import state

    torch.manual_seed(spec.seed)  # same initial weights on every layout (DDP also broadcasts rank 0's)
    bare: nn.Module = models.build(spec.model, splits.num_classes).to(device.torch_device)
    if start is not None:  # into the bare model: before the checkpointing wrap and DDP's broadcast
        bare.load_state_dict(start.weights)
    blocks = recipe.apply_checkpointing(bare, spec.point.checkpointing, spec.model.checkpoint_modules)
    model = _parallelize(bare, spec, ctx, device)
    optimizer = recipe.build_optimizer(spec.optim, model, spec.lr)  # on the shards when sharded
    optimizer = sharding.optimizer_for(spec.point.parallelism, optimizer, ctx.group)  # zero1: a share per rank
    if start is not None and sharding.holds_shards(model, optimizer):  # each rank keeps its shards of the state
        sharding.load_optimizer(model, optimizer, start.optimizer)
    elif start is not None:
        state.load_optimizer(optimizer, start.optimizer)
    if spec.train.compile:
        # In place (Module.compile), so hooks such as the memory tracker's fire once; compiled in
        # the first, untimed step.
        model.compile()
    return model, bare, blocks, optimizer


def lr_schedule(spec: PointSpec, optimizer: torch.optim.Optimizer, start, start_samples: int) -> LRSchedule:
    """The point's LR schedule from `start_samples` on, its LR set for the first step. A continued run keeps
    the warm-up its training state began with (in samples, at the global batch it started at); the decay spans
    spec.schedule_samples (the point's budget), else the checkpoint's, else this run and its later spans."""
    point, train = spec.point, spec.train
    warmup = start.position.warmup_samples if start is not None else train.warmup_steps * point.global_batch_size
    here = start_samples + spec.steps * point.global_batch_size + sum(
        span.steps * span.point.global_batch_size for span in spec.later_spans)
    total = spec.schedule_samples or (start.position.schedule_samples if start is not None else 0) or here
    schedule = LRSchedule(optimizer, Schedule(train.lr_schedule, total, warmup, train.min_lr_ratio,
                                              train.decay_fraction), start_samples, point.global_batch_size)
    schedule.set(0)
    return schedule


def _parallelize(model: nn.Module, spec: PointSpec, ctx: WorkerContext, device: telemetry.Device) -> nn.Module:
    """The model as the point's workers hold it: sharded in place over the point's group (zero2/zero3/hsdp: FSDP2,
    at one worker too; hsdp over its ranks by node), wrapped in DDP (ddp and zero1 at more than one worker), or as
    it is."""
    point = spec.point
    if point.parallelism != "ddp":
        return sharding.apply(model, point.parallelism, ctx.group, point.precision, spec.model.checkpoint_modules,
                              device.torch_device, ctx.mesh)[0]
    if ctx.world_size > 1:
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if device.is_cuda else None, process_group=ctx.group
        )
    return model


def _loader(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, splits: datasets.Splits,
            start_samples: int) -> DataLoader:
    """This rank's micro-batches, full ones only, from `start_samples` into the stream on, batched by
    data.collate_fn."""
    point = spec.point
    # A streamed train set is read in stream order (no sampler), a map-style one through the sampler.
    dataset, sampler = rank_share(splits.train, point, ctx.rank, spec.steps, spec.seed, start_samples)
    return batches.loader(
        dataset,
        point.micro_batch_size,
        spec.data.collate_fn,
        sampler=sampler,
        drop_last=True,
        num_workers=spec.data.loader_workers,
        pin_memory=spec.data.pin_memory and device.is_cuda,
        prefetch_factor=spec.data.prefetch_factor if spec.data.loader_workers > 0 else None,
        # A loader worker process that stalls (NFS, a deadlock) raises instead of hanging the group.
        timeout=LOADER_TIMEOUT_SECONDS if spec.data.loader_workers > 0 else 0,
    )


def _read_start(spec: PointSpec):
    """spec.start_from's snapshot, checked to be this point's model, data, optimizer and seed."""
    from sweeper.worker import state

    if spec.start_from is None:
        return None
    began = time.perf_counter()
    start = state.read(spec.start_from)
    problem = state.mismatch(start.identity, state.identity(spec))
    if problem:
        raise ValueError(f"the checkpoint {spec.start_from} was saved by another {problem}: continue from a "
                         "checkpoint of the same model, data, optimizer and seed")
    start.extra["read_seconds"] = time.perf_counter() - began
    return start


def capture(run: Training, history=None):
    """This rank's training state at the step boundary it stands at (sweeper.worker.state.Snapshot), with
    `history` (worker.state.History: every step's up to here, which the caller gathers across ranks)."""
    from sweeper.worker import state

    point, schedule = run.spec.point, run.schedule.schedule
    position = state.Position(run.samples_seen, run.steps_before + run.steps_done,
                              float(run.optimizer.param_groups[0]["lr"]), point.global_batch_size,
                              schedule.warmup_samples, point.key,
                              run.seconds_before + time.time() - (run.loop_started or run.started),
                              schedule.name, schedule.total_samples)
    # Host copies: the live optimizer tensors go on changing if training goes on after the capture, and the
    # device's memory stays the training's.
    cuda_rng = torch.cuda.get_rng_state(run.device.torch_device) if run.device.is_cuda else None
    if sharding.holds_shards(run.model, run.optimizer):  # gathered whole (a collective: every rank captures)
        weights, optimizer = sharding.full_state(run.model, run.optimizer)
    else:
        weights, optimizer = state.canonical_state(run.model), state.to_cpu(run.optimizer.state_dict())
    return state.Snapshot(state.identity(run.spec), position, weights, optimizer,
                          run.scaler.state_dict() if run.scaler is not None else None, torch.get_rng_state(),
                          cuda_rng, history=history if history is not None else state.History())
