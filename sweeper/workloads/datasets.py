"""Datasets by name (digits, cifar10, synthetic, text, tokens, or the user's factory) and the sampler
that cuts the training stream into full global batches."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch
from hydra.utils import get_method
from torch.utils.data import Dataset, Sampler, TensorDataset

from sweeper import text
from sweeper.config import BYTE_VOCAB, TOKEN_DATA, DataConfig, check_factory
from sweeper.errors import first_line
from sweeper.plan import GridPoint, stream_indices

BUILTIN = ("digits", "cifar10", "synthetic", *TOKEN_DATA)
FACTORY_RETURNS = "a 2-tuple (train_dataset, val_dataset or None) of datasets with len()"
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
# The train/validation split of digits and synthetic data does not move with train.seed, so
# accuracies of trials with different seeds are measured on the same held-out samples.
SPLIT_SEED = 20_240_601


@dataclass
class Splits:
    train: Dataset
    val: Optional[Dataset]  # None: no held-out split, no accuracy
    num_classes: int
    # Synthetic labels are random: accuracy on them would be a meaningless number.
    has_real_labels: bool = True
    # Token data: the vocabulary is byte-level (bits per byte is the loss in bits), and the training
    # stream's unigram entropy in bits per token (what a model that learned only token frequencies
    # scores).
    byte_level: bool = False
    unigram_entropy_bits: Optional[float] = None
    identity: Optional[str] = None  # e.g. the text corpus's digest


def check(cfg: DataConfig, context: int = 0) -> List[str]:
    """Problems that would stop `load(cfg, ...)`: found without loading anything, except that a
    factory of your own is called once to see what it returns. `context`: a language model's
    sequence length, which token data must hold at least one sequence of."""
    if cfg._target_:
        return check_factory("data._target_", cfg._target_, FACTORY_RETURNS) or _check_factory_result(cfg)
    if cfg.name == "custom":
        return [
            "data._target_ is not set: data=custom needs the import path of your factory, "
            "e.g. data._target_=my_pkg.data.build"
        ]
    if cfg.name not in BUILTIN:
        return [
            f"data.name={cfg.name!r} is unknown: use data=digits, data=cifar10, data=synthetic, data=text or "
            "data=tokens, or set data._target_ to your own factory"
        ]
    if cfg.name == "tokens":
        return text.check_tokens(cfg.path, cfg.vocab_size, context)
    if cfg.name == "text":
        return text.check_text(cfg.val_fraction, context)
    if cfg.name == "cifar10" and not cfg.download:
        folder = os.path.join(os.path.abspath(cfg.root), CIFAR_FOLDER)
        missing = [f for f in CIFAR_FILES if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            return [
                f"data.root={cfg.root!r} has no CIFAR-10 data ({folder} lacks {', '.join(missing[:3])}"
                f"{'...' if len(missing) > 3 else ''}) and data.download=false: point data.root at "
                "the folder holding cifar-10-batches-py, or set data.download=true"
            ]
    return []


def _check_factory_result(cfg: DataConfig) -> List[str]:
    key = f"data._target_={cfg._target_!r}"
    try:
        made = get_method(cfg._target_)(**cfg.kwargs)
    except Exception as exc:  # noqa: BLE001 - whatever the user's factory raises is told in one line
        return [
            f"{key} raised {type(exc).__name__} ({first_line(exc)}) when called with data.kwargs="
            f"{dict(cfg.kwargs)}: fix the factory or its kwargs"
        ]
    if not _pair(made):
        return [f"{key} returned {_kind(made)}, not {FACTORY_RETURNS}: return (train, val), or (train, None)"]
    train, val = made
    for name, dataset in (("train", train), ("val", val)):
        if not _map_style(dataset) and not (name == "val" and dataset is None):
            return [
                f"{key} returned a {name} dataset of type {type(dataset).__name__}, without len() and indexing: "
                "return map-style datasets (a torch.utils.data.Dataset with __len__, e.g. TensorDataset)"
            ]
    if len(train) == 0:
        return [f"{key} returned an empty train dataset: it needs samples to train on"]
    if not _pair(train[0]):
        return [
            f"{key}: a train sample is {_kind(train[0])}, not an (input, label) pair: make the dataset's "
            "__getitem__ return (x, label)"
        ]
    return []


def _map_style(dataset: object) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def _pair(value: object) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2


def _kind(value: object) -> str:
    """e.g. "a tuple of 3", "an int"."""
    name = type(value).__name__
    size = f" of {len(value)}" if isinstance(value, (tuple, list)) else ""
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}{size}"


def source(cfg: DataConfig) -> str:
    """Where the data comes from, as MLflow's dataset input names it."""
    return {
        "digits": "sklearn.datasets.load_digits",
        "cifar10": f"torchvision.datasets.CIFAR10 ({os.path.abspath(cfg.root) if cfg.root else 'data'})",
        "synthetic": "sweeper.data (random tensors)",
        "text": "the Python standard library's source files (sweeper.text)",
        "tokens": f"nanoGPT token files ({os.path.abspath(cfg.path) if cfg.path else 'data.path'})",
    }.get(cfg.name, cfg._target_ or cfg.name)


