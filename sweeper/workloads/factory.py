"""`model._target_` and `data._target_`: the user's own factories, Hydra `_target_` style. A model factory
returns an nn.Module (called with model.kwargs, plus num_classes if it takes it); a data factory returns
(train_dataset, val_dataset or None) whose samples are (input, label) pairs or mappings (e.g. input_ids and
labels), or anything data.collate_fn batches. Each is checked by calling it once before anything runs, and two
train samples batched as the training loader batches them."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, List

import torch
from hydra.utils import get_method
from torch import nn

from sweeper.config import DataConfig, ModelConfig
from sweeper.errors import first_line
from sweeper.workloads import batches
from sweeper.workloads.splits import Splits

FACTORY_RETURNS = "a 2-tuple (train_dataset, val_dataset or None) of datasets with len()"


def build_model(cfg: ModelConfig, num_classes: int) -> nn.Module:
    model = _call_factory(cfg, num_classes)
    if not isinstance(model, nn.Module):
        raise TypeError(_not_a_module(cfg, model))
    return model


def load_data(cfg: DataConfig) -> Splits:
    train, val = get_method(cfg._target_)(**cfg.kwargs)
    return Splits(train, val, cfg.num_classes)


def check_model(cfg: ModelConfig, num_classes: int) -> List[str]:
    """Problems with what the model factory returns, called once on the meta device (nothing allocated)."""
    try:
        try:
            with torch.device("meta"):
                made = _call_factory(cfg, num_classes)
        except Exception:  # noqa: BLE001 - e.g. a factory that loads weights cannot run on meta; try for real
            made = _call_factory(cfg, num_classes)
    except Exception as exc:  # noqa: BLE001 - whatever the user's factory raises is told in one line
        return [
            f"model._target_={cfg._target_!r} raised {type(exc).__name__} ({first_line(exc)}) when called with "
            f"model.kwargs={dict(cfg.kwargs)}: fix the factory or its kwargs"
        ]
    return [] if isinstance(made, nn.Module) else [_not_a_module(cfg, made)]


def _call_factory(cfg: ModelConfig, num_classes: int) -> Any:
    factory = get_method(cfg._target_)
    kwargs = dict(cfg.kwargs)
    if "num_classes" not in kwargs and "num_classes" in inspect.signature(factory).parameters:
        kwargs["num_classes"] = num_classes
    return factory(**kwargs)


def _not_a_module(cfg: ModelConfig, made: Any) -> str:
    return (
        f"model._target_={cfg._target_!r} returned {type(made).__name__}, not an nn.Module: the factory must "
        "return the model itself (a torch.nn.Module)"
    )



def check_data(cfg: DataConfig) -> List[str]:
    key = f"data._target_={cfg._target_!r}"
    try:
        made = get_method(cfg._target_)(**cfg.kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever the user's factory raises is told in one line
        return [
            f"{key} raised {type(exc).__name__} ({first_line(exc)}) when called with data.kwargs="
            f"{dict(cfg.kwargs)}: fix the factory or its kwargs"
        ]
    if not _pair(made):
        return [f"{key} returned {_kind(made)}, not {FACTORY_RETURNS}: return (train, val), or (train, None)"]
    train, val = made
    for name, dataset in (("train", train), ("val", val)):
        if not _map_style(dataset) and not (name == "val" and dataset is None):
            return [
                f"{key} returned a {name} dataset of type {type(dataset).__name__}, without len() and indexing: "
                "return map-style datasets (a torch.utils.data.Dataset with __len__, e.g. TensorDataset)"
            ]
    if len(train) == 0:
        return [f"{key} returned an empty train dataset: it needs samples to train on"]
    sample = train[0]
    if not cfg.collate_fn and not (_pair(sample) or isinstance(sample, Mapping)):
        return [
            f"{key}: a train sample is {_kind(sample)}, not an (input, label) pair or a mapping (e.g. input_ids and "
            "labels): make the dataset's __getitem__ return one, or batch your samples with data.collate_fn"
        ]
    return batch_problems(cfg, train)


def batch_problems(cfg: DataConfig, train: Any) -> List[str]:
    """Whether two train samples make a batch as the training loader makes it (data.collate_fn, else torch's
    default), which moves to a device whole and whose samples can be counted (data.samples_fn where not)."""
    count = min(2, len(train))
    try:
        batch = next(iter(batches.loader(train, count, cfg.collate_fn)))
    except Exception as exc:  # noqa: BLE001 - whatever the collate raises is told in one line
        if cfg.collate_fn:
            return [f"data.collate_fn={cfg.collate_fn!r} raised {type(exc).__name__} ({first_line(exc)}) batching "
                    f"{count} train samples of data._target_={cfg._target_!r}: fix it"]
        return [f"data._target_={cfg._target_!r}: torch's default collate cannot batch {count} train samples "
                f"({type(exc).__name__}: {first_line(exc)}): return tensors of one shape, or batch them with "
                "data.collate_fn (e.g. dynamic padding)"]
    batches.to_device(batch, torch.device("cpu"))
    try:
        found = batches.sample_count(batch, batches.samples_fn_of(cfg.samples_fn))
    except Exception as exc:  # noqa: BLE001 - the user's samples_fn
        return [f"data.samples_fn={cfg.samples_fn!r} raised {type(exc).__name__} ({first_line(exc)}) on a batch: "
                "fix it"]
    if found is None:
        return [f"a batch of data._target_={cfg._target_!r} is {batches.describe(batch)}, whose samples cannot be "
                "read from it (no labels, input_ids or tensor with a leading dimension): set data.samples_fn"]
    if found != count:
        return [f"a batch of {count} train samples holds {found} by its leading dimension: data.collate_fn must "
                "batch each sample it is given, or set data.samples_fn to count them"]
    return []


def _map_style(dataset: object) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def _pair(value: object) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2


def _kind(value: object) -> str:
    """e.g. "a tuple of 3", "an int"."""
    name = type(value).__name__
    size = f" of {len(value)}" if isinstance(value, (tuple, list)) else ""
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}{size}"
