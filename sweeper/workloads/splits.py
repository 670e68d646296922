"""What every dataset loader returns: the training and held-out splits and what the report must know of
them (real labels or not, byte-level or not, the data's identity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch.utils.data import Dataset


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
    # Whether the driver may hand these splits to the worker groups (cluster/shared_data.py) rather than each
    # group building them: not memory-mapped files (pickling one copies the file; each worker maps it instead).
    shareable: bool = True
