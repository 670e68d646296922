"""Sharded data parallelism for a point's model: `ddp` (torch's DistributedDataParallel, every rank holds
everything), `zero1` (DDP, its optimizer a ZeroRedundancyOptimizer: each rank steps and keeps the state of its
share of the parameters, then broadcasts them), `zero2`, `zero3` and `hsdp` (FSDP2's `fully_shard` per block, then
at the root, as torchtitan's `parallelize` does; hsdp on a 2-D mesh: shard within a node, replicate across nodes).
Knows torch only; the blocks are the ones activation checkpointing finds (recipe.blocks).

What each keeps per rank, over a shard group of N (FSDP2 in torch 2.14, read from its source):
- zero2 (`reshard_after_forward=False`): weights, gradients and optimizer state sharded 1/N between steps;
  a block's gathered weights stay from its forward until its backward is done (weights gathered once per
  step), so the whole model's weights are resident at the top of backward.
- zero3 (`reshard_after_forward=True` per block): a block's gathered weights are freed after its forward
  and gathered again for its backward: at most the root's and a block or two's are whole at a time.
- hsdp: zero3 within each node's ranks (a row of the mesh: worker.spec.NodeMesh), its gradients reduce-scattered
  within the node and all-reduced across nodes: a parameter is a DTensor placed (Replicate(), Shard(0)).
The root keeps `reshard_after_forward=False` in all three: its weights (embeddings, a tied head) are needed at
the end of forward and at once at the start of backward, so freeing them between saves nothing at the peak.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from sweeper import recipe
from sweeper.plan import PARALLELISMS
from sweeper.worker import state

SHARDED = ("zero2", "zero3", "hsdp")  # FSDP2's: weights, gradients and optimizer state sharded
REPLICATED = ("ddp", "zero1")  # DDP's model: every rank holds every weight and gradient
RESHARD_AFTER_FORWARD = {"zero2": False, "zero3": True, "hsdp": True}
# Whether micro-steps before the last keep the gathered weights after their backward: ZeRO-2 holds them all
# at the top of backward anyway, so keeping them costs no peak and saves a gather per unit per micro-step;
# ZeRO-3 (and hsdp, ZeRO-3 within a node) would hold the whole model gathered, which it exists not to do.
KEEPS_GATHERED = {"ddp": False, "zero1": False, "zero2": True, "zero3": False, "hsdp": False}
# How micro-steps before the last of an optimizer step skip the gradient reduce under `final` (recorded per point).
SYNC_MODES = {"ddp": "no_sync", "zero1": "no_sync", "zero2": "set_requires_gradient_sync",
              "zero3": "set_requires_gradient_sync", "hsdp": "set_requires_gradient_sync"}
MESH_DIMS = ("replicate", "shard")  # hsdp's mesh: across nodes, within a node


@dataclass
class Sharding:
    """What `apply` did: the parallelism, the units sharded one at a time (the blocks' module names, then
    the root, ""), how accumulation skips the reduce, and the mixed-precision dtypes (None: fp32)."""

    parallelism: str
    units: List[str] = field(default_factory=list)
    sync_mode: str = "none"  # no_sync | set_requires_gradient_sync | none (one worker under DDP)
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None
    # hsdp: the mesh as built, its shard groups (one per node) and a parameter's placements (mesh_text)
    mesh: str = ""


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
          extra_types: Sequence[str] = (), device: Optional[torch.device] = None, node_mesh: Any = None):
    """(the model to train, a Sharding saying what was done). `ddp` and `zero1`: wrapped in DistributedDataParallel
    when the group has more than one rank (the model as it is otherwise; zero1's optimizer is `optimizer_for`'s).
    `zero2`/`zero3`/`hsdp`: `fully_shard` on every block (recipe.blocks: after activation checkpointing, its
    Checkpointed wrappers), then on the root, over `group` (the default group when None; at one rank too, so a
    point's layout is the same code at every size); hsdp over `node_mesh` (worker.spec.NodeMesh: the point's
    ranks by node), or without one over a mesh (1, N) of `group`'s ranks, all on one node.
    Raises ValueError with the problems() line when it refuses."""
    found = problems(parallelism, precision, model, extra_types)
    if found:
        raise ValueError("; ".join(found))
    device = device or next(model.parameters()).device
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    if parallelism in REPLICATED:
        if size == 1:
            return model, Sharding(parallelism, sync_mode="none")
        ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
        return wrapped, Sharding(parallelism, sync_mode=SYNC_MODES[parallelism])
    if not dist.is_initialized():
        raise ValueError(f"parallelism {parallelism} needs a process group (torch.distributed is not initialized)")
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(parallelism, group, device, node_mesh)
    policy = mixed_precision(precision)
    names = {id(m): name for name, m in model.named_modules()}
    units = []
    for block in recipe.blocks(model, extra_types):
        fully_shard(block, mesh=mesh, reshard_after_forward=RESHARD_AFTER_FORWARD[parallelism], mp_policy=policy)
        units.append(names[id(block)])
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    units.append("")
    return model, Sharding(parallelism, units, SYNC_MODES[parallelism], policy.param_dtype, policy.reduce_dtype,
                           mesh_text(model) if parallelism == "hsdp" else "")


def _mesh(parallelism: str, group: Optional[dist.ProcessGroup], device: torch.device, node_mesh: Any):
    """FSDP2's DeviceMesh: zero2/zero3 1-D over `group`; hsdp 2-D (MESH_DIMS), a row per node."""
    from torch.distributed.device_mesh import DeviceMesh

    if parallelism != "hsdp":
        return DeviceMesh.from_group(group or dist.group.WORLD, device.type)
    if node_mesh is not None:
        # The groups were made beforehand by every rank of the worker group (collectives.node_meshes): a point on
        # fewer ranks than its group trains while the others wait, so its ranks alone could not make them.
        return DeviceMesh.from_group([node_mesh.replicate, node_mesh.shard], device.type, mesh=node_mesh.rows,
                                     mesh_dim_names=MESH_DIMS)
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    return DeviceMesh(device.type, torch.tensor([ranks]), mesh_dim_names=MESH_DIMS)


