"""The training recipe a point measures, as users train: the optimizer, the loss, mixed precision
(autocast, a GradScaler for fp16) and activation checkpointing. Knows torch only.

The same functions serve the workers, the driver's checks and the fake-tensor estimates, so what is
estimated, counted and measured is one recipe.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, List, Optional, Sequence

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


def build_optimizer(cfg: OptimConfig, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """optim=sgd | adamw, or a `_target_` factory called with the parameters (Hydra's `_partial_`
    style: `factory(params, lr=..., **kwargs)`); `lr` is optim.lr after the LR-scaling rule."""
    if cfg._target_:
        factory: Callable[..., Any] = get_method(cfg._target_)
        optimizer = factory(params, lr=lr, **dict(cfg.kwargs))
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optim._target_={cfg._target_!r} returned {type(optimizer).__name__}, not a "
                            "torch.optim.Optimizer")
        return optimizer
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                           nesterov=cfg.nesterov)


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
