"""What a user is told when something is wrong, and how a failure is recognised: one home for each.

Standard library only: the driver imports this before torch or Ray.
"""

from __future__ import annotations

import signal
from typing import List, Tuple

# Exit statuses of `python -m sweeper` (README: "Bad input").
EXIT_OK = 0
# The sweep ran; at least one point (or a frontier search) failed, or writes the tracking store did
# not take are still pending in the journal.
EXIT_POINT_FAILED = 1
EXIT_CONFIG = 2  # bad input, found before any point ran: one `error:` line per problem
EXIT_INTERNAL = 3  # sweeper itself crashed (a bug): the sweep's run is ended FAILED
# Interrupted: 128 + the signal, as a shell reports it (130 for Ctrl-C, 143 for SIGTERM).


class ConfigError(ValueError):
    """One or more user-facing configuration problems, each naming the key, the value and the fix."""

    def __init__(self, problems: List[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the driver: the sweep stops, its record ends KILLED. A BaseException,
    like KeyboardInterrupt, so no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def first_line(exc: BaseException) -> str:
    """An exception's first non-empty line, for one-line error messages."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def last_line(text: str) -> str:
    """The last non-empty line of a traceback's text: the exception itself."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


# Out-of-memory, recognised by its text: what reaches the driver of a rank that failed alone is a
# traceback's text (Ray relays no exception object), and a CPU allocator failure is a RuntimeError.
OOM_MARKERS = (
    # torch.OutOfMemoryError's name, as a relayed traceback prints it (CUDA's caching allocator,
    # and measure.memory.SimulatedOutOfMemoryError, a subclass, on a simulated CPU budget).
    "OutOfMemoryError",
    # CUDA's allocator: "CUDA out of memory. Tried to allocate ..."; ROCm/HIP say "HIP out of memory".
    "out of memory",
    # c10's DefaultCPUAllocator: "[enforce fail at alloc_cpu.cpp] ... can't allocate memory: you tried to
    # allocate N bytes" (a RuntimeError: the host ran out).
    "can't allocate memory",
)


def is_oom_text(text: str) -> bool:
    return any(marker in text for marker in OOM_MARKERS)


def is_oom(exc: BaseException) -> bool:
    """A real or simulated out-of-memory error: torch.OutOfMemoryError or a subclass (matched by name,
    so the driver need not import torch), or an allocator's RuntimeError recognised by its text."""
    return any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__) or is_oom_text(str(exc))


def failure(exc: BaseException) -> Tuple[str, str, bool]:
    """How a point that raised is recorded: (status oom | failed, its error line, whether the
    out-of-memory was a simulated CPU budget's rather than an allocator's)."""
    error = f"{type(exc).__name__}: {first_line(exc)}"
    if is_oom(exc):
        return "oom", error, type(exc).__name__ == "SimulatedOutOfMemoryError"
    return "failed", error, False
