"""A DataLoader of yours (your loop's, your LightningDataModule's) as the point's sample stream: its dataset,
collate_fn and loader workers, in the point's order on this rank (the GlobalBatchSampler's: every layout of one
global batch sees the same samples at the same optimizer step), in micro-batches of the point's size, full
ones only; and the micro-batches of a step loaded ahead (the memory-tracked step's, before the tracker starts:
indexing an in-memory dataset yields views of its whole storage, which the tracker would count). Knows torch
only.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Iterator

from torch.utils.data import DataLoader, IterableDataset

from sweeper.measure import telemetry
from sweeper.sampler import GlobalBatchSampler
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads import batches

# As the built-in stream's (worker.step): a loader worker that stalls raises instead of hanging the group.
LOADER_TIMEOUT_SECONDS = 300


def point_loader(loader: Any, spec: PointSpec, ctx: WorkerContext, device: telemetry.Device, what: str) -> DataLoader:
    """`loader`'s dataset in the point's order on this rank, batched by its collate_fn into the point's
    micro-batches, with its worker processes (and their init function). `what` names the loader in a problem."""
    if not isinstance(loader, DataLoader):
        raise TypeError(f"{what} is a {type(loader).__name__}, not a torch DataLoader: give the DataLoader over "
                        "your training set")
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise TypeError(f"{what}'s dataset is an IterableDataset: sweeper streams a dataset with len() and "
                        "indexing in the point's order; give a map-style dataset")
    point = spec.point
    sampler = GlobalBatchSampler(len(dataset), point, ctx.rank, spec.steps, spec.seed)
    options = dict(num_workers=loader.num_workers, worker_init_fn=loader.worker_init_fn,
                   timeout=LOADER_TIMEOUT_SECONDS if loader.num_workers > 0 else 0)
    if loader.num_workers > 0:
        options.update(prefetch_factor=loader.prefetch_factor, persistent_workers=False)
    return batches.loader(dataset, point.micro_batch_size, loader.collate_fn, sampler=sampler, drop_last=True,
                          pin_memory=device.is_cuda, **options)


class Ahead:
    """An iterator that can load some of its items before they are asked for."""

    def __init__(self, items: Iterator[Any]):
        self.items = items
        self.loaded: Deque[Any] = deque()

    def load(self, count: int) -> None:
        """Up to `count` items loaded ahead (fewer where the stream ends)."""
        while len(self.loaded) < count:
            try:
                self.loaded.append(next(self.items))
            except StopIteration:
                return

    def __iter__(self) -> "Ahead":
        return self

    def __next__(self) -> Any:
        return self.loaded.popleft() if self.loaded else next(self.items)
