"""The workload's sections (model, data, inference): ModelConfig composed of the fields every model has and
each built-in model's own section (config/model_sections.py, found by model.name in MODEL_SECTIONS), the fields
of the datasets, their defaults once, and their checks, the model-and-data pairing included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from sweeper.config.model_sections import MODEL_SECTIONS, GPTConfig, HFConfig, LightningFields, MLPConfig
from sweeper.config.rules import check_rule, is_not_negative, is_positive, check_sizes
from sweeper.config.runtime import physical_memory_bytes
from sweeper.errors import first_line


BYTE_VOCAB = 256  # data=text's vocabulary: bytes


# Models that take token ids and predict the next token at every position (each section says whether it
# is one), and the data that makes token sequences for them (sweeper/workloads/text.py).
LANGUAGE_MODELS = tuple(name for name, section in MODEL_SECTIONS.items() if section.language_model)


TOKEN_DATA = ("text", "tokens")


# One sample bigger than this is a typo in model.input_shape (a micro-batch holds many samples and
# their activations), not a workload: refused before anything allocates it.
MAX_SAMPLE_BYTES = 2**30


# The samples data=digits holds in memory (scikit-learn's bundled set); synthetic holds data.num_samples.
DIGITS_SAMPLES = 1797


@dataclass
class _EveryModel:
    # A torchvision classification model name (resnet18, mobilenet_v3_small, ...), "mlp",
    # or any label when `_target_` names your own factory.
    name: str = MISSING
    # Import path of a factory returning an nn.Module, Hydra `_target_` style; called with
    # `kwargs`, plus `num_classes` if the factory accepts it and `kwargs` does not set it.
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # The shape of one sample the model consumes; the dataset is resized to it. One float32 sample
    # may take at most 1 GiB (MAX_SAMPLE_BYTES). model=gpt: [context], set from model.context.
    input_shape: List[int] = field(default_factory=lambda: [3, 32, 32])


@dataclass
class ModelConfig(LightningFields, MLPConfig, HFConfig, GPTConfig, _EveryModel):
    """The `model` section: the fields every model has, then each built-in model's own (MODEL_SECTIONS'
    dataclasses, one flat section: `model.depth`, `model.n_layer`, ... as in the YAML), whichever model
    is chosen."""

    # sweep.activation_checkpointing=blocks wraps torchvision's residual blocks and the MLP's layers;
    # a model of your own names its block classes here (e.g. [MyBlock]).
    checkpoint_modules: List[str] = field(default_factory=list)


@dataclass
class DataConfig:
    # digits | cifar10 | synthetic, or any label when `_target_` names your own factory.
    name: str = MISSING
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    num_classes: int = 10
    # cifar10: torchvision's on-disk layout under `root`.
    root: str = "data"
    download: bool = False
    # cifar10: check the archive's MD5 sums as torchvision does; false accepts any files in
    # CIFAR-10's on-disk format (a re-pickled or reduced copy, or the tests' tiny archive).
    verify_checksums: bool = True
    # digits / synthetic: the held-out share used for validation accuracy.
    val_fraction: float = 0.2
    # synthetic: how many random samples.
    num_samples: int = 2048
    # data=tokens: the folder holding nanoGPT's train.bin and val.bin (uint16 token ids), and the
    # vocabulary those ids are below.
    path: Optional[str] = None
    vocab_size: Optional[int] = None
    # torch DataLoader worker processes per training worker (at most 4 per CPU, see check_data).
    loader_workers: int = 0
    # Import path of the collate function the training and evaluation loaders batch samples with (e.g. dynamic
    # padding of token ids); null: torch's default_collate. A batch may be any nesting of tensors (dicts,
    # tuples, lists, dataclasses): it is moved to the device whole.
    collate_fn: Optional[str] = None
    # Import path of `fn(batch) -> int`, the samples a batch holds, only where it cannot be read from the batch
    # (the leading dimension of its `labels`, its `input_ids`, or its first tensor). null: read from the batch.
    samples_fn: Optional[str] = None
    # model=lightning (data=lightning): the import path of your LightningDataModule class (or a factory of one),
    # made with data.kwargs; its `batch_size` attribute takes each point's micro-batch (Lightning's tuner
    # convention) and its train_dataloader's dataset and collate_fn are streamed in the point's order.
    datamodule: Optional[str] = None


@dataclass
class InferenceConfig:
    # task=inference: batch sizes timed under torch.inference_mode(), smallest first (1..512).
    batch_sizes: Any = field(default_factory=lambda: [2**i for i in range(10)])
    # Untimed runs first; then timing goes on until both timed_runs and min_timed_seconds are reached.
    warmup_runs: int = 10
    timed_runs: int = 100
    min_timed_seconds: float = 0.5
    # model=mlp only: also sweep the width (seed 003's experiment: [256,512,1024,2048,4096]);
    # null: model.width.
    mlp_widths: Any = None
    # model=gpt: decode is timed at each of these contexts (cached positions, each at most model.context),
    # batch_sizes concurrent sequences each (docs/inference.md#decode). null: model.context alone.
    contexts: Any = None


def check_data(data: DataConfig, local_cpus: Optional[int]) -> List[str]:
    """`local_cpus`: this machine's CPUs when the points run on it (a local Ray), else None."""
    problems: List[str] = []
    check_rule(problems, "data.val_fraction", data.val_fraction, lambda f: 0 < f < 1, "must be between 0 and 1")
    check_rule(problems, "data.num_samples", data.num_samples, is_positive, "must be positive")
    if not is_token_data(data):  # token data: its vocabulary (sweeper.workloads.text)
        check_rule(problems, "data.num_classes", data.num_classes, lambda n: n >= 2, "must be at least 2")
    # Each DataLoader worker is a process with its own copy of the dataset object, per training
    # worker; torch warns past one per CPU. Four per CPU leaves room for loaders that wait on disk or
    # network; thousands only exhaust memory and the process limit. A cluster's nodes are not known
    # before Ray connects: 1024 is four per CPU of a 256-core node.
    limit = 4 * local_cpus if local_cpus else 1024
    where = f"4 per CPU of this machine's {local_cpus}" if local_cpus else "4 per CPU of a 256-core node"
    check_rule(
        problems, "data.loader_workers", data.loader_workers, lambda n: 0 <= n <= limit,
        f"must be between 0 and {limit} ({where}), e.g. 0 for loading in the training process",
    )
    if data.collate_fn:
        problems += check_factory("data.collate_fn", data.collate_fn, "a batch of a list of samples")
    if data.samples_fn:
        problems += check_factory("data.samples_fn", data.samples_fn, "the number of samples in a batch")
    return problems


