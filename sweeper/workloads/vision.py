"""`model=<a torchvision classification model>` (resnet18, mobilenet_v3_small, ...): built by name with
random weights (nothing is downloaded), `model.kwargs` passed on."""

from __future__ import annotations

from typing import List

from torch import nn

from sweeper.config import ModelConfig


def torchvision_names() -> List[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def from_config(cfg: ModelConfig, num_classes: int) -> nn.Module:
    import torchvision

    return torchvision.models.get_model(cfg.name, weights=None, num_classes=num_classes, **cfg.kwargs)
