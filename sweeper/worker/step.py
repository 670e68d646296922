"""A point's training state and its optimizer step: the model in its recipe (checkpointing, DDP or
sharding, compile), the optimizer, the loss, mixed precision, and gradient accumulation.

Knows torch only. Runs the same under Ray Train, under a plain `torch.distributed` gloo group, or in
one process (world size 1, no DDP wrapper).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from sweeper import recipe
from sweeper.measure import telemetry
from sweeper.sampler import GlobalBatchSampler
from sweeper.worker.gns import MicroGradients, total_norm
from sweeper.worker import sharding
from sweeper.worker.sharding import accumulation_context
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads import datasets, models

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
    step_losses: torch.Tensor  # the worker's mean micro-batch loss per step, on the device
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
    scaler: Optional[torch.amp.GradScaler] = None  # fp16's loss scaling
    checkpointed_blocks: int = 0
    started: float = field(default_factory=time.time)
    # fp16: the scale before the first step, then after each, kept on the device (GradScaler.get_scale
    # would read it back every step, a second host sync per step); scale_values() reads them once.
    scales: List[Any] = field(default_factory=list)
    # The gradient's norm at every step, on the device (divergence.check; read only at window edges).
    grad_norms: Optional[torch.Tensor] = None
    # train.warmup_steps: the LR's linear warmup, counted in samples so it survives a change of layout.
    warmup: Optional["Warmup"] = None
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

    @property
    def samples_seen(self) -> int:
        """Samples seen since the point's start (a continued run counts those before it)."""
        return self.start_samples + self.steps_done * self.spec.point.global_batch_size

    def step(self, step: int, marks: Optional[List[Any]] = None, loaded: Optional[List[Any]] = None) -> None:
        """One optimizer step: every micro-batch's forward and backward, then the optimizer.

        Whole optimizer steps, data loading included: internal per-phase timers alone would
        overestimate throughput. Marks do not synchronize the device (events on GPU).
        """
        point, target = self.spec.point, self.device.torch_device
        if self.micro_grads is not None:
            self.micro_grads.step = step
        for micro_step in range(point.accumulation_steps):
            inputs, targets = next(self.batches) if loaded is None else loaded[micro_step]
            # Batches loaded beforehand are copied, as a GPU copies them in from the host: the
            # tracked step then counts the batch on the device and not the host-side dataset.
            copy = loaded is not None
            inputs = inputs.to(target, non_blocking=True, copy=copy)
            targets = targets.to(target, non_blocking=True, copy=copy)
            if marks is not None:
                marks.append(self.device.mark())
            with accumulation_context(self.model, micro_step, point.accumulation_steps, point.gradient_sync,
                                      point.parallelism):
                if micro_step == 0 and self.gradient_sync is None:
                    self.gradient_sync = sharding.observed_sync(self.model, micro_step, point.accumulation_steps)
                with recipe.autocast(target, point.precision):
                    loss = self.loss_fn(self.model(inputs), targets)
                # Each micro-batch loss is a mean over its samples; dividing by the accumulation
                # steps makes the summed gradient the mean over the worker's whole share.
                scaled = loss / point.accumulation_steps
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            if self.micro_grads is not None:
                self.micro_grads.flush()
            if marks is not None:
                marks.append(self.device.mark())
            self.step_losses[step] += loss.detach()
        if self.grad_norms is not None:
            self._record_grad_norm(step)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when a gradient is not finite
            self.scaler.update()
            self.scales.append(self.scaler._get_scale_async().detach().clone())
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.warmup is not None:
            self.warmup.set(step + 1)
        self.steps_done = step + 1

    def scale_values(self) -> List[float]:
        """fp16: every scale as a float, read from the device in one go (after training)."""
        kept = [s.reshape(()) for s in self.scales if isinstance(s, torch.Tensor)]
        read = iter(torch.stack(kept).cpu().tolist()) if kept else iter(())
        return [next(read) if isinstance(s, torch.Tensor) else float(s) for s in self.scales]

    def _record_grad_norm(self, step: int) -> None:
        """The whole gradient's norm (after DDP's average; fp16's unscaled), kept on the device."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # GradScaler.step then knows not to unscale again
        if sharding.is_sharded(self.model):  # DTensor shards: their squares summed across ranks
            self.grad_norms[step] = sharding.grad_norm(self.model, self.ctx.group)
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            self.grad_norms[step] = total_norm(grads)

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
        return sharding.inner(self.model)


class Warmup:
    """train.warmup_steps' linear LR warmup, counted in samples: the LR of a step is the point's LR times
    min(1, samples seen after it / warmup samples), the warmup's samples being train.warmup_steps times
    the global batch the point started at. At one global batch this is (step + 1) / warmup_steps exactly
    (the same rational, so the same float); a run continued at another global batch goes on from where
    the warmup stood."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_samples: int, start_samples: int, global_batch: int):
        self.optimizer, self.warmup_samples = optimizer, warmup_samples
        self.start_samples, self.global_batch = start_samples, global_batch
        self.base = [group["lr"] for group in optimizer.param_groups]

    def set(self, step: int) -> None:
        """The LR of this run's step `step`."""
        factor = min(1.0, (self.start_samples + (step + 1) * self.global_batch) / self.warmup_samples)
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
    torch.manual_seed(spec.seed)  # same initial weights on every layout (DDP also broadcasts rank 0's)
    model: nn.Module = models.build(spec.model, splits.num_classes).to(device.torch_device)
    if start is not None:  # into the bare model: before the checkpointing wrap and DDP's broadcast
        model.load_state_dict(start.weights)
    blocks = recipe.apply_checkpointing(model, point.checkpointing, spec.model.checkpoint_modules)
    model = _parallelize(model, spec, ctx, device)
    optimizer = recipe.build_optimizer(spec.optim, model.parameters(), spec.lr)  # on the shards when sharded
    if start is not None and sharding.is_sharded(model):  # each rank keeps its shards of the saved state
        sharding.load_optimizer(model, optimizer, start.optimizer)
    elif start is not None:
        state.load_optimizer(optimizer, start.optimizer)
    if spec.train.compile:
        # In place (Module.compile), so hooks such as the memory tracker's fire once; compiled in
        # the first, untimed step.
        model.compile()
    start_samples = start.position.samples_seen if start is not None else 0
    loader = _loader(spec, ctx, device, splits, start_samples)
    losses = torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)
    scaler = recipe.grad_scaler(device.torch_device, point.precision)
    if scaler is not None and start is not None and start.scaler:
        scaler.load_state_dict(start.scaler)
    # A step with more than one micro-batch holds what the noise scale needs (K = accumulation x workers).
    measures_noise = spec.gns.enabled and point.accumulation_steps * point.num_workers > 1
    micro = MicroGradients(model, spec.steps, point.accumulation_steps, device.torch_device,
                           spec.gns.every_steps) if measures_noise else None
    warmup_samples = start.position.warmup_samples if start is not None else \
        spec.train.warmup_steps * point.global_batch_size
    warmup = Warmup(optimizer, warmup_samples, start_samples, point.global_batch_size) if warmup_samples else None
    if warmup is not None:
        warmup.set(0)
    batches = iter(loader)  # draws from torch's RNG: the saved RNG state goes back after it
    if start is not None and start.rng is not None:
        torch.set_rng_state(start.rng)
    if start is not None and start.cuda_rng is not None and device.is_cuda:
        torch.cuda.set_rng_state(start.cuda_rng, device.torch_device)
    return Training(spec, ctx, device, splits, model, optimizer, batches, budget_mode, losses,
                    loss_fn=recipe.build_loss(spec.loss), scaler=scaler, checkpointed_blocks=blocks,
                    scales=[scaler.get_scale()] if scaler is not None else [],
                    grad_norms=torch.zeros(spec.steps, dtype=torch.float64, device=device.torch_device)
                    if spec.divergence.check or micro is not None else None,
                    warmup=warmup, micro_grads=micro, start_samples=start_samples,
                    steps_before=start.position.optimizer_steps if start is not None else 0,
                    seconds_before=start.position.train_seconds if start is not None else 0.0,
                    read_seconds=None if start is None else start.extra.get("read_seconds"),
                    history=start.history if start is not None else state.History())


