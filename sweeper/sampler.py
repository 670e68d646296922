"""The sample stream of plan.py as torch's DataLoader takes it: what one rank trains on (rank_share). A
map-style dataset through GlobalBatchSampler: the indices cut into full global batches, each epoch a fresh
seeded permutation computed index by index (permutation.Permutation), so a rank holds a chunk of indices
at a time, never a list of the dataset. A streamed one (workloads/streaming.py's Stream) through
RankStream: the same positions read in stream order. The arithmetic is plan.rank_runs (pure); this is its
torch side."""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from sweeper.permutation import Permutation, epoch_seed
from sweeper.plan import GridPoint, rank_runs

__all__ = ["GlobalBatchSampler", "RankStream", "rank_share", "epoch_seed", "epoch_order", "indices_at"]

# Positions mapped through the permutation per numpy call: large enough that numpy's per-call cost
# vanishes (~1 % at this size), small enough that the chunk's arrays stay a few MiB whatever the dataset.
CHUNK_POSITIONS = 1 << 16


class GlobalBatchSampler(Sampler[int]):
    """The indices one rank trains on, `steps` optimizer steps long, in micro-batch order.

    Every micro-batch it yields is full and every rank yields the same number of indices, so no
    worker ever sees a short or empty last batch (seed 002: how BatchNorm statistics turn NaN), and
    the global batch at step k is the same samples whatever the (micro, accumulation, workers)
    layout. Each epoch is a fresh permutation seeded by (seed, epoch), as DistributedSampler does,
    computed on demand: memory per rank is one chunk of indices, whatever `num_samples`.
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
        starts: List[int] = []
        micro = self.point.micro_batch_size
        for first, _ in rank_runs(0, self.steps, self.point, self.rank, self.start_sample):
            starts.append(first)
            if len(starts) * micro >= CHUNK_POSITIONS:
                yield from self._indices(starts)
                starts = []
        if starts:
            yield from self._indices(starts)

    def _indices(self, starts: List[int]) -> List[int]:
        """The dataset indices of the micro-batches beginning at stream positions `starts`, in order."""
        positions = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.point.micro_batch_size)
        return indices_at(self.num_samples, self.seed, positions.reshape(-1)).tolist()


def epoch_order(num_samples: int, seed: int, epoch: int) -> Permutation:
    """Epoch `epoch`'s sample order of replicate `seed`: position i of the epoch is sample order[i]."""
    return Permutation(num_samples, epoch_seed(seed, epoch))


def indices_at(num_samples: int, seed: int, positions: np.ndarray) -> np.ndarray:
    """The dataset index at each stream position (epoch e's position i is epoch_order(e)[i])."""
    epochs, within = np.divmod(np.asarray(positions, dtype=np.int64), num_samples)
    out = np.empty_like(within)
    for epoch in np.unique(epochs).tolist():
        chosen = epochs == epoch
        out[chosen] = epoch_order(num_samples, seed, epoch)[within[chosen]]
    return out


def rank_share(train: Dataset, point: GridPoint, rank: int, steps: int, seed: int,
               start_sample: int = 0) -> Tuple[Dataset, Optional[Sampler]]:
    """(dataset, sampler) of what rank `rank` trains on for `steps` steps from `start_sample`, for torch's
    DataLoader at batch size micro_batch_size: a streamed train set's RankStream (no sampler), else the
    dataset and its GlobalBatchSampler."""
    if isinstance(train, IterableDataset):
        return RankStream(train, point, rank, steps, seed, start_sample), None
    return train, GlobalBatchSampler(len(train), point, rank, steps, seed, start_sample)


class _Cursor:
    """Reads one stream forward, position by position (each position at least the last one)."""

    def __init__(self, stream: Any, seed: int):
        self.stream, self.seed = stream, seed
        self.size = len(stream)
        self.epoch: Optional[int] = None
        self.slot, self.position = 0, 0  # the shard open (its place in the epoch's order), the next position
        self.samples: Iterator[Any] = iter(())
        self.known = stream.lengths is not None  # each shard's length: a position's shard is found, not read to
        self.order: List[int] = []
        self.offsets: List[int] = []  # where each shard of the epoch's order begins, and the epoch's end

    def at(self, position: int) -> Any:
        """The sample at stream `position`, decoded."""
        epoch, within = divmod(position, self.size)
        if epoch != self.epoch or within < self.position:
            self.epoch, self.order = epoch, self.stream.epoch_shards(self.seed, epoch)
            self._open(0, 0)
            if self.known:
                self.offsets = [0, *itertools.accumulate(self.stream.lengths[i] for i in self.order)]
        if self.known and within >= self.offsets[self.slot + 1]:
            slot = bisect.bisect_right(self.offsets, within) - 1  # the shards between are skipped unread
            self._open(slot, self.offsets[slot])
        while self.position < within:
            self._next()
        sample = self._next()
        return self.stream.decoded(sample)

    def _open(self, slot: int, position: int) -> None:
        self.slot, self.position = slot, position
        self.samples = self.stream.read_shard(self.order[slot], self.seed, self.epoch)

    def _next(self) -> Any:
        while True:
            sample = next(self.samples, _END)
            if sample is not _END:
                self.position += 1
                return sample
            self._shard_ended()

    def _shard_ended(self) -> None:
        shard = self.stream.shards[self.order[self.slot]]
        if self.known and self.position < self.offsets[self.slot + 1]:
            raise ValueError(f"stream shard {shard!r} ended after {self.position - self.offsets[self.slot]} samples, "
                             f"short of its length {self.stream.lengths[self.order[self.slot]]}: fix the lengths "
                             "given, or leave them out to count them (a dataset that splits itself across "
                             "DataLoader workers yields part of a shard in each: yield it whole, sweeper splits it)")
        if self.slot + 1 >= len(self.order):
            raise ValueError(f"the stream ended after {self.position} samples of an epoch of {self.size} "
                             "(data.stream_samples): set data.stream_samples to at most what it holds")
        self._open(self.slot + 1, self.position)


_END = object()


class RankStream(IterableDataset):
    """The samples one rank trains on from a Stream, `steps` optimizer steps from `start_sample` on, in
    micro-batch order: plan.rank_runs' positions read in stream order. Under a DataLoader with loader
    workers, worker j yields this rank's micro-batches j, j + workers, ...: torch's DataLoader takes one
    batch from each worker in turn, so the batches arrive in the rank's order whatever the worker count."""

    def __init__(self, stream: Any, point: GridPoint, rank: int, steps: int, seed: int, start_sample: int = 0):
        self.stream, self.point, self.rank = stream, point, rank
        self.steps, self.seed, self.start_sample = steps, seed, start_sample

    def __len__(self) -> int:
        return self.steps * self.point.micro_batch_size * self.point.accumulation_steps

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        runs = rank_runs(0, self.steps, self.point, self.rank, self.start_sample)
        cursor = _Cursor(self.stream, self.seed)
        for first, length in itertools.islice(runs, worker, None, workers):
            for position in range(first, first + length):
                yield cursor.at(position)


