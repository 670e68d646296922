"""Sharded data parallelism for a point's model: `ddp` (torch's DistributedDataParallel, every rank holds
everything), `zero2` and `zero3` (FSDP2's `fully_shard` per block, then at the root, as torchtitan's
`parallelize` does). Knows torch only; the blocks are the ones activation checkpointing finds (recipe.blocks).

What each keeps per rank, over a shard group of N (FSDP2 in torch 2.14, read from its source):
- zero2 (`reshard_after_forward=False`): weights, gradients and optimizer state sharded 1/N between steps;
  a block's gathered weights stay from its forward until its backward is done (weights gathered once per
  step), so the whole model's weights are resident at the top of backward.
- zero3 (`reshard_after_forward=True` per block): a block's gathered weights are freed after its forward
  and gathered again for its backward: at most the root's and a block or two's are whole at a time.
The root keeps `reshard_after_forward=False` in both: its weights (embeddings, a tied head) are needed at
the end of forward and at once at the start of backward, so freeing them between saves nothing at the peak.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from sweeper import recipe
from sweeper.plan import PARALLELISMS
from sweeper.worker import state

SHARDED = ("zero2", "zero3")
RESHARD_AFTER_FORWARD = {"zero2": False, "zero3": True}
# Whether micro-steps before the last keep the gathered weights after their backward: ZeRO-2 holds them all
# at the top of backward anyway, so keeping them costs no peak and saves a gather per unit per micro-step;
# ZeRO-3 would hold the whole model gathered, which it exists not to do.
KEEPS_GATHERED = {"ddp": False, "zero2": True, "zero3": False}
# How micro-steps before the last of an optimizer step skip the gradient reduce under `final`.
SYNC_MODES = {"ddp": "no_sync", "zero2": "set_requires_gradient_sync", "zero3": "set_requires_gradient_sync"}


@dataclass
class Sharding:
    """What `apply` did: the parallelism, the units sharded one at a time (the blocks' module names, then
    the root, ""), how accumulation skips the reduce, and the mixed-precision dtypes (None: fp32)."""

    parallelism: str
    units: List[str] = field(default_factory=list)
    sync_mode: str = "none"  # no_sync | set_requires_gradient_sync | none (one worker under DDP)
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None


def problems(parallelism: str, precision: str, model: Optional[nn.Module] = None,
             extra_types: Sequence[str] = ()) -> List[str]:
    """One line per reason `apply` would refuse (the key named, what to do instead); [] when it would not."""
    if parallelism not in PARALLELISMS:
        return [f"sweep.parallelism={parallelism!r} is invalid. Should be one of {list(PARALLELISMS)}."]
    if parallelism not in SHARDED:
        return []
    found = []
    if precision == "fp16":
        found.append(f"sweep.parallelism={parallelism} with precision fp16: fp16 under sharding needs a sharded "
                     "gradient scaler, which sweeper does not have: use bf16 (no loss scaling) or parallelism ddp")
    if model is not None and not recipe.blocks(model, extra_types):
        found.append(f"sweep.parallelism={parallelism}: {type(model).__name__} has no blocks to shard one at a time "
                     f"(none of {list(recipe.BLOCK_TYPES)}), and sharding it whole at the root would gather every "
                     "weight at once: name its block class in model.checkpoint_modules, or use parallelism ddp")
    return found


def mixed_precision(precision: str):
    """FSDP2's policy for the recipe's precision: bf16 gathers and computes the weights in bf16 and reduces
    the gradients in fp32 (the sharded weights, gradients and optimizer state stay fp32, as under DDP's
    autocast); fp32 changes nothing."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = recipe.PRECISIONS[precision]
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)


def apply(model: nn.Module, parallelism: str, group: Optional[dist.ProcessGroup] = None, precision: str = "fp32",
          extra_types: Sequence[str] = (), device: Optional[torch.device] = None):
    """(the model to train, a Sharding saying what was done). `ddp`: wrapped in DistributedDataParallel when the
    group has more than one rank (the model as it is otherwise). `zero2`/`zero3`: `fully_shard` on every block
    (recipe.blocks: after activation checkpointing, its Checkpointed wrappers), then on the root, over `group`
    (the default group when None; at one rank too, so a point's layout is the same code at every size).
    Raises ValueError with the problems() line when it refuses."""
    found = problems(parallelism, precision, model, extra_types)
    if found:
        raise ValueError("; ".join(found))
    device = device or next(model.parameters()).device
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    if parallelism == "ddp":
        if size == 1:
            return model, Sharding("ddp", sync_mode="none")
        ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
        return wrapped, Sharding("ddp", sync_mode=SYNC_MODES["ddp"])
    if not dist.is_initialized():
        raise ValueError(f"parallelism {parallelism} needs a process group (torch.distributed is not initialized)")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device.type)
    policy = mixed_precision(precision)
    names = {id(m): name for name, m in model.named_modules()}
    units = []
    for block in recipe.blocks(model, extra_types):
        fully_shard(block, mesh=mesh, reshard_after_forward=RESHARD_AFTER_FORWARD[parallelism], mp_policy=policy)
        units.append(names[id(block)])
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    units.append("")
    return model, Sharding(parallelism, units, SYNC_MODES[parallelism], policy.param_dtype, policy.reduce_dtype)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def accumulation_context(model: nn.Module, micro_step: int, accumulation_steps: int, gradient_sync: str = "final",
                         parallelism: str = "ddp"):
    """How one micro-step of an optimizer step reduces its gradients (`gradient_sync`, plan.GRADIENT_SYNCS):
    `final` skips the reduce on every micro-step but the last (DDP's `no_sync`; FSDP2's
    `set_requires_gradient_sync(False)`: each rank holds its blocks' *unsharded* gradients across the
    micro-steps and reduce-scatters them once, on the last); `every` reduces at every micro-step (DDP's
    all-reduce, FSDP2's reduce-scatter: only sharded gradients are held, more communication). Under ZeRO-2
    (`KEEPS_GATHERED`) the micro-steps before the last also keep the gathered weights after their backward
    (`set_reshard_after_backward(False)`), so the next micro-step's forward gathers nothing; the last reshards,
    so the optimizer steps on shards alone. Nothing to skip for one worker under DDP."""
    is_last = micro_step == accumulation_steps - 1
    if is_sharded(model):
        return _fsdp_micro_step(model, is_last or gradient_sync == "every", is_last or not KEEPS_GATHERED[parallelism])
    if isinstance(model, nn.parallel.DistributedDataParallel) and not is_last and gradient_sync != "every":
        return model.no_sync()
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_micro_step(model: nn.Module, sync: bool, reshard: bool):
    # Set before every micro-step (not only the skipped ones): a step that failed half-way leaves no
    # stale "skip" or "keep gathered" behind for the next point's first step.
    model.set_requires_gradient_sync(sync)
    model.set_reshard_after_backward(reshard)
    yield


