"""Models by name, the one registry: the built-in models (BUILT_IN: mlp.py, gpt.py, hf.py), any torchvision
classification model (vision.py), or the user's own factory (factory.py). What every model answers
whatever it is (its samples, its batch-coupled layers) is here too."""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from sweeper.config import ModelConfig, check_factory, is_language_model
from sweeper.workloads import factory, gpt, hf, mlp, vision
from sweeper.workloads.samples import Samples

# model.name -> the module that builds and checks it (`from_config(cfg, num_classes)`,
# `check_config(cfg, num_classes)`);
# any other name is a torchvision model (vision.py). Adding a model: docs/adding-a-workload.md.
BUILT_IN = {"mlp": mlp, "gpt": gpt, "hf": hf}


def check(cfg: ModelConfig, num_classes: int = 10) -> List[str]:
    """Problems that would stop `build(cfg, num_classes)`. A factory of your own is called once, on
    the meta device (nothing allocated), to see that it returns an nn.Module."""
    if cfg._target_:
        return check_factory("model._target_", cfg._target_, "an nn.Module") or factory.check_model(cfg, num_classes)
    if cfg.name == "custom":
        return [
            "model._target_ is not set: model=custom needs the import path of your factory, "
            "e.g. model._target_=my_pkg.models.build"
        ]
    if cfg.name in BUILT_IN:
        return BUILT_IN[cfg.name].check_config(cfg, num_classes)
    if cfg.name in vision.torchvision_names():
        return []
    return [
        f"model.name={cfg.name!r} is unknown: use model=mlp, model=gpt, model=hf, model=resnet18 (or model.name=<any "
        "torchvision classification model>), or set model._target_ to your own factory"
    ]


def build(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """A freshly initialized model (no pretrained weights: nothing is downloaded)."""
    if cfg._target_:
        return factory.build_model(cfg, num_classes)
    return BUILT_IN.get(cfg.name, vision).from_config(cfg, num_classes)


def positions(cfg: ModelConfig) -> Optional[int]:
    """Tokens per sample for a language model (the sequence length it trains at: model.context, or a
    point's context from sweep.context_lengths, as model.input_shape), else None."""
    return int(cfg.input_shape[0]) if is_language_model(cfg) else None


def samples(cfg: ModelConfig, num_classes: int) -> Samples:
    """What one sample of this model is: `model.context` token ids (a language model's vocabulary is
    the data's `num_classes`), or a float tensor of model.input_shape with a class label."""
    return Samples(tuple(cfg.input_shape), num_classes, tokens=is_language_model(cfg))


def batch_coupled_layers(model: nn.Module) -> List[str]:
    """The model's layer types that mix the samples of a (micro-)batch: BatchNorm normalizes each
    sample by its micro-batch's statistics; an instance norm that keeps running statistics updates
    them per batch. Layers that work on each sample alone (LayerNorm, GroupNorm, dropout) are not.
    A layer of your own that couples samples cannot be told apart: smart.batch_coupled=true."""
    coupled = (nn.modules.batchnorm._BatchNorm,)
    found = {type(m).__name__ for m in model.modules()
             if isinstance(m, coupled) or (isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.track_running_stats)}
    return sorted(found)


def build_on_meta(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """The model's structure without its weights (the meta device allocates nothing): what a check
    of its modules needs."""
    try:
        with torch.device("meta"):
            return build(cfg, num_classes)
    except Exception:  # noqa: BLE001 - a factory that cannot run on meta is built for real
        return build(cfg, num_classes)
