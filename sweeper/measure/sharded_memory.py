"""Peak memory per worker of a training step under each data-parallel layout (DDP, ZeRO-2, ZeRO-3: FSDP2),
predicted before launch from the model's parameter shapes, the layout, the accumulation mode, the optimizer's
measured cost and the activation bytes per sample. Standard library only (the layouts' phases are
measure.layouts', the layouts' names plan.py's).

The peak is the largest of the step's phases: forward's top, backward (its top or its end) and the optimizer
step (measure.layouts says what each holds). What the figures are compared against: torch's MemTracker per rank
(the tensors of one step; scripts/bench_sharding.py, docs/parallelism.md). On CUDA the device holds more than
the tensors (its context, NCCL's buffers, the caching allocator's rounding and fragmentation): `CUDA_MARGIN`,
added to a prediction only for a CUDA worker.
zero1 and hsdp (issue 57) are priced from those: zero1 is DDP's phases with the most loaded rank's share of
the optimizer state (ZeroRedundancyOptimizer's partition by whole tensors), hsdp ZeRO-3's within a node (its
shard group is a node's ranks; the all-reduce across nodes runs on the sharded gradients in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from sweeper.measure.layouts import LAYOUTS, PHASES, Sizes
from sweeper.plan import PARALLELISMS

MIB = 2 ** 20
# The parallelisms priced from another layout's phases (issue 57): zero1 is DDP's with its optimizer state
# partitioned, hsdp ZeRO-3's over a node's ranks. Every other one is a measure.layouts class.
DERIVED = {"zero1": "ddp", "hsdp": "zero3"}
# autocast's low-precision copies of the weights (bf16/fp16: 2 bytes a parameter; a probe measured 24.29 MiB
# for a 12.7M-parameter GPT): inside the activation intercept fitted on the unsharded model, and absent under
# FSDP2's mixed precision, whose gathered weights are already bf16 (counted as `gathered`).
AUTOCAST_COPY_BYTES_PER_PARAMETER = 2
# The prediction's error against the largest rank's tracked peak, (lowest, highest) over every layout of
# scripts/bench_sharding.py (docs/parallelism.md): a point predicted over the budget by less than the highest
# over-prediction may fit, so it runs (its budget then enforced on the device or simulated on the tracked step).
PREDICTION_ERROR_BAND = (-0.07, 0.07)  # measured -6.4 % to +5.1 % over 78 layouts


@dataclass(frozen=True)
class DeviceMargin:
    """What a device holds beyond the step's tensors: a fraction of them (the caching allocator's block rounding
    and fragmentation: reserved above allocated) and a fixed part (the CUDA context, NCCL's buffers)."""

    fraction: float
    fixed_bytes: int

    def of(self, tensor_bytes: int) -> int:
        return int(round(tensor_bytes * self.fraction)) + self.fixed_bytes


# A CUDA worker: the context of torch 2.x with lazily loaded kernels (~0.5 GiB), NCCL's communicator buffers
# (~0.25 GiB for one intra-node ring), 10 % allocator slack. Not yet measured here: scripts/gpu_check.py prints
# max_memory_reserved against max_memory_allocated (the fraction) on a GPU to check it.
CUDA_MARGIN = DeviceMargin(fraction=0.10, fixed_bytes=768 * MIB)
NO_MARGIN = DeviceMargin(0.0, 0)


def margin_for(device_type: str) -> DeviceMargin:
    """The margin for a worker on `device_type` ("cuda" or "cpu"): CUDA's, or none (a CPU's budget is simulated
    on the tracked tensors themselves)."""
    return CUDA_MARGIN if device_type == "cuda" else NO_MARGIN


@dataclass(frozen=True)
class Unit:
    """What `fully_shard` groups: a block (or the root: every parameter no block holds), by parameter shape."""

    name: str
    shapes: Tuple[Tuple[int, ...], ...]

    def numel(self, shard_group: int = 1) -> int:
        """Elements of the whole unit, each parameter's dim 0 padded to a multiple of `shard_group`."""
        return sum(_padded(shape, shard_group) for shape in self.shapes)


def _padded(shape: Sequence[int], group: int) -> int:
    rest = math.prod(shape[1:]) if len(shape) > 1 else 1
    first = shape[0] if shape else 1
    return math.ceil(first / group) * group * rest


def units_of(model: Any, blocks: Iterable[Any]) -> List[Unit]:
    """The units of `model` (a torch module, read through `named_parameters`/`parameters` only): each block in
    `blocks` (recipe.blocks: the ones sharding wraps), then the root with every parameter left. A parameter shared
    by two places (a tied head) counts once, where `named_parameters` first names it."""
    owner = {}
    units: List[Unit] = []
    for i, block in enumerate(blocks):
        shapes = []
        for p in block.parameters():
            if id(p) not in owner:
                owner[id(p)] = i
                shapes.append(tuple(p.shape))
        units.append(Unit(f"block{i}", tuple(shapes)))
    root = tuple(tuple(p.shape) for _, p in model.named_parameters() if id(p) not in owner)
    return units + [Unit("root", root)]


@dataclass(frozen=True)
class OptimizerCost:
    """An optimizer's memory per parameter element, measured once on small tensors (fake_memory.optimizer_cost):
    its state (AdamW: two fp32 moments, 8 bytes, and a 4-byte `step` per tensor; SGD with momentum 4) and its
    step's temporaries, over the whole group at once (a foreach step: AdamW's sqrt of every second moment) or a
    tensor at a time (the CPU's single-tensor loop: two of the largest tensor)."""

    state_bytes_per_value: float
    state_bytes_per_tensor: float = 0.0
    step_bytes_per_value: float = 0.0
    step_bytes_per_largest_value: float = 0.0

    def state(self, values: int, tensors: int) -> int:
        return int(round(self.state_bytes_per_value * values + self.state_bytes_per_tensor * tensors))

    def temporaries(self, values: int, largest_values: int) -> int:
        return int(round(self.step_bytes_per_value * values + self.step_bytes_per_largest_value * largest_values))


# torch.optim.AdamW on the CPU (single-tensor) and on CUDA (foreach), as fake_memory.optimizer_cost measures them.
ADAMW_CPU = OptimizerCost(8.0, 4.0, 0.0, 8.0)


@dataclass(frozen=True)
class Prediction:
    """Bytes per worker in each phase of the step, by what holds them; `total` is the prediction: the largest
    phase, plus the device's margin (CUDA_MARGIN on a CUDA worker)."""

    phases: Tuple[Tuple[str, Tuple[Tuple[str, int], ...]], ...]
    margin_bytes: int = 0

    def phase_bytes(self, phase: str) -> int:
        return sum(value for name, parts in self.phases if name == phase for _, value in parts)

    @property
    def phase(self) -> str:
        """The phase of the peak (the first of equals, in step order)."""
        return max(PHASES, key=lambda p: (self.phase_bytes(p), -PHASES.index(p)))

    @property
    def parts(self) -> Dict[str, int]:
        """The peak phase's bytes by what holds them."""
        return {n: v for name, parts in self.phases if name == self.phase for n, v in parts}

    @property
    def tensor_bytes(self) -> int:
        return self.phase_bytes(self.phase)

    @property
    def total(self) -> int:
        return self.tensor_bytes + self.margin_bytes

    @property
    def optimizer_state_bytes(self) -> int:
        """The optimizer state held at the peak."""
        return self.get("optimizer_state")

    def get(self, part: str) -> int:
        """One part of the peak phase (0 when it holds none)."""
        return self.parts.get(part, 0)


def sizes_of(units: Sequence[Unit], parallelism: str, workers: int, micro_batch_size: int, accumulation_steps: int,
             activation_bytes_per_sample: float, activation_fixed_bytes: float = 0.0, bytes_per_value: int = 4,
             gather_bytes_per_value: Optional[int] = None, optimizer: OptimizerCost = ADAMW_CPU,
             gradient_sync: str = "final") -> Sizes:
    """The pieces measure.layouts combines, for one point on one worker (arguments as `peak`'s)."""
    layout = LAYOUTS[parallelism]
    gather = gather_bytes_per_value or bytes_per_value
    group = workers if layout.sharded else 1
    blocks = [u for u in units if u.name != "root"] or [Unit("none", ())]
    root = next((u for u in units if u.name == "root"), Unit("root", ()))
    unit = max(blocks, key=lambda u: u.numel(group))
    shapes = [s for u in units for s in u.shapes]
    values = sum(u.numel(group) for u in units)
    own_values = values // group if layout.sharded else sum(u.numel() for u in units)
    largest = max((_padded(s, group) for s in shapes), default=0)
    fixed = activation_fixed_bytes
    if layout.sharded and gather < bytes_per_value:  # FSDP2's bf16 weights are the gathered ones, not autocast's
        fixed = max(0.0, fixed - AUTOCAST_COPY_BYTES_PER_PARAMETER * sum(u.numel() for u in units))
    return Sizes(
        own=own_values * bytes_per_value, whole=sum(u.numel() for u in units) * bytes_per_value,
        gathered=values * gather, root=root.numel(group) * gather, unit=unit.numel(group) * gather,
        root_reduce=root.numel(group) * bytes_per_value, unit_reduce=unit.numel(group) * bytes_per_value,
        gradients_whole=sum(u.numel() for u in units) * bytes_per_value,
        sharded_gradients=own_values * bytes_per_value,
        largest=largest * bytes_per_value,
        state=optimizer.state(own_values, len(shapes)),
        activations=int(round(fixed + activation_bytes_per_sample * micro_batch_size)),
        optimizer_temporaries=optimizer.temporaries(own_values, largest // group if layout.sharded else largest),
        workers=workers, accumulation_steps=accumulation_steps, every=gradient_sync == "every")


def peak(units: Sequence[Unit], parallelism: str, workers: int, micro_batch_size: int, accumulation_steps: int,
         activation_bytes_per_sample: float, activation_fixed_bytes: float = 0.0, bytes_per_value: int = 4,
         gather_bytes_per_value: Optional[int] = None, optimizer: OptimizerCost = ADAMW_CPU,
         gradient_sync: str = "final", margin: DeviceMargin = NO_MARGIN,
         ranks_per_node: Optional[int] = None) -> Prediction:
    """The peak per worker of one optimizer step at `workers` data-parallel workers (the shard group: FSDP2
    shards over all of them), `micro_batch_size` samples per micro-step and `accumulation_steps` micro-steps.

    `activation_bytes_per_sample` (and `activation_fixed_bytes`): what forward keeps for backward, fitted on the
    unsharded model as the sweep fits it (fake_memory.activation_fit); activations are never sharded.
    `bytes_per_value`: the weights', gradients' and optimizer state's dtype (fp32: 4); `gather_bytes_per_value`:
    the gathered weights' (bf16 under FSDP2's MixedPrecisionPolicy: 2; default the same). `optimizer`: its state
    and step temporaries per element. `gradient_sync`: `final` (the reduce skipped before the last micro-step:
    unsharded gradients held) or `every` (a reduce per micro-step: sharded ones held). `margin`: the device's
    (margin_for). `ranks_per_node`: hsdp's shard group (None: every worker on one node, as on a local Ray; the
    mesh across nodes is known once placed)."""
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism {parallelism!r} is invalid. Should be one of {list(PARALLELISMS)}.")
    if workers < 1 or micro_batch_size < 1 or accumulation_steps < 1:
        raise ValueError(f"workers {workers}, micro-batch {micro_batch_size} and accumulation {accumulation_steps} "
                         "must be at least 1")
    same = dict(activation_fixed_bytes=activation_fixed_bytes, bytes_per_value=bytes_per_value,
                gather_bytes_per_value=gather_bytes_per_value, optimizer=optimizer, gradient_sync=gradient_sync,
                margin=margin)
    point = (micro_batch_size, accumulation_steps, activation_bytes_per_sample)
    if parallelism == "zero1":
        ddp = peak(units, DERIVED["zero1"], workers, *point, **{**same, "margin": NO_MARGIN})
        return _zero1(ddp, units, workers, optimizer, margin)
    if parallelism == "hsdp":
        return peak(units, DERIVED["hsdp"], ranks_per_node or workers, *point, **same)
    sizes = sizes_of(units, parallelism, workers, micro_batch_size, accumulation_steps, activation_bytes_per_sample,
                     activation_fixed_bytes, bytes_per_value, gather_bytes_per_value, optimizer, gradient_sync)
    phases = LAYOUTS[parallelism].phases(sizes)
    frozen = tuple((phase, tuple(sorted(phases[phase].items()))) for phase in PHASES)
    tensors = max(sum(parts.values()) for parts in phases.values())
    return Prediction(frozen, margin.of(tensors) if margin.fraction or margin.fixed_bytes else 0)



# zero1 (issue 57): DDP's peak, its optimizer state ZeroRedundancyOptimizer's share on the most loaded rank.

def zero1_shares(units: Sequence[Unit], workers: int) -> List[Tuple[int, int]]:
    """(parameter values, tensors) whose optimizer state each rank holds under ZeroRedundancyOptimizer (torch
    2.14's `_partition_parameters`): whole tensors, the largest first, each to the rank holding the fewest
    values so far (the lowest such rank on a tie)."""
    loads = [[0, 0] for _ in range(workers)]
    for numel in sorted((math.prod(shape) for u in units for shape in u.shapes), reverse=True):
        least = min(range(workers), key=lambda r: loads[r][0])
        loads[least][0] += numel
        loads[least][1] += 1
    return [(values, tensors) for values, tensors in loads]


def _zero1(ddp: Prediction, units: Sequence[Unit], workers: int, optimizer: OptimizerCost,
           margin: DeviceMargin) -> Prediction:
    """DDP's phases (`ddp`, predicted without a margin) with the optimizer state the most loaded rank's share."""
    values, tensors = max(zero1_shares(units, workers))
    state = optimizer.state(values, tensors)
    phases = tuple((name, tuple((part, state if part == "optimizer_state" else value) for part, value in parts))
                   for name, parts in ddp.phases)
    tensor_bytes = max(sum(value for _, value in parts) for _, parts in phases)
    return Prediction(phases, margin.of(tensor_bytes) if margin.fraction or margin.fixed_bytes else 0)


def _shown(prediction: Prediction) -> str:
    parts = sorted(((v, n) for n, v in prediction.parts.items()), reverse=True)[:3]
    shown = ", ".join(f"{name} {value / MIB:.1f}" for value, name in parts)
    margin = f" + {prediction.margin_bytes / MIB:.0f} MiB CUDA margin" if prediction.margin_bytes else ""
    return f"{prediction.phase}: {shown} MiB{margin}"


def over_budget(prediction: Prediction, budget_bytes: int, what: str,
                band: Tuple[float, float] = PREDICTION_ERROR_BAND) -> Optional[str]:
    """Why a point is skipped before launch (None: it may fit): one line with the prediction, its phase and its
    largest parts. Skipped only beyond the error band: a prediction up to `band[1]` over the budget may be an
    over-prediction of a peak that fits."""
    if prediction.total <= budget_bytes * (1 + band[1]):
        return None
    return (f"{what}: predicted {prediction.total / MIB:.1f} MiB per worker ({_shown(prediction)}) is over "
            f"device.memory_budget_gb ({budget_bytes / MIB:.1f} MiB) by more than the prediction's error "
            f"(+{band[1]:.0%}): skipped, not launched")


def near_budget(prediction: Prediction, budget_bytes: int, what: str,
                band: Tuple[float, float] = PREDICTION_ERROR_BAND) -> Optional[str]:
    """A point predicted over the budget but within the error band (launched: its measured peak decides), one
    line; None otherwise."""
    if prediction.total <= budget_bytes or over_budget(prediction, budget_bytes, what, band):
        return None
    over = prediction.total / budget_bytes - 1
    return (f"{what}: predicted {prediction.total / MIB:.1f} MiB per worker, {over:.1%} over "
            f"device.memory_budget_gb ({budget_bytes / MIB:.1f} MiB), within the prediction's error "
            f"({band[0]:+.0%} to {band[1]:+.0%}): launched, its measured peak decides")


def by_phase(prediction: Prediction) -> Dict[str, int]:
    """Each phase's predicted bytes (the margin not included)."""
    return {phase: prediction.phase_bytes(phase) for phase in PHASES}
