"""What one micro-batch's loss is, in the order sweeper looks: your step (train.step_fn), the model's own loss
for a batch mapping that holds `labels` (Hugging Face's `model(**batch).loss`), else the built-in
`loss(model(inputs), targets)`; and whether it counts items.

A loss either is a mean over the micro-batch's samples (accumulation divides it by the micro-steps, data
parallelism averages the ranks: every micro-batch holds as many samples) or counts items, e.g. the tokens that
are not padding, which micro-batches hold in different numbers: then it is a SUM over its items, and the step
divides the whole global batch's gradient by the items of every micro-batch on every rank (as Hugging Face's
`num_items_in_batch` does), so that every layout of one global batch trains the same model. Your step says its
loss counts items by returning them: `(loss_sum, {"items": n})`. The model's own loss counts them when its labels
are per token (integer labels of 2 or more dimensions): the items are the labels that are not -100 (its
`ignore_index`; for a causal LM, whose loss shifts them, those after the first position, as Hugging Face's Trainer
counts), and its mean over them times their count is the sum.

Knows torch only (and transformers, read only when the model is one of its).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from sweeper.workloads.batches import describe

IGNORE_INDEX = -100  # the label Hugging Face's losses skip (padding, prompts)
ITEMS = "items"  # what a step of your own returns the items its loss sums over as


@dataclass
class MicroLoss:
    """One micro-batch's loss: a mean over its samples (items None), or a sum over `items` of them; and the
    figures your step returned beside it (each a number or a 0-d tensor)."""

    loss: torch.Tensor
    items: Optional[torch.Tensor] = None
    metrics: Dict[str, torch.Tensor] = field(default_factory=dict)


LossOf = Callable[[nn.Module, Any], MicroLoss]


def build(step_fn: Optional[str], loss_fn: Callable, model: nn.Module) -> LossOf:
    """The loss of a micro-batch for this point: `step_fn`'s (an import path), else the model's own or the
    built-in `loss_fn(logits, targets)`, chosen by each batch. `model`: the bare model (whether its loss shifts
    its labels)."""
    if step_fn:
        from hydra.utils import get_method

        return _yours(get_method(step_fn), step_fn)
    shifts = shifts_labels(model)
    return lambda wrapped, batch: _built_in(wrapped, batch, loss_fn, shifts)


def _yours(function: Callable, path: str) -> LossOf:
    def loss_of(model: nn.Module, batch: Any) -> MicroLoss:
        out = function(model, batch)
        loss, figures = (out[0], dict(out[1] or {})) if isinstance(out, tuple) and len(out) == 2 else (out, {})
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TypeError(f"train.step_fn={path!r} returned {describe(loss)} as its loss: return a 0-d tensor "
                            "(loss), or (loss, {name: value})")
        items = figures.pop(ITEMS, None)
        return MicroLoss(loss, _as_tensor(items, loss.device) if items is not None else None,
                         {name: _as_tensor(value, loss.device) for name, value in figures.items()})
    return loss_of


def _built_in(model: nn.Module, batch: Any, loss_fn: Callable, shifts: bool) -> MicroLoss:
    if isinstance(batch, Mapping) and "labels" in batch:
        return _own_loss(model, batch, shifts)
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise TypeError(f"a batch is {describe(batch)}: the built-in step takes (inputs, targets), the model's own "
                        "loss a mapping with `labels`; for another batch write your step (train.step_fn)")
    inputs, targets = batch
    out = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    return MicroLoss(loss_fn(logits_of(out), targets))


def _own_loss(model: nn.Module, batch: Mapping, shifts: bool) -> MicroLoss:
    """`model(**batch).loss`: a mean over the micro-batch's samples for per-sample labels; over the labels that
    are not IGNORE_INDEX for per-token ones, returned as its sum over them."""
    out = model(**batch)
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"the batch holds `labels` but the model ({type(out).__name__}) returned no loss: return "
                        "one for labels (a Hugging Face model does), or write your step (train.step_fn)")
    items = token_items(batch, shifts)
    if items is None:
        return MicroLoss(loss)
    # A micro-batch of padding alone has no items and a mean of nothing (NaN): its sum is 0, and so its gradient.
    return MicroLoss(torch.where(items > 0, loss, torch.zeros_like(loss)) * items, items)


def token_items(batch: Mapping, shifts: bool) -> Optional[torch.Tensor]:
    """The labels a per-token loss is over (not IGNORE_INDEX; a causal LM's after the first position, or a
    collator's `shift_labels`), or None for per-sample labels (1-d, or float targets)."""
    labels = batch.get("shift_labels") if batch.get("shift_labels") is not None else batch["labels"]
    if not isinstance(labels, torch.Tensor) or labels.dim() < 2 or labels.is_floating_point():
        return None
    if shifts and batch.get("shift_labels") is None:
        labels = labels[..., 1:]
    return labels.ne(IGNORE_INDEX).sum()


def shifts_labels(model: nn.Module) -> bool:
    """Whether the model's own loss shifts its labels by one: a transformers model whose loss function (its
    `loss_function`, resolved as that property resolves it: by `loss_type`, ForCausalLMLoss by default) is the
    causal LM's, not an encoder-decoder."""
    if not hasattr(model, "loss_type"):  # not a transformers model
        return False
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:
        return False
    function = getattr(model, "_loss_function", None) or LOSS_MAPPING.get(model.loss_type, ForCausalLMLoss)
    decoder_only = not getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    return function is ForCausalLMLoss and decoder_only


def scored(model: nn.Module, batch: Any, shifts: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) of a batch to evaluate, as the built-in step and the model's own loss see it: a mapping
    holding `labels` gives model(**batch)'s logits against its labels (a causal LM's, whose loss shifts them, as
    logits[..., :-1, :] against labels[..., 1:]); an (inputs, targets) pair the model's logits and the targets.
    Targets equal to IGNORE_INDEX are no prediction. (A step of your own has no logits to give: its evaluation
    is its own.)"""
    if isinstance(batch, Mapping) and "labels" in batch:
        logits, labels = logits_of(model(**batch)), batch["labels"]
        if shifts:
            return logits[..., :-1, :], labels[..., 1:]
        return logits, labels
    inputs, targets = batch
    return logits_of(model(**inputs) if isinstance(inputs, Mapping) else model(inputs)), targets


def logits_of(out: Any) -> Any:
    """A model's logits: its output, or the `logits` of a Hugging Face ModelOutput (or a dict holding them)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and "logits" in out:
        return out["logits"]
    return getattr(out, "logits", out)


def _as_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A returned figure on the loss's device, detached (a float stays on the host until added in: no sync)."""
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)
