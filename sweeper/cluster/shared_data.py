"""The data a sweep's worker groups train on, built once in the driver (workloads.datasets.built: the
check and preflight's copy) and put once into Ray's object store, from which each node fetches it once:
no worker group calls a data factory, tokenizes or reads a corpus again. Data that does not fit
(SHARE_LIMIT_BYTES pickled), cannot be pickled, or is memory-mapped files (data=tokens: each worker maps
them and the page cache shares them; pickling would copy them) is built in each worker group as before.
"""

from __future__ import annotations

import io
from typing import Any, Dict, Iterable, Optional, Tuple

import ray
from ray import cloudpickle

from sweeper.config.loop import yours
from sweeper.workloads import datasets

# What the object store holds for the sweep's length (Ray's default store is 30 % of a node's memory; each
# worker still deserializes its own copy): above this, the groups build the data themselves.
SHARE_LIMIT_BYTES = 1 << 30

# The driver's references, by Ray session and data key: alive while the sweep runs (an object lives while referenced),
# and put once however many rounds of worker groups ask. None: not shared (too large or unpicklable).
_PUT: Dict[Tuple[str, str], Optional[Any]] = {}


def shared(specs: Iterable[Any], limit_bytes: int = SHARE_LIMIT_BYTES) -> Dict[str, Any]:
    """Object references to each distinct data the `specs` train on (by datasets.key), for the worker groups
    to fetch (resolve) instead of building it; data that is not shared is left out."""
    out: Dict[str, Any] = {}
    for spec in specs:
        if yours(spec):  # your loop's data, and your LightningDataModule's, are theirs to load
            continue
        shape = list(spec.model.input_shape)
        key = datasets.key(spec.data, shape)
        held = (ray.get_runtime_context().get_job_id(), key)  # a reference lives in its Ray session only
        if held not in _PUT:
            splits = datasets.built(spec.data, shape)
            _PUT[held] = ray.put(splits) if splits.shareable and _fits(splits, limit_bytes) else None
        if _PUT[held] is not None:
            out[key] = _PUT[held]
    return out


def resolve(refs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """In a worker: the shared data by key, fetched from the object store (this node's copy when it has one)."""
    return {key: ray.get(ref) for key, ref in (refs or {}).items()}


class _TooLarge(Exception):
    pass


class _Counter(io.RawIOBase):
    """A sink that counts the bytes written into it and stops the pickling past `limit`."""

    def __init__(self, limit: int):
        self.limit, self.count = limit, 0

    def writable(self) -> bool:
        return True

    def write(self, chunk) -> int:
        self.count += len(chunk)
        if self.count > self.limit:
            raise _TooLarge
        return len(chunk)


def _fits(obj: Any, limit_bytes: int) -> bool:
    """Whether `obj` pickles (as Ray pickles it) into at most `limit_bytes`: stops at the limit, so a large
    dataset costs its first `limit_bytes` of pickling only."""
    try:
        cloudpickle.dump(obj, _Counter(limit_bytes), protocol=5)
    except _TooLarge:
        return False
    except Exception:  # noqa: BLE001 - an unpicklable dataset (an open file, a lock): each group builds its own
        return False
    return True
