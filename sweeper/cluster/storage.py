"""Where training-state checkpoints live (train.save_state, smart's rungs, a branch sweep's trunk): a folder, or
a URI of storage every node reads, as Ray Train's RunConfig.storage_path takes it (s3://bucket/path,
gs://bucket/path, an NFS mount, file:///path). Workers always write and read a local folder
(sweeper/worker/state.py stays Ray- and network-free); this module moves folders to and from a URI with
pyarrow's filesystems, the layer Ray Train persists its own checkpoints through, and reads a checkpoint back
as a ray.train.Checkpoint.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import uuid
from typing import Dict, Optional


def is_uri(path: Optional[str]) -> bool:
    return bool(path) and "://" in str(path)


def root(storage_path: Optional[str], results_dir: str, sweep: str) -> str:
    """A sweep's checkpoint root: <cluster.storage_path>/<sweep>, or <results_dir>/<sweep> by default."""
    return join(storage_path or results_dir, sweep)


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if is_uri(base) else os.path.join(base, *parts)


def _filesystem(uri: str):
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(uri)


def check(storage_path: Optional[str]) -> Optional[str]:
    """One line when cluster.storage_path cannot be written from here (a marker written and deleted), else
    None. A folder is created if missing."""
    if not storage_path:
        return None
    try:
        if is_uri(storage_path):
            fs, path = _filesystem(storage_path)
            marker = posixpath.join(path, f".sweeper-check-{uuid.uuid4().hex}")
            fs.create_dir(path, recursive=True)
            with fs.open_output_stream(marker) as f:
                f.write(b"ok")
            fs.delete_file(marker)
        else:
            os.makedirs(storage_path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=storage_path):
                pass
    except Exception as exc:  # noqa: BLE001 - pyarrow and the OS raise many kinds; the line says which
        text = str(exc).splitlines()[0] if str(exc) else ""
        return (f"cluster.storage_path={storage_path} cannot be written from here ({type(exc).__name__}: {text}): "
                "use a folder every node reads, or a URI pyarrow opens with its credentials "
                "(s3://bucket/path, gs://bucket/path)")
    return None


def upload(local: str, uri: str) -> None:
    """The folder `local` copied to `uri` (its files under it), replacing nothing else there."""
    import pyarrow.fs

    fs, path = _filesystem(uri)
    fs.create_dir(path, recursive=True)
    pyarrow.fs.copy_files(local, path, source_filesystem=pyarrow.fs.LocalFileSystem(), destination_filesystem=fs)


def fetch(uri: str, cache: Dict[str, str]) -> str:
    """A local folder holding the checkpoint at `uri`, downloaded once per process (`cache`) through Ray
    Train's Checkpoint."""
    if uri not in cache:
        from ray.train import Checkpoint

        fs, path = _filesystem(uri)
        local = tempfile.mkdtemp(prefix="sweeper-state-")
        Checkpoint(path=path, filesystem=fs).to_directory(local)
        cache[uri] = local
    return cache[uri]


def delete(path: str) -> None:
    """A checkpoint folder or root removed, whatever it holds (nothing when it is gone already)."""
    if not is_uri(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        fs, inner = _filesystem(path)
        fs.delete_dir(inner)
    except (OSError, FileNotFoundError):
        pass


class Staged:
    """A worker group's specs with their checkpoint URIs swapped for local folders (a checkpoint to start from
    downloaded once per group), and the uploads each point owes once it ends (rank 0's, which wrote them).
    Used as a context manager: its local copies go when the group's points are done."""

    def __init__(self) -> None:
        self.cache: Dict[str, str] = {}
        self._folder: Optional[str] = None  # made on first need: most groups write no checkpoint to a URI
        # point key -> ([(local, uri)], the URI of its state at its end, the URI it started from)
        self.owed: Dict[str, tuple] = {}
        self.upload_failed = False

    @property
    def folder(self) -> str:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="sweeper-staged-")
        return self._folder

    def __enter__(self) -> "Staged":
        return self

    def __exit__(self, *exc) -> None:
        # A failed upload's state stays where the point wrote it (its result names that folder).
        kept = self._folder if self.upload_failed else None
        for local in [self._folder, *self.cache.values()]:
            if local is not None and local != kept:
                shutil.rmtree(local, ignore_errors=True)
        self._folder, self.cache = None, {}

    def local(self, spec):
        from dataclasses import replace

        changes, owed = {}, []
        if is_uri(spec.start_from):
            changes["start_from"] = fetch(spec.start_from, self.cache)
        if is_uri(spec.save_state_to):
            changes["save_state_to"] = os.path.join(self.folder, spec.point.key, "end")
            owed.append((changes["save_state_to"], spec.save_state_to))
        if any(is_uri(uri) for uri in spec.save_states_at.values()):
            changes["save_states_at"] = {}
            for at, uri in spec.save_states_at.items():
                here = os.path.join(self.folder, spec.point.key, f"s{at}") if is_uri(uri) else uri
                changes["save_states_at"][at] = here
                if here != uri:
                    owed.append((here, uri))
        self.owed[spec.point.key] = (owed, spec.save_state_to if is_uri(spec.save_state_to) else None,
                                     spec.start_from if is_uri(spec.start_from) else None)
        return replace(spec, **changes) if changes else spec

    def persist(self, result) -> None:
        """Uploads what the point wrote to the URIs it was given, and names the URI in its result; a failed
        upload is the point's checkpoint_error (raising on rank 0 alone would leave the others waiting)."""
        owed, end_uri, start_uri = self.owed.get(result.trial_key, ([], None, None))
        if start_uri and result.state.continued_from:
            result.state.continued_from = start_uri  # where it came from, not this worker's copy
        try:
            for here, uri in owed:
                if os.path.isdir(here):
                    upload(here, uri)
                    shutil.rmtree(here, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError subclasses and its own
            result.state.checkpoint_error = f"upload to cluster.storage_path failed: {type(exc).__name__}: {exc}"
            self.upload_failed = True
            return
        if end_uri and result.state.saved_state_path:
            result.state.saved_state_path = end_uri