def mesh_text(model: nn.Module) -> str:
    """A sharded model's mesh in words, as recorded (tag sweeper.mesh): its shape by dimension, its rows (the
    shard groups, global ranks) and a parameter's placements, e.g.
    `replicate 2 x shard 2; shard groups [0, 1] [2, 3]; placements (Replicate(), Shard(dim=0))`."""
    weight = next(model.parameters())
    mesh = weight.device_mesh
    rows = mesh.mesh.reshape(-1, mesh.mesh.shape[-1]).tolist()
    shape = " x ".join(f"{name} {n}" for name, n in zip(mesh.mesh_dim_names or (), mesh.mesh.shape))
    return (f"{shape}; shard groups {' '.join(str(r) for r in rows)}; "
            f"placements ({', '.join(repr(p) for p in weight.placements)})")


def optimizer_for(parallelism: str, optimizer: torch.optim.Optimizer, group: Optional[dist.ProcessGroup] = None
                  ) -> torch.optim.Optimizer:
    """The optimizer a point steps with: `optimizer` itself, or under zero1 a ZeroRedundancyOptimizer over `group`
    (the default group when None) that rebuilds it per rank: its class, its hyperparameters (those its constructor
    takes) and its parameter groups, each rank stepping and holding the state of its share of the parameters
    (whole tensors, the largest first to the least-loaded rank), then broadcasting them. `optimizer` holds no state
    yet (torch's optimizers make it at their first step): nothing is allocated twice."""
    if parallelism != "zero1":
        return optimizer
    from torch.distributed.optim import ZeroRedundancyOptimizer

    kind = type(optimizer)
    taken = inspect.signature(kind.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values())
    # AdamW's defaults hold `decoupled_weight_decay`, which its constructor does not take (it sets it).
    defaults = {k: v for k, v in optimizer.defaults.items() if takes_any or k in taken}
    groups = [dict(g) for g in optimizer.param_groups]
    try:
        return ZeroRedundancyOptimizer(groups, optimizer_class=kind, process_group=group, **defaults)
    except TypeError as exc:
        raise ValueError(f"sweep.parallelism=zero1: the optimizer {kind.__name__} cannot be rebuilt per rank from "
                         f"its parameter groups and hyperparameters ({exc}); use parallelism ddp") from exc


