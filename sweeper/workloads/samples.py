"""What one training sample is, for the code that makes up batches without the dataset (FLOP counts,
memory estimates, the recipe's trial step), and the loss both kinds train with. Knows torch only.

An image classifier's sample is a float tensor with one class label; a language model's is a
sequence of token ids whose targets are the next token at every position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Samples:
    shape: Tuple[int, ...]  # one sample: C x H x W (or any), or (positions,) for token ids
    num_classes: int  # classes, or the vocabulary a token id is below
    tokens: bool = False

    def batch(self, n: int, generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """A random batch of `n` samples and their targets."""
        if self.tokens:
            ids = torch.randint(0, self.num_classes, (n, *self.shape), generator=generator)
            return ids, torch.randint(0, self.num_classes, (n, *self.shape), generator=generator)
        return (torch.randn(n, *self.shape, generator=generator),
                torch.randint(0, self.num_classes, (n,), generator=generator))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of class logits (N x C against N) or of next-token logits (N x T x V against
    N x T, the mean over every token of the batch, as nanoGPT trains)."""
    if targets.dim() > 1 and logits.dim() == targets.dim() + 1:
        losses = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), label_smoothing=label_smoothing,
                                 reduction=reduction)
        return losses.view(targets.shape) if reduction == "none" else losses
    return F.cross_entropy(logits, targets, label_smoothing=label_smoothing, reduction=reduction)
