"""Tensor memory of one optimizer step, split by category at the step's peak: measured on a real
step, simulated against a budget on CPU, or estimated on fake tensors without running anything.

Built on torch's own MemTracker (a dispatch mode) and FakeTensorMode; knows torch only.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import (
    _TOTAL_KEY,
    MemTracker,
    _MemRefType,
    _UpdateType,
    _WeakRefInfo,
)
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from sweeper import recipe
from sweeper.config import OptimConfig
from sweeper.workloads.samples import Samples, cross_entropy

_CATEGORIES = {
    "parameters_bytes": _MemRefType.PARAM,
    "buffers_bytes": _MemRefType.BUFFER,
    "gradients_bytes": _MemRefType.GRAD,
    "optimizer_state_bytes": _MemRefType.OPT,
    "activations_bytes": _MemRefType.ACT,
    "temporaries_bytes": _MemRefType.TEMP,
    "other_bytes": _MemRefType.OTH,
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Tensor bytes on one device at the instant of the step's peak, by category.

    The seven categories are the bytes held at the moment the tracked total was highest,
    so they add up to `peak_bytes` exactly:

    - parameters_bytes: the module's parameters.
    - buffers_bytes: the module's buffers (BatchNorm running statistics).
    - gradients_bytes: tensors autograd hands to a parameter as its gradient: the `.grad`
      tensors, and the gradient just computed for a parameter even if the peak came
      before it was assigned. Under accumulation a parameter's accumulated `.grad` and
      the next micro-batch's gradient for it can coexist at the peak, so this can exceed
      parameters_bytes.
    - optimizer_state_bytes: optimizer state that outlives `optimizer.step()` (momentum
      buffers; Adam's two moments and its `step` tensors).
    - activations_bytes: tensors created outside backward and outside the optimizer step
      and still alive: what forward saved for backward, its outputs, the loss, input
      batches built inside `step()`.
    - temporaries_bytes: tensors created in backward that are not gradients of parameters
      (gradients of activations, workspace), and tensors `optimizer.step()` creates and
      frees (Adam's denominator).
    - other_bytes: tensors the step touches that outlive it without being any of the
      above: DDP's gradient buckets (the size of the gradients, once per bucket), a loss
      log the step writes into in place.

    peak_bytes: MemTracker's peak total for the device: the tensors above, counted once per
    storage at their exact size (CPU) or rounded up to 512 bytes (CUDA). A dispatch mode
    sees a tensor only once an op creates or touches it, so tensors the step does not reach
    before the peak (a batch loaded before the call, a DDP bucket first written after the
    peak) are missing, as are allocator caching and fragmentation: a lower bound on what
    the device must hold, not the device's measured peak.

    forward_activations_bytes: not part of the sum: the largest activation memory at the
    end of a top-level forward call (of any micro-batch), less tensors outliving the step.
    Everything forward keeps for backward is alive then, so it grows linearly with the
    micro-batch size, whereas activations_bytes depends on where in backward the peak
    falls (for resnet18 the peak moves as the batch grows).

    forward_peak_bytes, backward_peak_bytes, optimizer_peak_bytes: not part of the sum: the
    highest tracked total while the step was in each phase (forward: from a top-level forward's
    start, the loss included; backward: from autograd's first op (the gradient reduce FSDP2 and
    DDP issue there included) until the next forward or the optimizer step, so backward's end
    is backward's; optimizer: from `optimizer.step()` to the step's end, zero_grad included). peak_bytes is the
    largest of the three; which one it is says where the step's peak is (measure.sharded_memory predicts each).
    """

    parameters_bytes: int
    buffers_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    temporaries_bytes: int
    other_bytes: int
    peak_bytes: int
    forward_activations_bytes: int
    forward_peak_bytes: int = 0
    backward_peak_bytes: int = 0
    optimizer_peak_bytes: int = 0

    def as_metrics(self, prefix: str = "memory_") -> Dict[str, int]:
        # "tracked_peak" keeps it apart from the device-level peak_memory_bytes of a trial.
        names = {"peak_bytes": "tracked_peak_bytes"}
        return {f"{prefix}{names.get(f.name, f.name)}": getattr(self, f.name) for f in fields(self)}


