"""Datasets by name, the one registry: the built-in families (FAMILIES: images.py for digits, cifar10 and
synthetic; text.py for text and tokens), or the user's own factory (factory.py). Each family answers
`check(cfg, context)`, `load(cfg, input_shape)` and `source(cfg)`; adding one: docs/adding-a-workload.md.
`built(cfg, input_shape)`: the driver's copy, built at most once (the check's call of a factory included)."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict
from typing import List, Optional, Sequence

from sweeper.config import DataConfig, check_factory
from sweeper.workloads import factory, images, text
from sweeper.workloads.splits import Splits

# data.name -> the module that checks, loads and names it.
FAMILIES = {name: family for family in (images, text) for name in family.NAMES}
BUILTIN = tuple(FAMILIES)

__all__ = ["FAMILIES", "BUILTIN", "Splits", "check", "load", "source", "built", "key"]

# The driver's built data, by config and shape: the model's context and each of sweep.context_lengths'.
BUILT_KEPT = 8
_BUILT: "OrderedDict[str, Splits]" = OrderedDict()


def check(cfg: DataConfig, context: int = 0) -> List[str]:
    """Problems that would stop `load(cfg, ...)`: found without loading anything, except that a
    factory of your own is called once to see what it returns. `context`: a language model's
    sequence length, which token data must hold at least one sequence of."""
    if cfg._target_:
        problems = check_factory("data._target_", cfg._target_, factory.FACTORY_RETURNS)
        if problems:
            return problems
        made, problems = factory.call_data(cfg)
        if problems:
            return problems
        try:  # kept: preflight loads it next (built())
            _remember(key(cfg, None), factory.splits_of(made, cfg))
        except ValueError as exc:  # e.g. data.stream_samples beyond what the stream holds
            return [str(exc)]
        return []
    if cfg.name == "custom":
        return [
            "data._target_ is not set: data=custom needs the import path of your factory, "
            "e.g. data._target_=my_pkg.data.build"
        ]
    if cfg.name not in FAMILIES:
        return [
            f"data.name={cfg.name!r} is unknown: use data=digits, data=cifar10, data=synthetic, data=text or "
            "data=tokens, or set data._target_ to your own factory"
        ]
    return FAMILIES[cfg.name].check(cfg, context)


def source(cfg: DataConfig) -> str:
    """Where the data comes from, as MLflow's dataset input names it."""
    return FAMILIES[cfg.name].source(cfg) if cfg.name in FAMILIES else (cfg._target_ or cfg.name)


def load(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    """The training and held-out splits, every sample shaped `input_shape`."""
    if cfg._target_:
        return factory.load_data(cfg)
    if cfg.name not in FAMILIES:
        raise ValueError(f"data.name={cfg.name!r} is unknown")
    return FAMILIES[cfg.name].load(cfg, input_shape)


def built(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    """load(cfg, input_shape), built once per process and kept (the driver's: preflight, the data handed to
    the worker groups); a factory's from the check's call of it when check() ran first."""
    name = key(cfg, input_shape)
    if name not in _BUILT:
        _remember(name, load(cfg, input_shape))
    _BUILT.move_to_end(name)
    return _BUILT[name]


def key(cfg: DataConfig, input_shape: Optional[Sequence[int]]) -> str:
    """The data's name in built()'s store and in the data the driver hands the worker groups."""
    # A factory is called with data.kwargs alone: its data is the same at every shape.
    shape = None if cfg._target_ or input_shape is None else [int(d) for d in input_shape]
    return json.dumps([asdict(cfg), shape], sort_keys=True, default=str)


def _remember(key: str, splits: Splits) -> None:
    _BUILT[key] = splits
    while len(_BUILT) > BUILT_KEPT:
        _BUILT.popitem(last=False)