def check_model(model: ModelConfig) -> List[str]:
    problems: List[str] = []
    shape = list(model.input_shape)
    if not shape or any(d <= 0 for d in shape):
        problems.append(f"model.input_shape={shape}: every dimension must be positive, e.g. [3,32,32]")
    elif sample_bytes(shape) > MAX_SAMPLE_BYTES:
        problems.append(
            f"model.input_shape={shape}: one float32 sample would take {sample_bytes(shape) / 2**30:,.1f} GiB "
            f"({' x '.join(map(str, shape))} x 4 bytes), over the {MAX_SAMPLE_BYTES / 2**30:g} GiB a sample may "
            "take: give the shape of one sample, e.g. [3,32,32]"
        )
    section = MODEL_SECTIONS.get(model.name)
    if section is not None and not model._target_:
        problems += section.check(model)
    return problems


def check_inference(inference: InferenceConfig) -> List[str]:
    problems = check_sizes("inference.batch_sizes", inference.batch_sizes, "[1,2,4,8]")
    if inference.mlp_widths is not None:
        problems += check_sizes("inference.mlp_widths", inference.mlp_widths, "[256,1024]", ", or null")
    if inference.contexts is not None:
        problems += check_sizes("inference.contexts", inference.contexts, "[64,256]", ", or null for model.context",
                           least=2)
    check_rule(problems, "inference.timed_runs", inference.timed_runs, lambda n: n >= 1, "must be >= 1")
    check_rule(problems, "inference.warmup_runs", inference.warmup_runs, is_not_negative, "must be >= 0")
    check_rule(
        problems, "inference.min_timed_seconds", inference.min_timed_seconds, is_not_negative, "must be >= 0 (seconds)"
    )
    return problems


def check_model_data(model: ModelConfig, data: DataConfig) -> List[str]:
    """The built-in datasets make samples of model.input_shape: digits and cifar10 resize images to
    it; digits and synthetic hold all of theirs in memory (cifar10 transforms each as it is read).
    Token data trains a language model, and a language model trains on token data."""
    tokens, language_model = is_token_data(data), is_language_model(model)
    if tokens and not language_model and not model._target_:
        return [f"data={data.name} makes token sequences, which model={model.name} does not take: use model=gpt "
                "(or model=hf)"]
    if language_model and not tokens and not data._target_:
        return [f"model={model.name} trains on token sequences, which data={data.name} does not make: use "
                "data=text (bytes "
                "of the Python standard library) or data=tokens data.path=DIR (your nanoGPT train.bin/val.bin)"]
    if tokens or language_model:
        return []
    shape = list(model.input_shape)
    if data._target_ or not shape or any(d <= 0 for d in shape) or sample_bytes(shape) > MAX_SAMPLE_BYTES:
        return []  # check_model's problems
    if data.name in ("digits", "cifar10") and len(shape) > 3:
        return [f"model.input_shape={shape}: data={data.name} makes images, so 1 to 3 dimensions (C x H x W)"]
    if data.name == "cifar10" and len(shape) == 3 and shape[0] not in (1, 3):
        return [f"model.input_shape={shape}: data=cifar10 has 1 (grayscale) or 3 (RGB) channels, not {shape[0]}"]
    samples = {"digits": DIGITS_SAMPLES, "synthetic": data.num_samples}.get(data.name, 0)
    held, memory = samples * sample_bytes(shape), physical_memory_bytes()
    if not memory or held <= memory:
        return []
    return [
        f"model.input_shape={shape}: data={data.name} holds its {samples} samples in memory at that shape, "
        f"{held / 2**30:,.1f} GiB, more than this machine's {memory / 2**30:,.1f} GiB: use a smaller "
        "model.input_shape" + (" or data.num_samples" if data.name == "synthetic" else "")
    ]


def is_language_model(model: ModelConfig) -> bool:
    return model.name in LANGUAGE_MODELS and not model._target_


def is_token_data(data: DataConfig) -> bool:
    return data.name in TOKEN_DATA and not data._target_


def sample_bytes(shape: List[int]) -> int:
    """Bytes of one float32 sample of `shape`."""
    return 4 * math.prod(shape)


def check_factory(key: str, path: str, returns: str) -> List[str]:
    """Problems with a Hydra `_target_`-style import path: not importable, or not callable."""
    from hydra.utils import get_method

    try:
        factory = get_method(path)
    except Exception as exc:  # Hydra wraps import errors in its own types
        return [
            f"{key}={path!r} cannot be imported ({first_line(exc)}): give the import path of a "
            f"function returning {returns}, importable from where you run the sweep"
        ]
    return [] if callable(factory) else [f"{key}={path!r} is not callable"]
