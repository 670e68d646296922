"""`model=hf`'s own config field (model.hf_type; model.context is gpt_config's, shared by the language models),
its default and its checks before anything imports transformers (the config's own rules: hf.check_config).
Pure: sweeper.config composes ModelConfig from this section (the model itself is hf.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

from sweeper.workloads.gpt_config import LanguageModelConfig, check_context

LANGUAGE_MODEL = True


@dataclass
class HFConfig(LanguageModelConfig):
    # A Hugging Face transformers causal LM of this model type (gpt2, llama, ...) built from its config
    # with random weights (the optional extra `.[hf]`), `model.kwargs` its config's overrides; its
    # vocabulary is the data's, its position table `context`.
    hf_type: str = "gpt2"


def check(model: Any) -> List[str]:
    """Problems with model=hf's fields that need no transformers (`model`: the whole ModelConfig)."""
    return check_context(model)