def reduces_gradients(model: nn.Module) -> Optional[bool]:
    """Whether this micro-step's backward will reduce the gradients, read back from the wrapped model (call it
    inside accumulation_context): FSDP2's per-group `reduce_grads` flags (every one set), DDP's
    `require_backward_grad_sync`; None when nothing reduces (one worker under DDP, a bare model)."""
    if is_sharded(model):
        from torch.distributed.fsdp import FSDPModule

        return all(group.reduce_grads for m in model.modules() if isinstance(m, FSDPModule)
                   for group in m._get_fsdp_state()._fsdp_param_groups)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return bool(model.require_backward_grad_sync)
    return None


def observed_sync(model: nn.Module, micro_step: int, accumulation_steps: int) -> Optional[str]:
    """What the worker does, read inside the context of micro-step `micro_step` (the first, for one read per
    step): `every` when a micro-step before the last reduces, `final` when it does not (or when one
    micro-step reduces once), `none` when nothing reduces; None when this micro-step cannot tell."""
    reduces = reduces_gradients(model)
    if reduces is None:
        return "none"
    if accumulation_steps == 1:
        return "final"
    if micro_step == accumulation_steps - 1:
        return None
    return "every" if reduces else "final"


def inner(model: nn.Module) -> nn.Module:
    """The model without DDP's wrapper (FSDP2 shards in place: the model is its own module)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@contextlib.contextmanager
def process_group_for(parallelism: str, world_size: int):
    """FSDP2 needs a process group even for one worker, and a worker group of one worker runs in its Ray Tune
    trial's process with none: for a zero2/zero3 point at one worker there, a gloo group of this process alone
    (an in-memory store), for the point's length. Nothing otherwise (ddp, or a group already up)."""
    if parallelism not in SHARDED or world_size > 1 or dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def grad_norm(model: nn.Module, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """The whole gradient's 2-norm of a sharded model (after the reduce-scatter: each rank holds disjoint shards,
    FSDP2's padding zeros): each rank's shards' squares summed, then summed across `group`, as
    torch.nn.utils.get_total_norm does for DTensors. A collective: every rank calls it."""
    from sweeper.worker.gns import squared_norm

    local = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
             for p in model.parameters() if p.grad is not None]
    device = next(model.parameters()).device
    squares = torch.stack([squared_norm(g).double() for g in local]).sum() if local else \
        torch.zeros((), dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(squares, group=group)
    return squares.sqrt()


def local_bytes(tensors) -> int:
    """The bytes this rank holds of `tensors`: a DTensor's local shard, a plain tensor whole."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's optimizer-state bytes (Adam's moments and step counts, momentum), shards as held."""
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """(weights, optimizer state) whole, in worker.state's layout-free format (the bare model's names; the
    optimizer's state keyed by parameter index, as torch.optim's own state_dict), on the host, on rank 0;
    ({}, {}) on the other ranks. Every rank calls it (it gathers the shards: torch's distributed state-dict
    API, `get_state_dict(full_state_dict=True, cpu_offload=True)`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    weights, by_name = get_state_dict(model, optimizer,
                                      options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not weights:
        return {}, {}
    canonical = state.canonical_key(inner(model))
    index = {name: i for i, name in enumerate(n for group in by_name["param_groups"] for n in group["params"])}
    groups = [{**group, "params": [index[n] for n in group["params"]]} for group in by_name["param_groups"]]
    return ({canonical(k): v for k, v in weights.items()},
            {"state": {index[n]: v for n, v in by_name["state"].items()}, "param_groups": groups})


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, saved: Dict[str, Any]) -> None:
    """A layout-free optimizer state (worker.state's, saved at any layout and world size) into the optimizer of
    this rank's sharded model: each rank keeps its shards of it (`set_optimizer_state_dict(full_state_dict)`),
    under the fresh hyperparameters (state.load_optimizer). The weights go into the bare model before `apply`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def load(saved: Dict[str, Any]) -> None:
        by_name = {"state": {order[int(i)]: v for i, v in saved["state"].items()},
                   "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]}
                                    for g in saved["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))

    state.load_optimizer(optimizer, saved, load)
