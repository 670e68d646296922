"""The training recipe a point measures, as users train: the optimizer, the loss, mixed precision
(autocast, a GradScaler for fp16) and activation checkpointing. Knows torch only.

The same functions serve the workers, the driver's checks and the fake-tensor estimates, so what is
estimated, counted and measured is one recipe.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from hydra.utils import get_method
from torch import nn
from torch.utils.checkpoint import checkpoint

from sweeper.config import LossConfig, OptimConfig
from sweeper.workloads.samples import Samples, cross_entropy

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
CHECKPOINTING = ("none", "blocks")
# What `blocks` wraps when the model has these: torchvision's residual blocks, the transformer
# encoder layers, the MLP's Linear+ReLU layers (sweeper.workloads.mlp.MLPBlock) and the GPT's blocks,
# by class name so that the types need not be imported. model.checkpoint_modules adds a custom model's own.
BLOCK_TYPES = ("BasicBlock", "Bottleneck", "InvertedResidual", "EncoderBlock", "TransformerEncoderLayer",
               "MLPBlock", "GPTBlock")


# The keywords a custom optimizer factory may declare to be given the model's named parameters instead.
NAMED_KEYWORDS = ("named_params", "named_parameters")


def build_optimizer(cfg: OptimConfig, model: Union[nn.Module, Iterable[nn.Parameter]], lr: float
                    ) -> torch.optim.Optimizer:
    """optim=sgd | adamw, or a `_target_` factory (Hydra's `_partial_` style: `factory(params, lr=..., **kwargs)`,
    or `factory(named_parameters=[(name, parameter), ...], lr=..., **kwargs)` when it declares one of
    NAMED_KEYWORDS); `lr` is optim.lr after the LR-scaling rule. Given the model, the built-in optimizers spare
    optim.no_decay's parameters from weight decay (a second parameter group); given bare parameters, one group."""
    if cfg._target_:
        return _custom_optimizer(cfg, model, lr)
    params: Any = model.parameters() if isinstance(model, nn.Module) else model
    if isinstance(model, nn.Module) and cfg.weight_decay and cfg.no_decay:
        params = parameter_groups(model, cfg.no_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                           nesterov=cfg.nesterov)


def _custom_optimizer(cfg: OptimConfig, model: Union[nn.Module, Iterable[nn.Parameter]], lr: float
                      ) -> torch.optim.Optimizer:
    factory: Callable[..., Any] = get_method(cfg._target_)
    named = _named_keyword(factory)
    if named and isinstance(model, nn.Module):
        optimizer = factory(**{named: list(named_parameters(model))}, lr=lr, **dict(cfg.kwargs))
    else:
        optimizer = factory(model.parameters() if isinstance(model, nn.Module) else model, lr=lr, **dict(cfg.kwargs))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optim._target_={cfg._target_!r} returned {type(optimizer).__name__}, not a "
                        "torch.optim.Optimizer")
    return optimizer


def _named_keyword(factory: Callable) -> Optional[str]:
    try:
        declared = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: takes params
        return None
    return next((name for name in NAMED_KEYWORDS if name in declared), None)


def parameter_groups(model: nn.Module, no_decay: Sequence[str]) -> List[Dict[str, Any]]:
    """The model's parameters in two groups: those weight decay falls on, then those `no_decay` spares
    (weight_decay 0): a parameter whose dotted name (as the bare model names it) or whose module's class name
    holds an entry, case-insensitive. An empty group is left out."""
    wanted = [entry.lower() for entry in no_decay]
    owners = {id(p): type(m).__name__.lower() for m in model.modules() for p in m.parameters(recurse=False)}
    decayed: List[nn.Parameter] = []
    spared: List[nn.Parameter] = []
    for name, p in named_parameters(model):
        hit = any(entry in name.lower() or entry in owners.get(id(p), "") for entry in wanted)
        (spared if hit else decayed).append(p)
    groups: List[Dict[str, Any]] = [{"params": decayed}] if decayed else []
    return groups + ([{"params": spared, "weight_decay": 0.0}] if spared else [])


def named_parameters(model: nn.Module) -> Iterator[Tuple[str, nn.Parameter]]:
    """The model's parameters by the bare model's names: without DDP's `module.` prefix or activation
    checkpointing's `block.` segments (a sharded model keeps its names)."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    canonical = canonical_key(inner)
    for name, p in inner.named_parameters():
        yield canonical(name), p


def canonical_key(model: nn.Module) -> Callable[[str], str]:
    """A function from a key of `model`'s state dict or parameter names (the bare model's, or a sharded one's:
    FSDP2 keeps the names) to the bare model's name for it: each activation checkpointing wrapper's `block.`
    segment removed."""
    wrapped = sorted((name for name, m in model.named_modules() if isinstance(m, Checkpointed)), key=len, reverse=True)

    def canonical(key: str) -> str:
        for name in wrapped:
            prefix = f"{name}.block." if name else "block."
            if key.startswith(prefix):
                key = (f"{name}." if name else "") + key[len(prefix):]
        return key
    return canonical


def build_loss(cfg: LossConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy (with loss.label_smoothing; over every token of a language model's batch), or a
    `_target_` factory returning loss(logits, targets)."""
    if cfg._target_:
        factory = get_method(cfg._target_)
        made = factory(**dict(cfg.kwargs))
        if not callable(made):
            raise TypeError(f"loss._target_={cfg._target_!r} returned {type(made).__name__}, not a callable "
                            "loss(logits, targets)")
        return made
    smoothing = cfg.label_smoothing
    return lambda logits, targets: cross_entropy(logits, targets, label_smoothing=smoothing)