class SimulatedOutOfMemoryError(torch.OutOfMemoryError):
    """A CPU step went over `device.memory_budget_gb`: raised by the op whose output crossed the
    budget, as the allocator raises a real out-of-memory error. A torch.OutOfMemoryError (the type a
    CUDA OOM has) whose text is the CPU allocator's, so code that recognizes either (Lightning's
    `is_oom_error`, sweeper's own) treats it as the real thing; the type name says it is simulated."""


class _HindsightMemTracker(MemTracker):
    """MemTracker whose peak snapshot is relabelled with what the rest of the step reveals.

    MemTracker freezes the categories at the peak instant, with labels given on first
    sight. Three are wrong then: a parameter's gradient is "Temp" until autograd hands it
    to the parameter's hook, often just after the op that made the peak (the last gradient
    backward computes is the first layer's, often the largest); everything created inside
    `optimizer.step()` is "Optstate", scratch buffers included; and a tensor that outlives
    the step (DDP's gradient bucket) is "Activation" or "Temp", after the phase that first
    touched it. Totals are untouched.
    """

    def __init__(self, budget_bytes: Optional[int] = None) -> None:
        super().__init__()
        # Simulated device memory: an op whose outputs take the tracked total over this raises.
        self.budget_bytes = budget_bytes
        self._event = 0  # counts snapshot updates: the clock for "alive at the peak"
        self._enter_event = 0
        self._peak_event: Dict[torch.device, int] = {}
        self._born: Dict[int, int] = {}  # id(winfo) -> event of its allocation or resize
        self._forward_ends: List[Tuple[int, Dict[torch.device, int]]] = []
        self._act_survivors: List[Tuple[torch.device, int, int]] = []
        # forward | backward | optimizer: forward from a top-level forward's start, backward from autograd's
        # first op until the next forward or the optimizer step, optimizer from its step to the step's end.
        self.phase = "forward"
        self._phase_peaks: Dict[torch.device, Dict[str, int]] = {}

    def __enter__(self) -> "_HindsightMemTracker":
        super().__enter__()
        if self._depth == 1:
            self._enter_event = self._event
            self._peak_event = {dev: self._event for dev in self._peak_mem}
        return self

    def __exit__(self, *args) -> None:
        if self._depth == 1:
            self._relabel_survivors()
        super().__exit__(*args)

    def note_forward_end(self) -> None:
        acts = {dev: snap[_MemRefType.ACT] for dev, snap in self._curr_mem_snap.items()}
        self._forward_ends.append((self._event, acts))

    def forward_activations(self, device: torch.device) -> int:
        """Largest activation bytes at a noted forward end, less tensors outliving the step.

        A DDP bucket rebuilt inside the forward (the second iteration) is one of those.
        """
        best = 0
        for event, acts in self._forward_ends:
            surviving = sum(size for dev, born, size in self._act_survivors if dev == device and born <= event)
            best = max(best, acts.get(device, 0) - surviving)
        return best

    def _update_peak_stats(self, peak_state) -> None:
        before = dict(self._peak_mem)
        super()._update_peak_stats(peak_state)
        for dev, total in self._peak_mem.items():
            if before.get(dev) != total:
                self._peak_event[dev] = self._event

    def _update_snap(
        self,
        u_type: _UpdateType,
        winfo: _WeakRefInfo,
        old_mem_consumed: Optional[int] = None,
        old_reftype: Optional[_MemRefType] = None,
    ) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        self._event += 1
        if self._depth > 0:
            self._note_phase(winfo.device)
        if u_type in (_UpdateType.ADD, _UpdateType.SIZE):
            # A storage resized after the peak had another size at the peak: never patch it.
            self._born[id(winfo)] = self._event
            self._enforce_budget(winfo)
            return
        born = self._born.get(id(winfo), math.inf)
        if u_type is _UpdateType.DEL:
            self._born.pop(id(winfo), None)
        if not self._alive_at_peak(winfo, born):
            return
        if u_type is _UpdateType.REF:
            self._move_at_peak(winfo, old_reftype, winfo.reftype)
        elif self._depth > 0 and winfo.reftype is _MemRefType.OPT and born > self._enter_event:
            # Created in this step and freed in it: scratch space, not optimizer state.
            self._move_at_peak(winfo, _MemRefType.OPT, _MemRefType.TEMP)

    def _note_phase(self, device: torch.device) -> None:
        if self.phase == "forward" and _in_backward():
            self.phase = "backward"
        peaks = self._phase_peaks.setdefault(device, {})
        peaks[self.phase] = max(peaks.get(self.phase, 0), self._curr_mem_snap[device][_TOTAL_KEY])

    def optimizer_phase(self, *_) -> None:
        """An optimizer's step pre-hook: from optimizer.step() to the step's end is the optimizer's phase
        (zero_grad frees the gradients after it, so the moment between, the gradients and the updated state
        alive together, is the optimizer's too)."""
        self.phase = "optimizer"

    def phase_peaks(self, device: torch.device) -> Dict[str, int]:
        """The highest tracked total in each phase of the step (forward, backward, optimizer)."""
        return {f"{phase}_peak_bytes": peak for phase, peak in self._phase_peaks.get(device, {}).items()}

    def _enforce_budget(self, winfo: _WeakRefInfo) -> None:
        if self.budget_bytes is None or self._depth == 0:
            return
        total = self._curr_mem_snap[winfo.device][_TOTAL_KEY]
        if total > self.budget_bytes:
            raise SimulatedOutOfMemoryError(
                f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {winfo.mem_consumed} "
                f"bytes (simulated: tensor memory would reach {total} bytes, over the budget of "
                f"{self.budget_bytes} bytes, device.memory_budget_gb)"
            )

    def _relabel_survivors(self) -> None:
        # Activations and temporaries die within the step; one that is still alive is
        # memory the step keeps (a DDP bucket, a loss log written in place): "Other".
        for winfo, _ in list(self._WINFO.values()):
            if winfo.reftype not in (_MemRefType.ACT, _MemRefType.TEMP):
                continue
            born = self._born.get(id(winfo), math.inf)
            if winfo.reftype is _MemRefType.ACT:
                self._act_survivors.append((winfo.device, born, winfo.mem_consumed))
            if self._alive_at_peak(winfo, born):
                self._move_at_peak(winfo, winfo.reftype, _MemRefType.OTH)

    def _alive_at_peak(self, winfo: _WeakRefInfo, born: float) -> bool:
        # Called only for storages alive now: born before the peak means alive at it.
        return born <= self._peak_event.get(winfo.device, -1)

    def _move_at_peak(self, winfo: _WeakRefInfo, old: _MemRefType, new: _MemRefType) -> None:
        snap = self._peak_mem_snap[winfo.device]
        snap[old] -= winfo.mem_consumed
        snap[new] += winfo.mem_consumed