def _parallelize(model: nn.Module, spec: PointSpec, ctx: WorkerContext, device: telemetry.Device) -> nn.Module:
    """The model as the point's workers hold it: sharded in place over the point's group (zero2/zero3: FSDP2,
    at one worker too), wrapped in DDP (more than one worker), or as it is."""
    point = spec.point
    if point.parallelism != "ddp":
        return sharding.apply(model, point.parallelism, ctx.group, point.precision, spec.model.checkpoint_modules,
                              device.torch_device)[0]
    if ctx.world_size > 1:
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if device.is_cuda else None, process_group=ctx.group
        )
    return model


def _loader(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, splits: datasets.Splits,
            start_samples: int) -> DataLoader:
    """This rank's micro-batches, full ones only, from `start_samples` into the stream on."""
    point = spec.point
    sampler = GlobalBatchSampler(len(splits.train), point, ctx.rank, spec.steps, spec.seed, start_samples)
    return DataLoader(
        splits.train,
        batch_size=point.micro_batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=spec.data.loader_workers,
        pin_memory=device.is_cuda,
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

    point = run.spec.point
    warmup = run.warmup.warmup_samples if run.warmup is not None else 0
    position = state.Position(run.samples_seen, run.steps_before + run.steps_done,
                              float(run.optimizer.param_groups[0]["lr"]), point.global_batch_size, warmup, point.key,
                              run.seconds_before + time.time() - (run.loop_started or run.started))
    # Host copies: the live optimizer tensors go on changing if training goes on after the capture, and the
    # device's memory stays the training's.
    cuda_rng = torch.cuda.get_rng_state(run.device.torch_device) if run.device.is_cuda else None
    if sharding.is_sharded(run.model):  # gathered whole (a collective: every rank captures), on rank 0
        weights, optimizer = sharding.full_state(run.model, run.optimizer)
    else:
        weights, optimizer = state.canonical_state(run.model), state.to_cpu(run.optimizer.state_dict())
    return state.Snapshot(state.identity(run.spec), position, weights, optimizer,
                          run.scaler.state_dict() if run.scaler is not None else None, torch.get_rng_state(),
                          cuda_rng, history=history if history is not None else state.History())