def traffic(model: nn.Module, point: Any, ctx: Any) -> Dict[str, int]:
    """A zero1 or hsdp point's predicted bytes a rank sends per optimizer step within its node and across nodes
    (measure.node_traffic, Cost's communication_*_bytes_per_step), for where its ranks run: hsdp's mesh rows, or
    the nodes zero1's ranks span (gathered: a collective, every rank of `ctx` calls it). FSDP2's units are its
    fully_shard modules, each parameter at its whole shape. {} for the other layouts."""
    if point.parallelism not in ("zero1", "hsdp"):
        return {}
    from torch.distributed.fsdp import FSDPModule

    from sweeper.measure import node_traffic, sharded_memory
    from sweeper.worker.collectives import gather_objects

    nodes = len(ctx.mesh.rows) if ctx.mesh is not None else len(set(gather_objects(ctx.node, ctx)))
    bare = inner(model)
    units = sharded_memory.units_of(bare, [m for m in bare.modules() if isinstance(m, FSDPModule) and m is not bare])
    sent = node_traffic.per_step(units, point.parallelism, point.num_workers, point.accumulation_steps, nodes,
                                 gather_bytes_per_value=2 if point.precision == "bf16" else None)
    return dict(communication_within_node_bytes_per_step=sent.within_node_bytes,
                communication_across_nodes_bytes_per_step=sent.across_nodes_bytes)


def is_zero(optimizer: torch.optim.Optimizer) -> bool:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state: zero1's per-rank one, or `optimizer` itself."""
    return optimizer.optim if is_zero(optimizer) else optimizer


def holds_shards(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether no rank holds the whole training state: its save gathers it (full_state), its load splits it."""
    return is_sharded(model) or is_zero(optimizer)


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
    """FSDP2 and ZeroRedundancyOptimizer need a process group even for one worker, and a worker group of one worker
    runs in its Ray Tune trial's process with none: for a point of a sharded layout at one worker there, a gloo
    group of this process alone (an in-memory store), for the point's length. Nothing otherwise (ddp, or a group
    already up)."""
    if parallelism == "ddp" or world_size > 1 or dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def grad_norm(model: nn.Module, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """The whole gradient's 2-norm of a sharded model (after the reduce-scatter: each rank holds disjoint shards,
    FSDP2's padding zeros): each rank's shards' squares summed, then summed across the shard group (the mesh's
    last dimension: `group` under zero2/zero3, a node's ranks under hsdp, whose nodes hold the same shards), as
    torch.nn.utils.get_total_norm does for DTensors. A collective: every rank calls it."""
    from sweeper.worker.gns import squared_norm

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    meshes = [g.device_mesh for g in grads if hasattr(g, "device_mesh")]
    if meshes:
        group = meshes[0].get_group(meshes[0].ndim - 1)
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
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
    held = local_optimizer(optimizer).state.values()
    return local_bytes(v for state in held for v in state.values() if isinstance(v, torch.Tensor))


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """(weights, optimizer state) whole, in worker.state's layout-free format (the bare model's names; the
    optimizer's state keyed by parameter index, as torch.optim's own state_dict), on the host, on rank 0;
    ({}, {}) on the other ranks. Every rank calls it (it gathers the shards: torch's distributed state-dict
    API, `get_state_dict(full_state_dict=True, cpu_offload=True)`; zero1: every rank's share of the optimizer
    state sent to rank 0, `consolidate_state_dict`, where ZeroRedundancyOptimizer's state_dict is torch.optim's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if is_zero(optimizer):
        optimizer.consolidate_state_dict(to=0)
        if dist.get_rank(optimizer.process_group) != 0:
            return {}, {}
        return state.canonical_state(model), state.to_cpu(optimizer.state_dict())

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
    under the fresh hyperparameters (state.load_optimizer). The weights go into the bare model before `apply`.
    zero1: ZeroRedundancyOptimizer's own load_state_dict keeps this rank's share."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if is_zero(optimizer):
        def load_share(saved: Dict[str, Any]) -> None:
            optimizer.load_state_dict({**saved, "state": dict(saved["state"])})  # it blanks the others' entries
            # It also keeps a copy of this rank's share in the wrapper's own state, which nothing reads (the
            # per-rank optimizer steps on its own): dropped, so a continued point holds the share once.
            optimizer.state.clear()

        state.load_optimizer(optimizer, saved, load_share)
        return

    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def load(saved: Dict[str, Any]) -> None:
        by_name = {"state": {order[int(i)]: v for i, v in saved["state"].items()},
                   "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]}
                                    for g in saved["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))

    state.load_optimizer(optimizer, saved, load)
