"""`model=mlp`: seed 003's MLP, Linear+ReLU blocks on the flattened input, then a classifier. Its config
fields (model.depth, model.width) and their checks are its section in sweeper/config/model_sections.py."""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from sweeper.config import ModelConfig


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


def from_config(cfg: ModelConfig, num_classes: int) -> nn.Module:
    in_features = 1
    for d in cfg.input_shape:
        in_features *= d
    return MLP(in_features, num_classes, depth=cfg.depth, width=cfg.width)


def check_config(cfg: ModelConfig, num_classes: int) -> List[str]:
    return []  # its fields' rules are config checks (config.model_sections.check_mlp, before Ray starts)
