"""Models by name: any torchvision classification model, the seed-003 MLP, sweeper's GPT, or the
user's own factory."""

from __future__ import annotations

import inspect
from typing import Any, List, Optional

import torch
from hydra.utils import get_method
from torch import nn

from sweeper.config import LANGUAGE_MODELS, ModelConfig, check_factory, is_language_model
from sweeper.errors import first_line
from sweeper.samples import Samples


class MLPBlock(nn.Sequential):
    """One Linear+ReLU layer of the MLP: the unit activation checkpointing (`blocks`) wraps."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(nn.Linear(in_features, out_features), nn.ReLU())


class MLP(nn.Module):
    """Seed 003's MLP: `depth` Linear+ReLU layers of `width` units on the flattened input, then a
    classifier. BatchNorm-free, so gradient accumulation and data parallelism are exactly equivalent."""

    def __init__(self, in_features: int, num_classes: int, depth: int = 8, width: int = 1024):
        super().__init__()
        layers: List[nn.Module] = [nn.Flatten()]
        features = in_features
        for _ in range(depth):
            layers.append(MLPBlock(features, width))
            features = width
        layers.append(nn.Linear(features, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def torchvision_names() -> List[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check(cfg: ModelConfig, num_classes: int = 10) -> List[str]:
    """Problems that would stop `build(cfg, num_classes)`. A factory of your own is called once, on
    the meta device (nothing allocated), to see that it returns an nn.Module."""
    if cfg._target_:
        return check_factory("model._target_", cfg._target_, "an nn.Module") or _check_factory_result(cfg, num_classes)
    if cfg.name == "custom":
        return [
            "model._target_ is not set: model=custom needs the import path of your factory, "
            "e.g. model._target_=my_pkg.models.build"
        ]
    if cfg.name == "hf":
        from sweeper import hf

        return hf.check(cfg.hf_type, dict(cfg.kwargs), num_classes, cfg.context)
    if cfg.name in ("mlp", *LANGUAGE_MODELS) or cfg.name in torchvision_names():
        return []
    return [
        f"model.name={cfg.name!r} is unknown: use model=mlp, model=gpt, model=hf, model=resnet18 (or model.name=<any "
        "torchvision classification model>), or set model._target_ to your own factory"
    ]


def _check_factory_result(cfg: ModelConfig, num_classes: int) -> List[str]:
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


def build(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """A freshly initialized model (no pretrained weights: nothing is downloaded)."""
    if cfg._target_:
        model = _call_factory(cfg, num_classes)
        if not isinstance(model, nn.Module):
            raise TypeError(_not_a_module(cfg, model))
        return model
    if cfg.name == "gpt":
        from sweeper.gpt import GPT

        return GPT(num_classes, cfg.context, cfg.n_layer, cfg.n_head, cfg.d_model)
    if cfg.name == "hf":
        from sweeper import hf

        return hf.build(cfg.hf_type, dict(cfg.kwargs), num_classes, cfg.context)
    if cfg.name == "mlp":
        in_features = 1
        for d in cfg.input_shape:
            in_features *= d
        return MLP(in_features, num_classes, depth=cfg.depth, width=cfg.width)
    import torchvision

    return torchvision.models.get_model(cfg.name, weights=None, num_classes=num_classes, **cfg.kwargs)


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
