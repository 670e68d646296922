"""Image data by name: `data=digits` (scikit-learn's bundled 8x8 digits), `data=cifar10` (torchvision's
CIFAR-10 on disk), `data=synthetic` (random tensors with random labels), each resized to the model's
input shape. Their config fields are in sweeper/config/workload.py (DataConfig)."""

from __future__ import annotations

import os
from typing import List, Sequence

import torch
from torch.utils.data import TensorDataset

from sweeper.config import DataConfig
from sweeper.workloads.splits import Splits

NAMES = ("digits", "cifar10", "synthetic")
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
# The train/validation split of digits and synthetic data does not move with train.seed, so
# accuracies of trials with different seeds are measured on the same held-out samples.
SPLIT_SEED = 20_240_601


def check(cfg: DataConfig, context: int = 0) -> List[str]:
    """Problems that would stop `load`: CIFAR-10's files missing without data.download."""
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


def source(cfg: DataConfig) -> str:
    """Where the data comes from, as MLflow's dataset input names it."""
    return {
        "digits": "sklearn.datasets.load_digits",
        "cifar10": f"torchvision.datasets.CIFAR10 ({os.path.abspath(cfg.root) if cfg.root else 'data'})",
        "synthetic": "sweeper.data (random tensors)",  # recorded as before the move to workloads/
    }[cfg.name]


def load(cfg: DataConfig, input_shape: Sequence[int]) -> Splits:
    return {"digits": _digits, "cifar10": _cifar10, "synthetic": _synthetic}[cfg.name](cfg, input_shape)


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
