"""What a batch is, whatever its nesting (a tensor, an `(inputs, targets)` pair, a dict of `input_ids`,
`attention_mask` and `labels`, a dataclass): moved to a device whole, its samples counted, its size compared,
and the loader that makes it (data.collate_fn) for training and for evaluation alike. Knows torch only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader

# Where a mapping batch keeps its samples' count (Hugging Face's names): its leading dimension.
COUNTED_KEYS = ("labels", "input_ids")


def to_device(batch: Any, device: torch.device, copy: bool = False) -> Any:
    """`batch` with every tensor in it on `device` (non-blocking; `copy`: a fresh copy even where it is there
    already), its containers rebuilt as they were: a mapping as its own type (a transformers BatchEncoding
    too), a tuple, a named tuple, a list, a dataclass. Anything else (a string, a number) stays as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True, copy=copy)
    if isinstance(batch, Mapping):
        moved = {key: to_device(value, device, copy) for key, value in batch.items()}
        return _rebuilt_mapping(batch, moved)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(v, device, copy) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device, copy) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: to_device(getattr(batch, f.name), device, copy) for f in dataclasses.fields(batch)
                   if f.init}
        return dataclasses.replace(batch, **changes)
    return batch


def _rebuilt_mapping(original: Mapping, moved: dict) -> Any:
    try:
        return type(original)(moved)
    except Exception:  # noqa: BLE001 - a mapping type that takes no dict: a plain dict holds the same
        return moved


def tensors(batch: Any) -> Iterator[torch.Tensor]:
    """The batch's tensors, in the order to_device visits them."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensors(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from tensors(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for f in dataclasses.fields(batch):
            yield from tensors(getattr(batch, f.name))


def sample_count(batch: Any, samples_fn: Optional[Callable[[Any], int]] = None) -> Optional[int]:
    """The samples `batch` holds: `samples_fn(batch)` when given, else the leading dimension of a mapping's
    `labels` or `input_ids`, else of its first tensor; None when none has one (a 0-d tensor, no tensor)."""
    if samples_fn is not None:
        return int(samples_fn(batch))
    if isinstance(batch, Mapping):
        for key in COUNTED_KEYS:
            value = batch.get(key)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return int(value.shape[0])
    first = next(tensors(batch), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else None


def element_count(batch: Any) -> int:
    """Elements over the batch's tensors: what ranks batches of one stream by size (padded to different
    lengths, the one with the most elements holds the most activations)."""
    return sum(t.numel() for t in tensors(batch))


def collate_of(path: Optional[str]) -> Optional[Callable[[list], Any]]:
    """data.collate_fn's function (None: torch's default_collate)."""
    return _imported(path)


def samples_fn_of(path: Optional[str]) -> Optional[Callable[[Any], int]]:
    """data.samples_fn's function (None: the count is read from the batch)."""
    return _imported(path)


def _imported(path: Optional[str]) -> Optional[Callable]:
    if not path:
        return None
    from hydra.utils import get_method

    return get_method(path)


def loader(dataset: Any, batch_size: int, collate_fn: Any = None, **options: Any) -> DataLoader:
    """The DataLoader of `dataset` in batches of `batch_size` samples, batched by `collate_fn` (data.collate_fn:
    an import path or the function; None: torch's default), with any other DataLoader `options` (sampler,
    drop_last, num_workers, ...). The training stream, BatchNorm's recalibration and the evaluation all load
    through here, so a collate of your own batches each of them."""
    function = collate_of(collate_fn) if isinstance(collate_fn, str) else collate_fn
    if function is not None:
        options["collate_fn"] = function
    return DataLoader(dataset, batch_size=batch_size, **options)


def describe(value: Any) -> str:
    """e.g. "a tuple of 3", "a dict with keys input_ids, labels", "a Tensor"."""
    name = type(value).__name__
    article = "an" if name[0].lower() in "aeiou" else "a"
    if isinstance(value, Mapping):
        return f"{article} {name} with keys {', '.join(map(str, list(value)[:6]))}"
    size = f" of {len(value)}" if isinstance(value, (tuple, list)) else ""
    return f"{article} {name}{size}"
