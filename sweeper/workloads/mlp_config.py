"""`model=mlp`'s own config fields (model.depth, model.width), their defaults and their checks. Pure: sweeper.config
composes ModelConfig from this section, so it imports no torch (the model itself is mlp.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

LANGUAGE_MODEL = False


@dataclass
class MLPConfig:
    # Seed 003's MLP is depth 8, width 1024; 4 is what learns digits in the default 2 epochs
    # (conf/model/mlp.yaml).
    depth: int = 4
    width: int = 1024


def check(model: Any) -> List[str]:
    """Problems with model=mlp's fields (`model`: the whole ModelConfig)."""
    # Imported here: sweeper.config imports this module while it is itself being loaded.
    from sweeper.config.rules import check_rule, is_positive

    problems: List[str] = []
    for key in ("depth", "width"):
        check_rule(problems, f"model.{key}", getattr(model, key), is_positive, "must be positive")
    return problems
