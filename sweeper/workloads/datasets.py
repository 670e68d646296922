"""Datasets by name, the one registry: the built-in families (FAMILIES: images.py for digits, cifar10 and
synthetic; text.py for text and tokens), or the user's own factory (factory.py). Each family answers
`check(cfg, context)`, `load(cfg, input_shape)` and `source(cfg)`; adding one: docs/adding-a-workload.md."""

from __future__ import annotations

from typing import List, Sequence

from sweeper.config import DataConfig, check_factory
from sweeper.workloads import factory, images, text
from sweeper.workloads.splits import Splits

# data.name -> the module that checks, loads and names it.
FAMILIES = {name: family for family in (images, text) for name in family.NAMES}
BUILTIN = tuple(FAMILIES)

__all__ = ["FAMILIES", "BUILTIN", "Splits", "check", "load", "source"]


def check(cfg: DataConfig, context: int = 0) -> List[str]:
    """Problems that would stop `load(cfg, ...)`: found without loading anything, except that a
    factory of your own is called once to see what it returns. `context`: a language model's
    sequence length, which token data must hold at least one sequence of."""
    if cfg._target_:
        return check_factory("data._target_", cfg._target_, factory.FACTORY_RETURNS) or factory.check_data(cfg)
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