def _in_backward() -> bool:
    # The test ModTracker uses; forwards re-run in backward (checkpointing) must not count.
    return torch._C._current_graph_task_id() != -1


def _resolve(device: torch.device) -> torch.device:
    # MemTracker keys its snapshots by tensor.device, which always names a CUDA index.
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def track_step(
    model: nn.Module,
    optimizer: Optional[torch.optim.Optimizer],
    step: Callable[[], None],
    device: torch.device,
    budget_bytes: Optional[int] = None,
) -> MemoryBreakdown:
    """Run `step()` (one whole optimizer step) once under MemTracker; return `device`'s bytes.

    `model` may be a DistributedDataParallel wrapper or its module (the same parameters).
    With `budget_bytes`, the op that takes the tracked total over it raises
    SimulatedOutOfMemoryError (CPU: a budget no allocator enforces).
    Nothing stays installed afterwards: no hooks, no dispatch mode.
    """
    with tracking(model, optimizer, device, budget_bytes) as breakdown:
        step()
    return breakdown()


@contextmanager
def tracking(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
             budget_bytes: Optional[int] = None) -> Iterator[Callable[[], MemoryBreakdown]]:
    """track_step's tracker around whatever runs inside (a step someone else drives: your loop, Lightning's
    Trainer, entered and left at its step's edges); yields the function that reads the breakdown once it is left."""
    device = _resolve(device)
    tracker = _HindsightMemTracker(budget_bytes)
    # A dispatch mode only sees tensors created under it: parameters, buffers, gradients
    # kept by zero_grad(set_to_none=False) and optimizer state from earlier steps must be
    # registered, or they would be missing (and the state not counted as optimizer state).
    tracker.track_external(model, optimizer)
    depth = 0

    def before_forward(module: nn.Module, args) -> None:
        nonlocal depth
        if depth == 0 and not _in_backward():
            tracker.phase = "forward"
        if depth == 0 and not _in_backward() and module in tracker.memory_tracking:
            # MemTracker takes a second top-level forward of a module for the next
            # iteration and raises; accumulation micro-batches are exactly that. Its
            # per-module statistics are dropped; the device-wide peak is kept.
            tracker.reset_mod_stats()
        depth += 1

    def after_forward(module: nn.Module, args, output) -> None:
        nonlocal depth
        depth -= 1
        if depth == 0 and not _in_backward():
            tracker.note_forward_end()

    def breakdown() -> MemoryBreakdown:
        peak = tracker.get_tracker_snapshot("peak").get(device, {})
        return MemoryBreakdown(
            **{name: peak.get(ref, 0) for name, ref in _CATEGORIES.items()},
            peak_bytes=peak.get(_TOTAL_KEY, 0),
            forward_activations_bytes=tracker.forward_activations(device),
            **tracker.phase_peaks(device),
        )

    # Registered before MemTracker registers its own global hooks, so these run first.
    handles = (
        register_module_forward_pre_hook(before_forward),
        register_module_forward_hook(after_forward, always_call=True),
    )
    if optimizer is not None:
        handles += (optimizer.register_step_pre_hook(tracker.optimizer_phase),)
    try:
        with tracker:
            yield breakdown
    finally:
        for handle in handles:
            handle.remove()


