"""Streamed training data (an IterableDataset: your own over shard files, Hugging Face `datasets` in
streaming mode, webdataset tar shards): one deterministic sequence of samples per epoch, cut by
plan.rank_runs exactly as a map-style dataset's permutation is, so every layout of one global batch sees
the same samples at the same optimizer step, by position and not by chance. docs/data.md.

The sequence of epoch e: the shards in an order seeded by (seed, e), each read in its own order through
an optional shuffle buffer seeded by (seed, e, shard). Stream position p is sample p mod N of epoch
p div N (N: the samples per epoch). A rank's reader is sampler.RankStream. Knows torch (and numpy);
`datasets` and `webdataset` are imported only where used.
"""

from __future__ import annotations

import glob
import itertools
import os
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from sweeper.permutation import epoch_seed

__all__ = ["Stream", "as_stream", "is_stream", "webdataset_folder", "materialize"]


class Stream(IterableDataset):
    """A dataset read in shards: `shards` (paths, or any handle `read` takes), `read(shard)` the samples
    of one shard in its order, `lengths` each shard's samples (None: unknown; `counted()` reads them once).
    Each epoch reads the shards in a seeded order (`shuffle_shards`) and each shard through a seeded
    shuffle buffer of `shuffle_buffer` samples (0: the shard's own order). `decode(sample)` runs on the
    samples a rank keeps only (a tar record's bytes into tensors): those it passes over cost their reading.
    `samples`: the samples per epoch, when the lengths are unknown or to use the first part of each epoch.
    Iterated on its own, it yields every sample of every shard in the order given, decoded."""

    def __init__(self, shards: Sequence[Any], read: Callable[[Any], Iterable[Any]],
                 lengths: Optional[Sequence[int]] = None, shuffle_shards: bool = True, shuffle_buffer: int = 0,
                 decode: Optional[Callable[[Any], Any]] = None, samples: Optional[int] = None):
        if not shards:
            raise ValueError("a stream needs at least one shard")
        if lengths is not None and len(lengths) != len(shards):
            raise ValueError(f"{len(lengths)} shard lengths for {len(shards)} shards")
        self.shards, self.read = list(shards), read
        self.lengths = None if lengths is None else [int(n) for n in lengths]
        self.shuffle_shards, self.shuffle_buffer = shuffle_shards, int(shuffle_buffer)
        self.decode, self.samples = decode, samples

    def __len__(self) -> int:
        """The samples per epoch."""
        if self.samples is not None:
            return int(self.samples)
        if self.lengths is None:
            raise TypeError("this stream's length is unknown: count it (Stream.counted) or set data.stream_samples")
        return sum(self.lengths)

    def __iter__(self) -> Iterator[Any]:
        for shard in self.shards:
            yield from map(self.decoded, self.read(shard))

    def counted(self) -> "Stream":
        """The stream with every shard's length, read once (nothing decoded) when not known."""
        if self.lengths is not None:
            return self
        lengths = [sum(1 for _ in self.read(shard)) for shard in self.shards]
        return Stream(self.shards, self.read, lengths, self.shuffle_shards, self.shuffle_buffer, self.decode,
                      self.samples)

    def epoch_shards(self, seed: int, epoch: int) -> List[int]:
        """The shards' order in epoch `epoch` of replicate `seed` (indices into `shards`)."""
        if not self.shuffle_shards:
            return list(range(len(self.shards)))
        return np.random.default_rng(epoch_seed(seed, epoch)).permutation(len(self.shards)).tolist()

    def read_shard(self, index: int, seed: int, epoch: int) -> Iterator[Any]:
        """Shard `index`'s samples in epoch `epoch`'s order (through its shuffle buffer), not decoded."""
        samples = iter(self.read(self.shards[index]))
        if self.shuffle_buffer <= 1:
            return samples
        return _buffered(samples, self.shuffle_buffer, np.random.default_rng([epoch_seed(seed, epoch), index]))

    def decoded(self, sample: Any) -> Any:
        """`sample` as training takes it (through `decode`, when given)."""
        return sample if self.decode is None else self.decode(sample)


