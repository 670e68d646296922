"""`model=gpt`'s own config fields (model.n_layer, model.n_head, model.d_model, model.context), their defaults and
their checks; model.context is every built-in language model's (model=hf shares it). Pure: sweeper.config
composes ModelConfig from this section, so it imports no torch (the model itself is gpt.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

LANGUAGE_MODEL = True


@dataclass
class LanguageModelConfig:
    # The tokens of one training sequence (model.input_shape is [context]); also the position table's size.
    context: int = 64


@dataclass
class GPTConfig(LanguageModelConfig):
    # A decoder-only transformer trained on sequences of `context` tokens; its vocabulary is the data's
    # (256 bytes for data=text, data.vocab_size for data=tokens).
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128


def check_context(model: Any) -> List[str]:
    """Problems with model.context, the rule of every language model."""
    from sweeper.config.rules import check_rule  # here: sweeper.config imports this module while it loads

    problems: List[str] = []
    check_rule(problems, "model.context", model.context, lambda n: n >= 2,
               "must be at least 2 (a sequence of one token has no next token to predict within it), e.g. 64")
    return problems


def check(model: Any) -> List[str]:
    """Problems with model=gpt's fields (`model`: the whole ModelConfig)."""
    from sweeper.config.rules import check_rule, is_positive  # here: as in check_context

    problems = check_context(model)
    for key in ("n_layer", "n_head", "d_model"):
        check_rule(problems, f"model.{key}", getattr(model, key), is_positive, "must be positive")
    if not problems and model.d_model % model.n_head:
        problems.append(f"model.n_head={model.n_head} does not divide model.d_model={model.d_model}: each head "
                        f"takes d_model / n_head dimensions; e.g. model.n_head={_divisor(model.d_model, model.n_head)}")
    return problems


def _divisor(n: int, near: int) -> int:
    """The divisor of `n` closest to `near`."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), d))