def autocast(device: torch.device, precision: str):
    """Autocast around forward and loss (parameters, gradients and optimizer state stay fp32);
    fp32 runs as it is."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# CPU features (Linux's /proc/cpuinfo `flags`, an Arm's `Features`) under which autocast's matmuls and
# convolutions run in the precision itself; without one, oneDNN emulates it through fp32 (bf16 autocast ran a
# 3x3 convolution 48x slower than fp32 on such a CPU, issue 54).
NATIVE_CPU_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16", "fphp")}
NATIVE_CPU_NAMES = {"bf16": "AVX512-BF16 or AMX", "fp16": "AVX512-FP16 or AMX-FP16"}


def emulated_precision(precision: str, device: torch.device, flags: Optional[Sequence[str]] = None) -> Optional[str]:
    """Why `precision` is only emulated on `device`, in words (its throughput is then not the recipe's), or None
    (fp32, native, or not known: a CPU whose features cannot be read). `flags`: the CPU's features (read from
    /proc/cpuinfo when None)."""
    if precision not in NATIVE_CPU_FLAGS:
        return None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if precision == "bf16" and major < 8:  # bf16 arithmetic came with Ampere
            return (f"bf16 on {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}, below "
                    "Ampere's 8.0) is emulated: its throughput is not bf16's")
        return None
    if device.type != "cpu":
        return None
    found = set(flags) if flags is not None else cpu_flags()
    if found is None or found & set(NATIVE_CPU_FLAGS[precision]):
        return None
    return (f"{precision} autocast on a CPU without {NATIVE_CPU_NAMES[precision]} is emulated through fp32 (up to "
            f"48x slower): its throughput is not {precision}'s")


def cpu_flags() -> Optional[set]:
    """This machine's CPU features, from /proc/cpuinfo (None where it cannot be read: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.split(":")[0].strip() in ("flags", "Features")]
    except OSError:
        return None
    return {flag for line in lines for flag in line.split(":", 1)[1].split()} if lines else None


def grad_scaler(device: torch.device, precision: str) -> Optional[torch.amp.GradScaler]:
    """fp16's gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def apply_checkpointing(model: nn.Module, mode: str, extra_types: Sequence[str] = ()) -> int:
    """`blocks`: every block of the model (BLOCK_TYPES and `extra_types`, by class name) recomputes
    its forward in backward instead of keeping its activations (non-reentrant
    torch.utils.checkpoint: the reentrant kind breaks DDP). Blocks inside a wrapped block are left as
    they are. Returns how many were wrapped (0 for `none`)."""
    if mode == "none":
        return 0
    found = _outermost_blocks(model, extra_types)
    for parent, child_name, child in found:
        setattr(parent, child_name, Checkpointed(child))
    return len(found)


def blocks(model: nn.Module, extra_types: Sequence[str] = ()) -> List[nn.Module]:
    """The model's outermost blocks, as `apply_checkpointing` finds them (BLOCK_TYPES, `extra_types`, the
    model's own `checkpoint_block_types`), in forward order; a block already checkpointed is given as its
    Checkpointed wrapper. The units sharded data parallelism shards one at a time (worker.sharding)."""
    wrapped = [m for m in model.modules() if isinstance(m, Checkpointed)]
    outer = [m for m in wrapped if not any(m is not w and _contains(w, m) for w in wrapped)]
    found = [child for _, _, child in _outermost_blocks(model, extra_types)]
    return [m for m in model.modules() if any(m is b for b in outer + found)]


def _outermost_blocks(model: nn.Module, extra_types: Sequence[str]) -> List[tuple]:
    """(parent, attribute name, block) of every block no other block or Checkpointed wrapper holds."""
    names = _block_names(model, extra_types)
    found: List[tuple] = []
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__ in names and not isinstance(parent, Checkpointed) and not _inside(model, child) \
                    and not any(_contains(block, child) for _, _, block in found):
                found.append((parent, child_name, child))
    return found


def _contains(outer: nn.Module, module: nn.Module) -> bool:
    return any(sub is module for sub in outer.modules())


def _block_names(model: nn.Module, extra_types: Sequence[str]) -> set:
    """BLOCK_TYPES, `extra_types` (model.checkpoint_modules) and the blocks a model declares itself
    (`checkpoint_block_types`: a transformers model's decoder layers, sweeper.workloads.hf)."""
    return set(BLOCK_TYPES) | set(extra_types) | set(getattr(model, "checkpoint_block_types", ()))


def _inside(model: nn.Module, module: nn.Module) -> bool:
    """Whether `module` already sits inside a Checkpointed block of `model`."""
    return any(isinstance(m, Checkpointed) and _contains(m, module) for m in model.modules())


class Checkpointed(nn.Module):
    """A block whose forward is recomputed during backward (its inner activations are not kept)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing to recompute
            return self.block(*args, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def wrappable(model: nn.Module, extra_types: Sequence[str] = ()) -> List[str]:
    """The class names of the blocks `blocks` would wrap in this model."""
    names = _block_names(model, extra_types)
    return sorted({type(m).__name__ for m in model.modules() if type(m).__name__ in names})


def try_step(build_model: Callable[[], nn.Module], samples: Samples, precision: str) -> Optional[str]:
    """One training step of a batch of 2 on the CPU in `precision` (autocast, loss scaling): None if
    it runs, else the error's first line. Whether the CPU has the ops for it (fp16 on CPU often
    lacks some) is found out here, before any worker starts."""
    with torch.random.fork_rng(devices=[]):
        try:
            model = build_model()
            cpu = torch.device("cpu")
            scaler = grad_scaler(cpu, precision)
            with autocast(cpu, precision):
                inputs, targets = samples.batch(2)
                loss = cross_entropy(model(inputs), targets)
            (scaler.scale(loss) if scaler else loss).backward()
        except Exception as exc:  # noqa: BLE001 - whatever the device lacks, in one line
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None