def _buffered(samples: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
    """A shuffle buffer (webdataset's and tf.data's): fill `size` samples, then each new one takes the place
    of one drawn at random; the rest drawn at the end. Seeded per shard and read from the shard's start, so
    every reader of the shard sees the same order."""
    buffer = list(itertools.islice(samples, size))
    for sample in samples:
        slot = int(rng.integers(len(buffer)))
        yield buffer[slot]
        buffer[slot] = sample
    for slot in rng.permutation(len(buffer)).tolist():
        yield buffer[slot]


def is_stream(dataset: Any) -> bool:
    """Whether `dataset` is read as a stream (an IterableDataset) rather than indexed."""
    return isinstance(dataset, IterableDataset)


def as_stream(dataset: Any, samples: Optional[int] = None, decode: Optional[Callable[[Any], Any]] = None,
              shuffle_buffer: int = 0) -> Stream:
    """Any IterableDataset as a Stream: a Stream as it is; one that lists its shards (attributes `shards` and
    `read_shard(shard)`, optionally `shard_lengths`) shard by shard; a Hugging Face IterableDataset by its
    shards (its data files: n_shards, shard()); any other as one shard in its own order (a run continued
    from a checkpoint then reads forward to its position). `samples`: data.stream_samples."""
    if isinstance(dataset, Stream):
        if samples is not None and dataset.samples is None:
            dataset.samples = samples
        return dataset
    if hasattr(dataset, "shards") and callable(getattr(dataset, "read_shard", None)):
        return Stream(list(dataset.shards), dataset.read_shard, getattr(dataset, "shard_lengths", None),
                      decode=decode, shuffle_buffer=shuffle_buffer, samples=samples)
    if hasattr(dataset, "n_shards") and callable(getattr(dataset, "shard", None)):  # Hugging Face datasets
        return Stream(list(range(dataset.n_shards)), _HuggingFaceShards(dataset), decode=decode,
                      shuffle_buffer=shuffle_buffer, samples=samples)
    lengths = [len(dataset)] if hasattr(dataset, "__len__") else None
    return Stream([0], _Whole(dataset), lengths, shuffle_shards=False, decode=decode, shuffle_buffer=shuffle_buffer,
                  samples=samples)


class _Whole:
    """One shard: the whole iterable in its own order."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __call__(self, _shard: Any) -> Iterable[Any]:
        return iter(self.dataset)


class _HuggingFaceShards:
    """Shard i of a Hugging Face IterableDataset (its i-th data file, for one loaded from files), its rows one
    by one. Through `.iter()`: its `__iter__` in a DataLoader worker would keep only that worker's share of
    the shards, which is this module's to decide."""

    BATCH = 256

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __call__(self, index: int) -> Iterator[Any]:
        shard = self.dataset.shard(num_shards=self.dataset.n_shards, index=index, contiguous=True)
        for batch in shard.iter(batch_size=self.BATCH):
            columns = list(batch)
            for row in zip(*(batch[c] for c in columns)):
                yield dict(zip(columns, row))


def webdataset_folder(folder: str, decode: Optional[Callable[[Any], Any]] = None, shuffle_buffer: int = 0,
                      lengths: Optional[Sequence[int]] = None) -> Stream:
    """webdataset tar shards in `folder` (every *.tar, sorted by name) as a Stream; a sample is webdataset's
    dict of one key's files ({"__key__": ..., "cls": bytes, ...}), turned into (input, label) by `decode`."""
    shards = sorted(glob.glob(os.path.join(folder, "*.tar")))
    if not shards:
        raise ValueError(f"{folder!r} holds no .tar shards")
    return Stream(shards, _tar_samples, lengths, decode=decode, shuffle_buffer=shuffle_buffer)


def _tar_samples(path: str) -> Iterator[Any]:
    # webdataset's own tar reading (files grouped by key), without its WebDataset pipeline, which would
    # split the shards across loader workers itself.
    from webdataset.tariterators import tarfile_samples

    return iter(tarfile_samples([{"url": path}]))


class _Listed(Dataset):
    def __init__(self, samples: List[Any]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return self.samples[index]


def materialize(dataset: Any) -> Dataset:
    """A held-out split given as a stream, read once into memory (the evaluation indexes it: validation
    sets are small); a map-style one as it is."""
    if not is_stream(dataset):
        return dataset
    return _Listed(list(as_stream(dataset)))
