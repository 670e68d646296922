"""Writes the tracking store could not take, kept on local disk until it can: nothing measured is lost
to a tracking server that went away. Standard library only; the Tracker (write.py) decides what to write.

One JSON line per write (its kind and its arguments), in a file per sweep beside the store. Writes
are replayed in order at the end of the sweep and when it is resumed; what still fails stays.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

# After a failed write, later writes go straight to the journal for this long instead of each
# waiting out the client's own timeout and retries against a store that is down.
BACKOFF_SECONDS = 30.0


class Journal:
    """The sweep's pending writes in `<folder>/<sweep run id>.jsonl`."""

    def __init__(self, folder: str, run_id: str, clock: Callable[[], float] = time.monotonic):
        self.path = os.path.join(folder, f"{run_id}.jsonl")
        self._clock = clock
        self._down_since: Optional[float] = None
        self.last_error: Optional[str] = None

    @property
    def pending(self) -> int:
        return sum(1 for _ in self._entries())

    def write(self, kind: str, args: Dict[str, Any], attempt: Callable[[], Any]) -> Tuple[bool, Any]:
        """Try `attempt()` (unless the store failed less than BACKOFF_SECONDS ago); on failure keep
        (kind, args) in the journal. Returns (written to the store, what attempt returned)."""
        if self._down_since is not None and self._clock() - self._down_since < BACKOFF_SECONDS:
            self._keep(kind, args)
            return False, None
        try:
            value = attempt()
        except Exception as exc:  # noqa: BLE001 - any store failure: keep the write, go on measuring
            self._down_since = self._clock()
            self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self._keep(kind, args)
            return False, None
        self._down_since = None
        return True, value

    def replay(self, apply: Callable[[str, Dict[str, Any]], Any]) -> Tuple[int, int]:
        """Apply every kept write in order; keep the ones that fail again (and every one after the
        first failure, so order is kept). Returns (replayed, still pending)."""
        entries = list(self._entries())
        done = 0
        for kind, args in entries:
            try:
                apply(kind, args)
            except Exception as exc:  # noqa: BLE001 - the store is still down: keep the rest
                self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            done += 1
        self._rewrite(entries[done:])
        if done == len(entries):
            self._down_since = None
        return done, len(entries) - done

    def _keep(self, kind: str, args: Dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, "args": args}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _entries(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the line a killed driver was writing: its write was never acknowledged
                yield entry["kind"], entry["args"]

    def _rewrite(self, entries: List[Tuple[str, Dict[str, Any]]]) -> None:
        if not entries:
            if os.path.exists(self.path):
                os.remove(self.path)
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            for kind, args in entries:
                f.write(json.dumps({"kind": kind, "args": args}, default=str) + "\n")
        os.replace(tmp, self.path)
