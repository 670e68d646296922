"""Each built-in model's own config fields (model=mlp, model=gpt, model=hf), their defaults once and their checks,
and the registry that finds them by model.name (MODEL_SECTIONS). config/workload.py composes them into the one flat
`model` section. Pure: the models themselves are sweeper/workloads/<model>.py, which import the config, never the
other way round; adding one: docs/adding-a-workload.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from sweeper.config.rules import check_rule, is_positive


@dataclass
class MLPConfig:
    # Seed 003's MLP is depth 8, width 1024; 4 is what learns digits in the default 2 epochs
    # (conf/model/mlp.yaml).
    depth: int = 4
    width: int = 1024


@dataclass
class LanguageModelConfig:
    # The tokens of one training sequence (model.input_shape is [context]); also the position table's size.
    # Every built-in language model's (model=gpt, model=hf).
    context: int = 64


@dataclass
class GPTConfig(LanguageModelConfig):
    # A decoder-only transformer trained on sequences of `context` tokens; its vocabulary is the data's
    # (256 bytes for data=text, data.vocab_size for data=tokens).
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128


@dataclass
class HFConfig(LanguageModelConfig):
    # A Hugging Face transformers causal LM of this model type (gpt2, llama, ...) built from its config
    # with random weights (the optional extra `.[hf]`), `model.kwargs` its config's overrides; its
    # vocabulary is the data's, its position table `context`. Its rules that need transformers are
    # workloads/hf.py's check_config.
    hf_type: str = "gpt2"


@dataclass
class LightningFields:
    # model=lightning: the import path of your LightningModule class (or a factory of one), made with
    # model.kwargs and trained by Lightning's own Trainer on data.datamodule (docs/your-training.md). Not in
    # MODEL_SECTIONS: sweeper builds no model for it; its rules are config/loop.py's.
    module: Optional[str] = None


def check_mlp(model: Any) -> List[str]:
    """Problems with model=mlp's fields (`model`: the whole ModelConfig)."""
    problems: List[str] = []
    for key in ("depth", "width"):
        check_rule(problems, f"model.{key}", getattr(model, key), is_positive, "must be positive")
    return problems


def check_context(model: Any) -> List[str]:
    """Problems with model.context, the rule of every language model."""
    problems: List[str] = []
    check_rule(problems, "model.context", model.context, lambda n: n >= 2,
               "must be at least 2 (a sequence of one token has no next token to predict within it), e.g. 64")
    return problems


def check_gpt(model: Any) -> List[str]:
    """Problems with model=gpt's fields (`model`: the whole ModelConfig)."""
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


@dataclass(frozen=True)
class ModelSection:
    """A built-in model's own section: its fields (a base of ModelConfig), their checks, run for that model.name
    only, and whether it takes token ids and predicts the next token at every position (the data then makes
    token sequences and the loss is per token)."""

    fields: type
    check: Callable[[Any], List[str]]
    language_model: bool


# model.name -> its section. Its model is found by the same name in sweeper/workloads/models.py (a unit test
# checks the two registries name the same models).
MODEL_SECTIONS: Dict[str, ModelSection] = {
    "mlp": ModelSection(MLPConfig, check_mlp, language_model=False),
    "gpt": ModelSection(GPTConfig, check_gpt, language_model=True),
    "hf": ModelSection(HFConfig, check_context, language_model=True),
}
