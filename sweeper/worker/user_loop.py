"""How a point runs your training loop (loop.fn): `fn(config)` called once per point on every worker, with the
point's layout in `config`, and the session sweeper.loop's calls reach while it runs. `prepare` wraps your model
as the point holds it (DDP, or FSDP2 sharded in place with your optimizer moved onto the shards; activation
checkpointing, compilation, autocast) and streams your DataLoader's dataset in the point's order
(worker.point_stream); the prepared loader's passes end at the point's evaluations and its budget; every
micro-batch it yields but a step's last runs its backward without the gradient sync; the optimizer step is the
built-in step's own end (Training.finish: the gradient made the mean, unscaled, measured, clipped, stepped,
zeroed, the LR scheduled); the steps are measured at their edges as the built-in loop measures its own
(worker.driven). Knows torch only.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import nn

from sweeper import recipe
from sweeper.measure import telemetry, timing
from sweeper.schema import PointResult
from sweeper.worker import sharding
from sweeper.worker.deadline import Deadline
from sweeper.worker.driven import Driven, training
from sweeper.worker.point_stream import Ahead, point_loader
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.step import lr_schedule
from sweeper.workloads import batches

_current: Optional["Session"] = None  # the session of the point this process runs now


def current() -> "Session":
    """The running point's session (sweeper.loop's calls reach it); RuntimeError outside one."""
    if _current is None:
        raise RuntimeError("sweeper.loop is called outside a point: it works inside your loop.fn, run by "
                           "`python -m sweeper loop.fn=...`")
    return _current


def loop_config(spec: PointSpec, passes: int) -> Dict[str, Any]:
    """What your loop is told: the point's layout, its LR and seed, its budget, loop.kwargs beside them."""
    point = spec.point
    return {**spec.loop.kwargs, "micro_batch_size": point.micro_batch_size, "batch_size": point.micro_batch_size,
            "accumulation_steps": point.accumulation_steps, "num_workers": point.num_workers,
            "global_batch_size": point.global_batch_size, "parallelism": point.parallelism,
            "precision": point.precision, "activation_checkpointing": point.checkpointing, "lr": spec.lr,
            "seed": spec.seed, "steps": spec.steps, "samples": spec.steps * point.global_batch_size,
            "epochs": passes, "point": point.key}


def passes_of(spec: PointSpec) -> int:
    """The prepared loader's passes over the point's budget: one, and one more after each evaluation mark
    (eval.every_samples) before the last step."""
    from sweeper.worker.evaluate import Progress

    progress = Progress.of(spec)
    return 1 + sum(progress.due(done) for done in range(1, spec.steps))


def train_point(spec: PointSpec, ctx: WorkerContext, device: Optional[telemetry.Device] = None,
                deadline: Optional[Deadline] = None) -> PointResult:
    """Your loop, run once for this point on this rank, measured; every rank returns the same result."""
    from hydra.utils import get_method

    global _current
    with sharding.process_group_for(spec.point.parallelism, ctx.world_size):
        session = Session(spec, ctx, device or telemetry.select(spec.use_gpu, ctx.local_rank), deadline)
        _current = session
        try:
            torch.manual_seed(spec.seed)  # your model's initial weights: the same on every layout
            get_method(spec.loop.fn)(loop_config(spec, passes_of(spec)))
            session.returned()
        except BaseException as exc:
            session.close(exc)
            raise
        finally:
            _current = None
        session.close()
        return session.driven.result()