def estimate_step(
    build_model: Callable[[], nn.Module],
    samples: Samples,
    micro_batch_size: int,
    accumulation_steps: int = 1,
    num_workers: int = 1,
    optim: Optional[OptimConfig] = None,
    precision: str = "fp32",
    checkpointing: str = "none",
    checkpoint_modules: Sequence[str] = (),
) -> MemoryBreakdown:
    """The breakdown of one steady-state training step, in the points' recipe (optimizer, autocast
    precision, activation checkpointing; SGD with momentum by default), predicted without computing
    or allocating anything: the model is built and the step run on fake tensors, so a laptop answers
    for a model and a batch no device here could hold.

    Two steps run: the first builds the optimizer state, the second is tracked. With more than one
    worker, DDP's gradient buckets (one flat copy of the trainable gradients, alive through the
    step) are added to `other_bytes`; they are not traced, since fake tensors have no process group.
    What no tensor trace sees is not included: the CUDA context, cuDNN/cuBLAS workspaces and the
    caching allocator's rounding and fragmentation.
    """
    # The builder's weight init draws from the global generator; an estimate must not shift the
    # random stream of the training run that asked for it.
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), FakeTensorMode():
        model = build_model()
        recipe.apply_checkpointing(model, checkpointing, checkpoint_modules)
        model.train()
        optimizer = recipe.build_optimizer(optim or OptimConfig(), model, lr=0.1)
        cpu = torch.device("cpu")

        def step() -> None:
            for _ in range(accumulation_steps):
                inputs, targets = samples.batch(micro_batch_size)
                with recipe.autocast(cpu, precision):
                    loss = cross_entropy(model(inputs), targets)
                (loss / accumulation_steps).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        breakdown = track_step(model, optimizer, step, torch.device("cpu"))
        buckets = 0
        if num_workers > 1:
            buckets = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return replace(breakdown, other_bytes=breakdown.other_bytes + buckets, peak_bytes=breakdown.peak_bytes + buckets)
