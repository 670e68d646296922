"""One validation batch scored from its logits: hits, cross-entropy and the per-sample losses behind the
loss's standard error, computed in chunks of rows so that the fp32 logits of a whole batch never exist at
once; and the memory that chunking predicts. Knows torch only.

A language model at context 2048 and vocabulary 32k holds 2048 x 32k logits per sequence: 250 MiB in fp32.
Cross-entropy over all of them at once keeps an fp32 copy (under bf16 autocast) and its log-softmax beside
the logits, three times the logits' bytes; per chunk, only one chunk's copy and log-softmax are added.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# The fp32 bytes of one chunk's logits (its log-softmax takes as many again): hundreds of rows at a
# vocabulary of 32k, enough for every kernel to run full width, and small beside the logits of a batch
# of long sequences (250 MiB per 2048-token sequence at 32k).
CHUNK_BYTES = 64 * 2**20
# Hugging Face's label for a position that is not scored (padding, the prompt): cross-entropy's default.
IGNORE_INDEX = -100
# What `sums` holds, in this order (float64, so counts stay exact and losses add without rounding drift).
FIELDS = ("correct", "loss", "sample_loss", "sample_loss_squared", "samples", "predictions")


def chunk_rows(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows (positions) per chunk: as many fp32 rows of `vocab` logits as `chunk_bytes` holds, at least one."""
    return max(1, chunk_bytes // (4 * vocab))


def predicted_bytes(rows: int, vocab: int, logit_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """The most that scoring one batch of `rows` predictions holds beyond the model and its inputs: the
    logits (in the model's dtype, `logit_bytes` each), one chunk's fp32 copy of them (none when they are
    fp32 already: a view) and the chunk's log-softmax. The per-row figures (a loss, a hit, an index per
    row of the chunk) are a few bytes against `vocab` x 4 and are left out."""
    chunk = min(rows, chunk_rows(vocab, chunk_bytes)) * vocab * 4
    return rows * vocab * logit_bytes + (0 if logit_bytes == 4 else chunk) + chunk


def new_sums(device: torch.device) -> torch.Tensor:
    return torch.zeros(len(FIELDS), dtype=torch.float64, device=device)


def add(sums: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Add one batch to `sums` (FIELDS): class logits (N x C against N) or next-token logits (N x T x V
    against N x T), in any dtype; every chunk is scored in fp32. Positions labelled IGNORE_INDEX count
    nowhere. A sample's loss is the mean over its scored positions (a sequence's tokens are not independent
    of each other: the standard error is taken over samples)."""
    samples = targets.shape[0]
    per_sample = targets[0].numel() if samples else 1
    flat_logits, flat_targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    step = chunk_rows(flat_logits.shape[-1], chunk_bytes)
    device = sums.device
    sample_loss = torch.zeros(samples, dtype=torch.float64, device=device)
    sample_count = torch.zeros(samples, dtype=torch.float64, device=device)
    for start in range(0, flat_targets.numel(), step):
        chunk = flat_logits[start:start + step].float()
        wanted = flat_targets[start:start + step]
        losses = F.cross_entropy(chunk, wanted, reduction="none", ignore_index=IGNORE_INDEX)
        scored = wanted != IGNORE_INDEX
        sums[0] += ((chunk.argmax(dim=-1) == wanted) & scored).sum()
        del chunk  # the next chunk's copy must not meet this one
        owner = torch.arange(start, start + wanted.numel(), device=wanted.device) // per_sample
        sample_loss.index_add_(0, owner.to(device), losses.to(device, torch.float64))
        sample_count.index_add_(0, owner.to(device), scored.to(device, torch.float64))
    has = sample_count > 0
    means = sample_loss[has] / sample_count[has]
    sums[1] += sample_loss.sum()
    sums[2] += means.sum()
    sums[3] += (means * means).sum()
    sums[4] += has.sum()
    sums[5] += sample_count.sum()


def summary(sums: torch.Tensor):
    """(accuracy, mean loss per prediction, the standard error of the per-sample losses' mean,
    predictions, samples) of reduced `sums`; accuracy and loss None when nothing was scored."""
    correct, loss, sample_loss, squares, samples, predictions = sums.cpu().tolist()
    if not predictions:
        return None, None, None, 0, int(samples)
    mean = sample_loss / samples
    variance = max(squares / samples - mean * mean, 0.0) * samples / max(samples - 1, 1)
    return correct / predictions, loss / predictions, math.sqrt(variance / samples), int(predictions), int(samples)