class Session:
    """One point of your loop on this rank: where its stream stands (the step and micro-batch last yielded),
    what was reported for them, and the measurement (worker.driven)."""

    def __init__(self, spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, deadline: Optional[Deadline]):
        self.spec, self.ctx, self.device, self.deadline = spec, ctx, device, deadline
        self.budget_mode = device.limit_memory(spec.memory_budget_bytes)
        device.start_memory_window()
        self.driven: Optional[Driven] = None
        self.model: Optional[nn.Module] = None
        self.stream: Optional[Ahead] = None
        self.step, self.micro = 0, -1  # the micro-batch last yielded: `micro` of step `step` (-1: none yet)
        self.stepped = False  # the optimizer step of `step` ran
        self.scaled = False  # a backward of `step` ran through sweeper.loop.backward (fp16's loss scaling)
        self.in_pass = False
        self.finished = False  # the budget trained, or training stopped early
        self.pending: Dict[str, Any] = {}  # what was reported for the micro-batch last yielded
        self.counts: Dict[str, int] = {}  # how many micro-batches of `step` reported each figure
        self.since = time.perf_counter()  # the last pass's end, or the last evaluation reported after it

    # ---- prepare -----------------------------------------------------------------------------------------

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, loader: Any):
        if self.driven is not None:
            raise RuntimeError("sweeper.loop.prepare is called once per point: prepare the model, the optimizer "
                               "and the training loader together")
        if not isinstance(optimizer, torch.optim.Optimizer) or any(optimizer.state.values()):
            raise TypeError("sweeper.loop.prepare takes a torch.optim.Optimizer that has not stepped yet, "
                            f"not {type(optimizer).__name__}: make it from model.parameters() and prepare it unused")
        spec, point, device = self.spec, self.spec.point, self.device
        model = model.to(device.torch_device)
        blocks = recipe.apply_checkpointing(model, point.checkpointing, spec.model.checkpoint_modules)
        names = {id(p): name for name, p in model.named_parameters()}
        wrapped, _ = sharding.apply(model, point.parallelism, self.ctx.group, point.precision,
                                    spec.model.checkpoint_modules, device.torch_device, self.ctx.mesh)
        if sharding.is_sharded(wrapped):  # FSDP2 made new (DTensor) parameters: the optimizer takes them
            now = dict(wrapped.named_parameters())
            for group in optimizer.param_groups:
                group["params"] = [now[names[id(p)]] for p in group["params"]]
        if spec.train.compile:
            wrapped.compile()  # in place, compiled in the first (untimed) step
        _autocast(wrapped, device.torch_device, point.precision)
        scaler = recipe.grad_scaler(device.torch_device, point.precision)
        keeps_lr = spec.train.lr_schedule == "constant" and not spec.train.warmup_steps  # your scheduler, if any
        schedule = None if keeps_lr else lr_schedule(spec, optimizer, None, 0)
        stream = point_loader(loader, spec, self.ctx, device, "the loader given to sweeper.loop.prepare")
        run = training(spec, self.ctx, device, self.budget_mode, wrapped, optimizer, stream.dataset, scaler, schedule,
                       backward_divided=False)
        run.checkpointed_blocks = blocks
        self.stream = Ahead(iter(stream))  # draws from torch's RNG, as the built-in stream does after the model
        self.model, self.driven = wrapped, Driven(run, self.deadline)
        return wrapped, PreparedOptimizer(optimizer, self), PreparedLoader(self, len(stream))

    # ---- the stream's passes ------------------------------------------------------------------------------

    def passes(self) -> Iterator[Any]:
        """One pass of the prepared loader: the point's micro-batches from where the last pass ended to the next
        evaluation mark (eval.every_samples), the budget's end, or an early stop."""
        driven = self._driven("iterate the prepared loader")
        self._leave_out()
        if self.finished:
            return
        self.in_pass = True
        try:
            while not self.finished:
                yield from self._one_step()
                if self.finished or driven.due(self.step):
                    break
        finally:
            self.in_pass = False
            _sync(self.model, True)
            self.since = time.perf_counter()

    def _one_step(self) -> Iterator[Any]:
        driven, acc, step = self.driven, self.spec.point.accumulation_steps, self.step
        if driven.roles[step].kind == timing.TRACKED:
            self.stream.load(acc + 1)  # the tracked step's batches (and the next one) loaded outside its tracker
        driven.begin(step)
        if not driven.going:  # diverged at a window's edge
            return self._stop()
        tracked = driven.roles[step].kind == timing.TRACKED
        for micro in range(acc):
            batch = batches.to_device(next(self.stream), self.device.torch_device, copy=tracked)
            self.micro = micro
            _sync(self.model, micro == acc - 1)
            driven.loaded()
            yield batch
            self._micro_done()
        if not self.stepped:
            raise RuntimeError(f"your loop drew step {step}'s {acc} micro-batch(es) without an optimizer step: call "
                               "optimizer.step() (the prepared optimizer) or sweeper.loop.step() after each backward")
        self._step_done()

    def _micro_done(self) -> None:
        """The micro-batch last yielded is done: what was reported for it added to its step's figures."""
        run, step = self.driven.run, self.step
        if self.micro < self.spec.point.accumulation_steps - 1:
            self.driven.computed()  # the last one's compute ends where its optimizer step begins
        if run.micro_grads is not None:
            run.micro_grads.flush()
        for name, value in self.pending.items():
            figure = _as_tensor(value, run.step_losses)
            if name == "loss":
                run.step_losses[step] += figure
            else:
                run.step_metrics.setdefault(name, torch.zeros_like(run.step_losses))[step] += figure
            self.counts[name] = self.counts.get(name, 0) + 1
        self.pending = {}

    def _step_done(self) -> None:
        """The step's figures as the built-in step keeps them (a sum over its micro-batches: a figure reported
        for fewer of them is scaled up), then its end measured."""
        run, step, acc = self.driven.run, self.step, self.spec.point.accumulation_steps
        if not self.counts.get("loss"):
            raise RuntimeError(f"your loop reported no loss in step {step}: call sweeper.loop.report(loss=loss) "
                               "(or sweeper.loop.backward(loss)) for each micro-batch")
        for name, count in self.counts.items():
            if count != acc:
                series = run.step_losses if name == "loss" else run.step_metrics[name]
                series[step] *= acc / count
        self.counts, self.stepped, self.scaled, self.micro = {}, False, False, -1
        self.driven.end(step)
        self.step = step + 1
        if self.step == self.driven.steps or not self.driven.going:
            self._stop()

    def _stop(self) -> None:
        self.finished = True
        self.driven.finish_training()

    def _leave_out(self) -> None:
        """The time since the last pass ended (your evaluation, what else your loop did between passes) is not
        training: out of any open window."""
        if self.driven is not None:
            self.driven.clock.leave_out(time.perf_counter() - self.since)
        self.since = time.perf_counter()

    # ---- the calls of your loop ---------------------------------------------------------------------------

    def optimizer_step(self) -> None:
        """The point's optimizer step after a step's last micro-batch (a no-op on the others: accumulating)."""
        self._driven("step the optimizer")
        if self.micro < 0:
            raise RuntimeError("your loop stepped the optimizer before drawing a micro-batch from the prepared loader")
        if self.stepped or self.micro < self.spec.point.accumulation_steps - 1:
            return
        run = self.driven.run
        if run.scaler is not None and not self.scaled:
            raise RuntimeError("precision fp16 scales the loss before its backward: call sweeper.loop.backward(loss) "
                               "instead of loss.backward()")
        self.driven.computed()
        run.finish(self.step)
        self.stepped = True

    def backward(self, loss: torch.Tensor) -> None:
        """The micro-batch's backward (fp16: of the scaled loss), its loss noted as report(loss=) notes it."""
        run = self._driven("run the backward").run
        self.report({"loss": loss})
        self.scaled = True
        (run.scaler.scale(loss) if run.scaler is not None else loss).backward()

    def report(self, figures: Dict[str, Any]) -> None:
        """Inside a pass: the micro-batch's training loss and figures (recorded per step, the figures as
        step_metric_<name>). Between passes: an evaluation's figures (val_accuracy, val_loss and yours)."""
        if self.in_pass:
            self.pending.update({k: v for k, v in figures.items() if v is not None})
            return
        self._driven("report an evaluation")
        found = {k: float(v) for k, v in figures.items() if k != "loss" and v is not None}
        if found:
            seconds = time.perf_counter() - self.since
            self.driven.evaluated(found, seconds)
            self.since = time.perf_counter()

    def accumulate(self, model: nn.Module):
        """The micro-batch's gradient sync as the prepared loader sets it (none before a step's last)."""
        self._driven("accumulate")
        return sharding.accumulation_context(self.model, max(self.micro, 0), self.spec.point.accumulation_steps)

    def returned(self) -> None:
        """Your loop returned: it trained the budget (or stopped early with the point)."""
        driven = self._driven("train")
        if not self.finished:
            done = self.step + self.stepped  # a step whose optimizer stepped before the loop left it counts
            raise RuntimeError(f"your loop returned after {done} of the point's {driven.steps} optimizer steps: "
                               "iterate the prepared loader config['epochs'] times, to its end")
        self._leave_out()

    def close(self, exc: Optional[BaseException] = None) -> None:
        if self.driven is not None:
            self.driven.close(exc)
        if self.model is not None:
            _sync(self.model, True)

    def _driven(self, what: str) -> Driven:
        if self.driven is None:
            raise RuntimeError(f"your loop tried to {what} before sweeper.loop.prepare(model, optimizer, loader)")
        return self.driven


