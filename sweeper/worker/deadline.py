"""A point's time limit on a worker. A rank that stalls without dying (a DataLoader worker, NFS, a
GPU hang) would hold its whole group in a collective forever; past its deadline the worker process
ends itself, Ray Train restarts the group from its checkpoint of points done, and a point that ends
its group twice is recorded failed. Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional

# Before a point's warm-up has shown how fast it runs: building the model, the first steps.
STARTUP_ALLOWANCE_SECONDS = 600.0
# Past warm-up, the projection of the rest is multiplied by this and never below the floor: a noisy
# machine or a slow evaluation must not end a healthy point.
PROJECTION_FACTOR = 4.0
FLOOR_SECONDS = 300.0
EXIT_STATUS = 75  # EX_TEMPFAIL: the group may succeed when restarted


class Deadline:
    """One watchdog thread per worker process; `arm` it for each point, `project` it from the
    point's warm-up (unless the deadline is configured), `disarm` it when the point ends."""

    def __init__(self, configured_seconds: Optional[float] = None, clock: Callable[[], float] = time.monotonic,
                 on_expiry: Optional[Callable[[str], None]] = None):
        self.configured = configured_seconds
        self._clock = clock
        self._on_expiry = on_expiry or _end_process
        self._lock = threading.Lock()
        self._key: Optional[str] = None
        self._until = float("inf")
        self._limit = 0.0
        self._thread: Optional[threading.Thread] = None

    def arm(self, key: str) -> None:
        limit = self.configured if self.configured is not None else STARTUP_ALLOWANCE_SECONDS
        self._set(key, limit)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="point-deadline", daemon=True)
            self._thread.start()

    def project(self, done_steps: int, total_steps: int, elapsed_seconds: float) -> None:
        """After warm-up: the rest of the point at the pace of its first `done_steps` steps."""
        if self.configured is not None or done_steps <= 0 or self._key is None:
            return
        rest = elapsed_seconds / done_steps * (total_steps - done_steps)
        self._set(self._key, elapsed_seconds + max(FLOOR_SECONDS, PROJECTION_FACTOR * rest), since_start=True)

    def disarm(self) -> None:
        with self._lock:
            self._key, self._until = None, float("inf")

    def check(self) -> bool:
        """True (and the expiry acted on) when the armed point is past its deadline."""
        with self._lock:
            key, limit, late = self._key, self._limit, self._clock() > self._until
        if key is not None and late:
            self._on_expiry(f"point {key} passed its deadline of {limit:.0f} s")
            return True
        return False

    def _set(self, key: str, limit: float, since_start: bool = False) -> None:
        with self._lock:
            start = self._started if since_start else self._clock()
            self._key, self._limit, self._until = key, limit, start + limit
            if not since_start:
                self._started = start

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            if self.check():
                return


def _end_process(why: str) -> None:
    print(f"sweeper: {why}; ending this worker so Ray Train restarts its group", file=sys.stderr, flush=True)
    os._exit(EXIT_STATUS)