def load(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    """The training and held-out splits, every sample shaped `input_shape`."""
    if cfg._target_:
        factory = get_method(cfg._target_)
        train, val = factory(**cfg.kwargs)
        return Splits(train, val, cfg.num_classes)
    if cfg.name == "digits":
        return _digits(cfg, input_shape)
    if cfg.name == "cifar10":
        return _cifar10(cfg, input_shape)
    if cfg.name == "synthetic":
        return _synthetic(cfg, input_shape)
    if cfg.name == "text":
        return _text(cfg, int(input_shape[0]))
    if cfg.name == "tokens":
        return _tokens(cfg, int(input_shape[0]))
    raise ValueError(f"data.name={cfg.name!r} is unknown")


def _digits(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), resized to the
    model's input: real data that ships inside an installed package."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    images = _fit_shape(images, input_shape)
    images = (images - images.mean()) / images.std()
    train_idx, val_idx = _split(len(labels), cfg.val_fraction)
    return Splits(
        TensorDataset(images[train_idx], labels[train_idx]),
        TensorDataset(images[val_idx], labels[val_idx]),
        num_classes=10,
    )


def _synthetic(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    g = torch.Generator().manual_seed(SPLIT_SEED)
    images = torch.randn((cfg.num_samples, *input_shape), generator=g)
    labels = torch.randint(0, cfg.num_classes, (cfg.num_samples,), generator=g)
    return Splits(TensorDataset(images, labels), None, cfg.num_classes, has_real_labels=False)


def _text(cfg: DataConfig, context: int) -> Splits:
    corpus = text.stdlib_corpus(cfg.val_fraction)
    train = corpus.read(corpus.train_files)
    return Splits(text.PackedSequences(train, context), text.PackedSequences(corpus.read(corpus.val_files), context),
                  num_classes=BYTE_VOCAB, byte_level=True,
                  unigram_entropy_bits=text.unigram_entropy_bits(train, BYTE_VOCAB),
                  identity=f"sha256:{corpus.digest}")


def _tokens(cfg: DataConfig, context: int) -> Splits:
    train, val = (text.token_file(os.path.abspath(cfg.path), name) for name in text.TOKEN_FILES)
    return Splits(text.PackedSequences(train, context), text.PackedSequences(val, context),
                  num_classes=int(cfg.vocab_size),
                  unigram_entropy_bits=text.unigram_entropy_bits(train, cfg.vocab_size))


def _cifar10(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    """torchvision's CIFAR-10 loader; validation accuracy on the official test batch."""
    from torchvision import datasets, transforms

    cls = datasets.CIFAR10 if cfg.verify_checksums else _unchecked_cifar10()
    steps = []
    channels, height, width = _chw(input_shape)
    if channels == 1:
        steps.append(transforms.Grayscale(num_output_channels=1))
    if (height, width) != (32, 32):
        steps.append(transforms.Resize((height, width), antialias=True))
    steps.append(transforms.ToTensor())
    mean = (0.4914, 0.4822, 0.4465) if channels == 3 else (0.4809,)
    std = (0.2470, 0.2435, 0.2616) if channels == 3 else (0.2390,)
    steps.append(transforms.Normalize(mean, std))
    if channels not in (1, 3):
        raise ValueError(f"cifar10 needs model.input_shape with 1 or 3 channels, got {channels}")
    tf = transforms.Compose(steps)
    root = os.path.abspath(cfg.root)
    train = cls(root, train=True, transform=tf, download=cfg.download)
    val = cls(root, train=False, transform=tf, download=False)
    return Splits(train, val, num_classes=10)


def _unchecked_cifar10():
    from torchvision import datasets

    class UncheckedCIFAR10(datasets.CIFAR10):
        # torchvision skips the MD5 comparison when the expected sum is None (files must still exist).
        train_list = [[name, None] for name, _ in datasets.CIFAR10.train_list]
        test_list = [[name, None] for name, _ in datasets.CIFAR10.test_list]
        meta = {**datasets.CIFAR10.meta, "md5": None}

    return UncheckedCIFAR10


def _chw(input_shape: Sequence[int]):
    if len(input_shape) == 3:
        return tuple(int(d) for d in input_shape)
    if len(input_shape) == 1:  # a flat vector, e.g. an MLP on 784 features: treat as 1 x 1 x n
        return 1, 1, int(input_shape[0])
    if len(input_shape) == 2:
        return 1, int(input_shape[0]), int(input_shape[1])
    raise ValueError(f"model.input_shape={list(input_shape)} must have 1, 2 or 3 dimensions")


def _fit_shape(images: torch.Tensor, input_shape: Sequence[int]) -> torch.Tensor:
    """N x 1 x H x W images resized (bilinear) and channel-replicated to `input_shape`."""
    channels, height, width = _chw(input_shape)
    if images.shape[-2:] != (height, width):
        images = torch.nn.functional.interpolate(
            images, size=(height, width), mode="bilinear", align_corners=False
        )
    images = images.expand(-1, channels, -1, -1).contiguous()
    return images.reshape(images.shape[0], *input_shape)


def _split(n: int, val_fraction: float):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_val = max(1, int(round(n * val_fraction)))
    return order[n_val:], order[:n_val]


class GlobalBatchSampler(Sampler[int]):
    """The indices one rank trains on, `steps` optimizer steps long, in micro-batch order.

    Every micro-batch it yields is full and every rank yields the same number of indices, so no
    worker ever sees a short or empty last batch (seed 002: how BatchNorm statistics turn NaN), and
    the global batch at step k is the same samples whatever the (micro, accumulation, workers)
    layout. Each epoch is a fresh permutation seeded by (seed, epoch), as DistributedSampler does.
    """

    def __init__(self, num_samples: int, point: GridPoint, rank: int, steps: int, seed: int, start_sample: int = 0):
        self.num_samples = num_samples
        self.point = point
        self.rank = rank
        self.steps = steps
        self.seed = seed
        # A run continued from a checkpoint starts where the stream stood (samples seen so far).
        self.start_sample = start_sample

    def __len__(self) -> int:
        return self.steps * self.point.micro_batch_size * self.point.accumulation_steps

    def __iter__(self) -> Iterator[int]:
        # Only the epochs this run reaches: an epoch's order is seeded by its number (random access).
        first = self.start_sample // self.num_samples
        last = math.ceil((self.start_sample + self.steps * self.point.global_batch_size) / self.num_samples)
        perms = [
            torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(epoch_seed(self.seed, epoch))).tolist()
            for epoch in range(first, last)
        ]
        offset = self.start_sample - first * self.num_samples
        return iter(stream_indices(perms, 0, self.steps, self.point, self.rank, offset))


def epoch_seed(seed: int, epoch: int) -> int:
    """The sample order's seed for one epoch of one replicate. Not `seed + epoch`: then replicate 1's
    first epoch would be replicate 0's second, and `sweep.seeds` replicates would replay each other's
    orders one epoch apart."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch]).generate_state(1)[0])
