"""Models by name: any torchvision classification model, the seed-003 MLP, or the user's own factory."""

from __future__ import annotations

import inspect
from typing import Callable, List

import torch
from hydra.utils import get_method
from torch import nn

from sweeper.config import ModelConfig, check_factory


class MLP(nn.Module):
    """Seed 003's MLP: `depth` Linear+ReLU layers of `width` units on the flattened input, then a
    classifier. BatchNorm-free, so gradient accumulation and data parallelism are exactly equivalent."""

    def __init__(self, in_features: int, num_classes: int, depth: int = 8, width: int = 1024):
        super().__init__()
        layers: List[nn.Module] = [nn.Flatten()]
        features = in_features
        for _ in range(depth):
            layers += [nn.Linear(features, width), nn.ReLU()]
            features = width
        layers.append(nn.Linear(features, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def torchvision_names() -> List[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check(cfg: ModelConfig) -> List[str]:
    """Problems that would stop `build(cfg, ...)`, found without building anything."""
    if cfg._target_:
        return check_factory("model._target_", cfg._target_, "an nn.Module")
    if cfg.name == "custom":
        return [
            "model._target_ is not set: model=custom needs the import path of your factory, "
            "e.g. model._target_=my_pkg.models.build"
        ]
    if cfg.name == "mlp" or cfg.name in torchvision_names():
        return []
    return [
        f"model.name={cfg.name!r} is unknown: use model=mlp, model=resnet18 (or model.name=<any "
        "torchvision classification model>), or set model._target_ to your own factory"
    ]


def build(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """A freshly initialized model (no pretrained weights: nothing is downloaded)."""
    if cfg._target_:
        factory: Callable[..., nn.Module] = get_method(cfg._target_)
        kwargs = dict(cfg.kwargs)
        if "num_classes" not in kwargs and "num_classes" in inspect.signature(factory).parameters:
            kwargs["num_classes"] = num_classes
        model = factory(**kwargs)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model._target_={cfg._target_!r} returned {type(model).__name__}, not an nn.Module")
        return model
    if cfg.name == "mlp":
        in_features = 1
        for d in cfg.input_shape:
            in_features *= d
        return MLP(in_features, num_classes, depth=cfg.depth, width=cfg.width)
    import torchvision

    return torchvision.models.get_model(cfg.name, weights=None, num_classes=num_classes, **cfg.kwargs)

