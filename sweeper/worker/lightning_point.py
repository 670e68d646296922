"""How a point runs your LightningModule and LightningDataModule (model=lightning) unchanged, by Lightning's own
Trainer: its strategy (one device, or DDP over the worker group's process group, already initialized, with a
cluster environment of its ranks), `accumulate_grad_batches`, `precision` and `gradient_clip_val` from the point;
the DataModule's `batch_size` attribute set to the point's micro-batch (Lightning's tuner convention) and its
train_dataloader's dataset and collate_fn streamed in the point's order (worker.point_stream); the module's `lr`
(or `learning_rate`) scaled by train.lr_scaling and sweep.lr_multipliers, as the tuner finds it;
configure_optimizers gives the optimizer and its schedule. A sweeper Callback measures the steps at their edges
as the built-in loop measures its own (worker.driven) and takes validation_step's logged values as the point's
evaluations. Knows torch and Lightning.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any, Dict, Optional

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from sweeper.measure import telemetry, timing
from sweeper.schema import PointResult
from sweeper.worker.deadline import Deadline
from sweeper.worker.driven import ACCURACY, Driven, training
from sweeper.worker.evaluate import Progress
from sweeper.worker.gns import total_norm
from sweeper.worker.point_stream import Ahead, point_loader
from sweeper.worker.spec import PointSpec, WorkerContext

PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
# validation_step's names for the accuracy in Lightning's own examples, the point's val_accuracy
ACCURACY_NAMES = ("val_acc", "val_accuracy")
LR_NAMES = ("lr", "learning_rate")  # where Lightning's LR finder looks, in the module and its hparams


def train_point(spec: PointSpec, ctx: WorkerContext, device: Optional[telemetry.Device] = None,
                deadline: Optional[Deadline] = None) -> PointResult:
    """Your LightningModule fitted on your DataModule for this point by Lightning's Trainer, measured; every
    rank returns the same result."""
    device = device or telemetry.select(spec.use_gpu, ctx.local_rank)
    budget_mode = device.limit_memory(spec.memory_budget_bytes)
    device.start_memory_window()
    torch.manual_seed(spec.seed)  # the module's initial weights: the same on every layout
    module = _made(spec.model.module, spec.model.kwargs, pl.LightningModule, "model.module")
    datamodule = _made(spec.data.datamodule, spec.data.kwargs, pl.LightningDataModule, "data.datamodule")
    _set(datamodule, ("batch_size",), lambda _: spec.point.micro_batch_size, "data.datamodule", "batch_size")
    factor = spec.lr / spec.optim.lr  # train.lr_scaling x the point's multiplier
    if abs(factor - 1.0) > 1e-12:
        _set(module, LR_NAMES, lambda lr: lr * factor, "model.module", "lr (or learning_rate)")
    meter = Meter(spec, ctx, device, budget_mode, deadline)
    _stream(datamodule, meter)
    with tempfile.TemporaryDirectory(prefix="sweeper-lightning-") as folder:
        trainer = pl.Trainer(**trainer_args(spec, ctx, device, folder), callbacks=[meter])
        try:
            trainer.fit(module, datamodule=datamodule)
            meter.returned()
        except BaseException as exc:
            meter.close(exc)
            raise
    meter.close()
    return meter.driven.result()


def trainer_args(spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, folder: str) -> Dict[str, Any]:
    """The Trainer of the point: its budget in optimizer steps (one epoch of the point's stream), its
    accumulation, precision and clipping, its strategy, validation at each evaluation mark (eval.every_samples;
    the last one at the budget's end: the Callback stops the fit there), nothing written but what sweeper
    records."""
    point = spec.point
    batches = spec.steps * point.accumulation_steps
    every = Progress.of(spec).every_steps
    if point.num_workers > 1:
        strategy = _group_ddp(ctx, device)
    else:
        strategy = SingleDeviceStrategy(device=device.torch_device)
    return dict(max_steps=spec.steps, max_epochs=1, accumulate_grad_batches=point.accumulation_steps,
                precision=PRECISION[point.precision], gradient_clip_val=spec.train.grad_clip_norm,
                val_check_interval=min((every or spec.steps) * point.accumulation_steps, batches),
                check_val_every_n_epoch=1, num_sanity_val_steps=0, accelerator=device.torch_device.type,
                devices=1, strategy=strategy, use_distributed_sampler=False, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                default_root_dir=folder)


class Meter(pl.Callback):
    """The point's measurement inside Lightning's fit: each optimizer step's edges (its first micro-batch's
    start, its last one's end), its loss (training_step's, as Lightning returns it: divided by the
    accumulation), its gradient's norm before clipping, and each validation's logged values."""

    def __init__(self, spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, budget_mode: str,
                 deadline: Optional[Deadline]):
        self.spec, self.ctx, self.device, self.budget_mode, self.deadline = spec, ctx, device, budget_mode, deadline
        self.driven: Optional[Driven] = None
        self.train_set: Any = None
        self.stream: Optional[Ahead] = None
        self.step = 0
        self._val_began = 0.0
        self._before: Dict[str, Any] = {}

    @property
    def acc(self) -> int:
        return self.spec.point.accumulation_steps

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(f"model.module's configure_optimizers gives {len(trainer.optimizers)} optimizers: "
                             "sweeper measures a module with one")
        run = training(self.spec, self.ctx, self.device, self.budget_mode, trainer.strategy.model,
                       trainer.optimizers[0], self.train_set)
        self.driven = Driven(run, self.deadline)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if batch_idx % self.acc:
            return
        self.step = batch_idx // self.acc
        self.driven.begin(self.step)
        trainer.should_stop = trainer.should_stop or not self.driven.going

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        """Lightning calls it after the last micro-batch's backward, fp16's gradients unscaled, before clipping."""
        run = self.driven.run
        if run.grad_norms is None:
            return
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        norm = total_norm(grads) if grads else torch.zeros((), dtype=torch.float64, device=self.device.torch_device)
        run.grad_norms[self.step] = norm
        if run.clipped is not None:
            run.clipped[self.step] = (norm > self.spec.train.grad_clip_norm).double()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        run, driven = self.driven.run, self.driven
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            run.step_losses[self.step] += loss.detach().reshape(()).double() * self.acc
        if run.micro_grads is not None:
            run.micro_grads.flush()
        if (batch_idx + 1) % self.acc:
            return
        run.steps_done = self.step + 1
        driven.end(self.step)
        if run.steps_done == driven.steps or not driven.going:
            driven.finish_training()
            trainer.should_stop = True  # Lightning validates where a fit stops: the point's last evaluation

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.driven is None:
            return
        self._val_began, self._before = time.perf_counter(), dict(trainer.callback_metrics)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """What this validation logged (the values it changed: the training's stay the same objects)."""
        if trainer.sanity_checking or self.driven is None:
            return
        logged = {name: value for name, value in trainer.callback_metrics.items()
                  if self._before.get(name) is not value}
        figures = {(ACCURACY if name in ACCURACY_NAMES else name): float(value) for name, value in logged.items()}
        self.driven.evaluated(figures, time.perf_counter() - self._val_began)
        trainer.should_stop = trainer.should_stop or not self.driven.going

    def returned(self) -> None:
        """The fit ended: it trained the budget, or the point stopped early (diverged, its target reached)."""
        if self.driven is None:
            raise RuntimeError("Lightning's fit ended before its first training batch")
        if self.driven.going and self.driven.run.steps_done < self.driven.steps:
            raise RuntimeError(f"Lightning's fit ended after {self.driven.run.steps_done} of the point's "
                               f"{self.driven.steps} optimizer steps")

    def close(self, exc: Optional[BaseException] = None) -> None:
        if self.driven is not None:
            self.driven.close(exc)


def _stream(datamodule: pl.LightningDataModule, meter: Meter) -> None:
    """The DataModule's train_dataloader streams the point's samples: its dataset and collate_fn in the point's
    order on this rank (worker.point_stream), the memory-tracked step's micro-batches loaded before its tracker
    starts. Lightning reads a DataModule's loaders through these methods, so the instance's is replaced."""
    yours = datamodule.train_dataloader

    def train_dataloader():
        loader = point_loader(yours(), meter.spec, meter.ctx, meter.device, "data.datamodule's train_dataloader()")
        meter.train_set = loader.dataset
        return _Stream(loader, meter)
    train_dataloader.__wrapped__ = yours  # Lightning's is_overridden reads the DataModule's own method
    datamodule.train_dataloader = train_dataloader


class _Stream:
    """The point's loader as Lightning iterates it: each step's first micro-batch of the memory-tracked step
    loads that step's (and the next one's first) ahead, before the tracker starts."""

    def __init__(self, loader: Any, meter: Meter):
        self.loader, self.meter = loader, meter

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        stream, acc = Ahead(iter(self.loader)), self.meter.acc
        roles = self.meter.driven.roles if self.meter.driven is not None else []
        tracked = next((step for step, role in enumerate(roles) if role.kind == timing.TRACKED), None)
        for index in range(len(self.loader)):
            if tracked is not None and index == tracked * acc:
                stream.load(acc + 1)
            yield next(stream)


def _group_ddp(ctx: WorkerContext, device: telemetry.Device) -> DDPStrategy:
    """Lightning's DDPStrategy over the point's process group (Ray Train initialized it; a smaller point's is
    the group of its first ranks), its ranks from `ctx` (as Ray Train's own RayDDPStrategy and
    RayLightningEnvironment take them), its collectives on that group."""
    from lightning.fabric.utilities.distributed import _all_gather_ddp_if_available, _sync_ddp_if_available

    class GroupDDP(DDPStrategy):
        @property
        def root_device(self) -> torch.device:
            return device.torch_device

        def barrier(self, *args: Any, **kwargs: Any) -> None:
            dist.barrier(group=ctx.group)

        def broadcast(self, obj: Any, src: int = 0) -> Any:
            box = [obj]
            dist.broadcast_object_list(box, src, group=ctx.group)
            return box[0]

        def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
            if not isinstance(tensor, torch.Tensor):
                return tensor
            return _sync_ddp_if_available(tensor, group if group is not None else ctx.group, reduce_op=reduce_op)

        def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
            return _all_gather_ddp_if_available(tensor, group=group if group is not None else ctx.group,
                                                sync_grads=sync_grads)

    return GroupDDP(parallel_devices=[device.torch_device], cluster_environment=_Ranks(ctx), process_group=ctx.group)


class _Ranks(LightningEnvironment):
    """The point's ranks as Lightning asks for them (its processes already started, its group initialized)."""

    def __init__(self, ctx: WorkerContext):
        super().__init__()
        self.ctx = ctx

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return self.ctx.world_size

    def global_rank(self) -> int:
        return self.ctx.rank

    def local_rank(self) -> int:
        return self.ctx.local_rank

    def node_rank(self) -> int:
        return 0

    def set_world_size(self, size: int) -> None:
        pass

    def set_global_rank(self, rank: int) -> None:
        pass

    def teardown(self) -> None:
        pass


def _made(path: str, kwargs: Dict[str, Any], kind: type, key: str) -> Any:
    """The object `path` (a class or a factory) makes with `kwargs`, checked to be a `kind`."""
    from hydra.utils import get_method

    made = get_method(path)(**kwargs)
    if not isinstance(made, kind):
        raise TypeError(f"{key}={path} made a {type(made).__name__}, not a lightning.pytorch.{kind.__name__}")
    return made


def _set(owner: Any, names: tuple, value: Any, key: str, what: str) -> None:
    """owner.<name> (else owner.hparams[<name>]), the first of `names` it has, set to value(its value)."""
    hparams = getattr(owner, "hparams", None)
    for name in names:
        if hasattr(owner, name):
            setattr(owner, name, value(getattr(owner, name)))
            return
    for name in names:
        if hparams is not None and name in hparams:
            hparams[name] = value(hparams[name])
            return
    raise AttributeError(f"{key} has no {what} attribute, which sweeper sets for each point (Lightning's tuner "
                         f"convention): give it self.{names[0]}")
