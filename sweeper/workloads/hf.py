"""`model=hf`: any Hugging Face `transformers` causal language model, built from its config with random
weights (a model type plus overrides: nothing is downloaded), behind the interface every sweeper model
has: `model(token ids) -> logits` of shape (batch, context, vocabulary).

An optional extra (`pip install -e ".[hf]"`, transformers 5): imported only when `model=hf` is asked
for. The vocabulary is the data's; the position table (`n_positions`, `max_position_embeddings`) is
`model.context` unless `model.kwargs` sets it; the decoder blocks the model declares
(`_no_split_modules`: GPT2Block, LlamaDecoderLayer, ...) are what `activation_checkpointing=blocks`
wraps. Attention is torch's `scaled_dot_product_attention` (`attn_implementation="sdpa"`), which
sweeper's FLOP counter counts."""

from __future__ import annotations

import difflib
from typing import Any, Dict, List, Tuple

from torch import nn

from sweeper.config import ModelConfig
from sweeper.errors import first_line

INSTALL = 'pip install -e ".[hf]" (transformers 5)'
# Where a config keeps its position table, by the names transformers uses.
POSITION_KEYS = ("n_positions", "max_position_embeddings")
# Token ids a config names, which must lie inside the data's vocabulary.
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


class HFCausalLM(nn.Module):
    """A transformers causal LM as sweeper calls a model: ids in, logits out (no cache, no labels:
    sweeper's own loss and targets)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.hf = model
        # What sweep.activation_checkpointing=blocks wraps (sweeper.recipe reads it).
        self.checkpoint_block_types: Tuple[str, ...] = tuple(getattr(model, "_no_split_modules", None) or ())

    def forward(self, ids: Any) -> Any:
        return self.hf(input_ids=ids, use_cache=False).logits


def config(model_type: str, overrides: Dict[str, Any], vocab_size: int, context: int) -> Any:
    """The transformers config: `model_type` with `overrides`, the data's vocabulary, `context` positions
    (unless overridden) and the special token ids inside the vocabulary."""
    import transformers
    from transformers import AutoConfig

    transformers.logging.set_verbosity_error()  # e.g. its default special ids outside a byte vocabulary
    values = dict(overrides)
    values["vocab_size"] = vocab_size
    made = AutoConfig.for_model(model_type, **values)
    if not any(key in overrides for key in POSITION_KEYS):  # aliases of each other in some configs
        for key in POSITION_KEYS:
            if hasattr(made, key):
                setattr(made, key, context)
    for key in SPECIAL_IDS:
        value = getattr(made, key, None)
        if key not in overrides and isinstance(value, int) and value >= vocab_size:
            setattr(made, key, 0)
    return made


def build(model_type: str, overrides: Dict[str, Any], vocab_size: int, context: int) -> HFCausalLM:
    """A freshly initialized causal LM (torch's RNG: seed it first for the same weights)."""
    from transformers import AutoModelForCausalLM

    made = AutoModelForCausalLM.from_config(config(model_type, overrides, vocab_size, context),
                                            attn_implementation="sdpa")
    return HFCausalLM(made)


def check(model_type: str, overrides: Dict[str, Any], vocab_size: int, context: int) -> List[str]:
    """Problems that would stop `build`, each naming the key and the fix: transformers missing, an unknown
    model type, an override the config rejects, a type with no causal LM, a position table shorter than
    the context."""
    try:
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM
    except ImportError:
        return [f"model=hf needs Hugging Face transformers, which is not installed: {INSTALL}"]
    if model_type not in _known_types():
        near = difflib.get_close_matches(model_type, _known_types(), 1)
        return [f"model.hf_type={model_type!r} is not a transformers model type: "
                f"{f'did you mean {near[0]}? ' if near else ''}e.g. gpt2, llama, gpt_neox, mistral, qwen2"]
    try:
        made = config(model_type, overrides, vocab_size, context)
    except Exception as exc:  # noqa: BLE001 - whatever the config rejects is told in one line
        cause = exc.__cause__ or exc
        return [f"model.kwargs={dict(overrides)} for model.hf_type={model_type}: {first_line(cause)}"]
    if type(made) not in AutoModelForCausalLM._model_mapping:
        return [f"model.hf_type={model_type!r} has no causal language model in transformers: choose a decoder "
                "(e.g. gpt2, llama)"]
    # A config takes any keyword and keeps it as an attribute of its own: a misspelt field would be ignored
    # silently. A key the config folds into another (Llama's rope_theta into rope_parameters) is not kept.
    fields = set(type(made)().to_dict()) | set(getattr(made, "attribute_map", {}))
    unknown = [key for key in overrides if key not in fields and key in made.to_dict()]
    if unknown:
        hints = [f"{k} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(k, fields, 1)) else k
                 for k in unknown]
        return [f"model.kwargs has {', '.join(hints)}, not a field of {type(made).__name__}: fix or drop it"]
    for key in POSITION_KEYS:
        table = getattr(made, key, None)
        if key in overrides and isinstance(table, int) and table < context:
            return [f"model.kwargs.{key}={table} is below model.context={context}: the position table must hold "
                    f"the context; raise it or drop it (it defaults to model.context)"]
    return []


def _known_types() -> Tuple[str, ...]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return tuple(CONFIG_MAPPING_NAMES)


def from_config(cfg: ModelConfig, num_classes: int) -> HFCausalLM:
    """model=hf: model.hf_type with model.kwargs as its config's overrides, the data's vocabulary."""
    return build(cfg.hf_type, dict(cfg.kwargs), num_classes, cfg.context)


def check_config(cfg: ModelConfig, num_classes: int) -> List[str]:
    return check(cfg.hf_type, dict(cfg.kwargs), num_classes, cfg.context)
