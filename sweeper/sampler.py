"""The sample stream of plan.py as torch's DataLoader takes it: the indices one rank trains on, cut into
full global batches, each epoch a fresh permutation. The arithmetic is plan.stream_indices (pure);
this is its torch side."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from sweeper.plan import GridPoint, stream_indices


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