class PreparedOptimizer(torch.optim.Optimizer):
    """Your optimizer as sweeper.loop.prepare returns it: `step()` is the point's optimizer step (after a step's
    last micro-batch; while accumulating, nothing), `zero_grad()` nothing (the step zeroes the gradients);
    everything else is your optimizer's (its param_groups, state, state_dict; an LR scheduler made on either
    drives the same groups)."""

    def __init__(self, optimizer: torch.optim.Optimizer, session: Session):  # noqa: D107 - no Optimizer.__init__
        self.optimizer, self._session = optimizer, session

    @property
    def param_groups(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self):  # type: ignore[override]
        return self.optimizer.defaults

    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise TypeError("the prepared optimizer's step takes no closure: compute the loss, backward, then step")
        self._session.optimizer_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"Prepared({self.optimizer!r})"


class PreparedLoader:
    """Your training loader as sweeper.loop.prepare returns it: each `for batch in loader` is one pass of the
    point's stream (Session.passes), its micro-batches on the device; `len` the micro-batches of the point."""

    def __init__(self, session: Session, micro_batches: int):
        self._session, self._length = session, micro_batches

    def __iter__(self) -> Iterator[Any]:
        return self._session.passes()

    def __len__(self) -> int:
        return self._length


def _sync(model: Optional[nn.Module], sync: bool) -> None:
    """The next backward's gradient sync on or off, as DDP's no_sync and FSDP2's set_requires_gradient_sync
    set it (DDP reads it in forward: set before the micro-batch's forward)."""
    if model is None:
        return
    if sharding.is_sharded(model):
        model.set_requires_gradient_sync(sync)
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        model.require_backward_grad_sync = sync


def _autocast(model: nn.Module, device: torch.device, precision: str) -> None:
    """bf16/fp16: the model's forward under autocast, its floating outputs returned in fp32 (your loss then
    computes in fp32, as Lightning Fabric's mixed precision returns them)."""
    if recipe.PRECISIONS[precision] is None:
        return
    from torch.utils._pytree import tree_map_only

    entered: List[Any] = []

    def enter(module: nn.Module, args) -> None:
        context = recipe.autocast(device, precision)
        context.__enter__()
        entered.append(context)

    def leave(module: nn.Module, args, output):
        entered.pop().__exit__(None, None, None)
        return tree_map_only(torch.Tensor, lambda t: t.float() if t.is_floating_point() else t, output)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def _as_tensor(value: Any, like: torch.Tensor) -> torch.Tensor:
    """A reported figure as a float64 0-d tensor on the device (a tensor is detached, a float stays a host
    number until added in: no sync)."""
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device=like.device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=like.device)

