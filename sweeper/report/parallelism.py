"""Which parallelism a point measured (ddp, zero2, zero3), as the report reads it: the point's own record
when it has one, else its key's suffix after the worker count (`mb4-acc2-w2-zero3`); a point from before the
axis measured DDP. Pure (stdlib)."""

from __future__ import annotations

import re
from typing import Any

DEFAULT = "ddp"
_KEY = re.compile(r"-w\d+-(zero2|zero3)(?=-|$)")


def of(trial: Any) -> str:
    """The parallelism of a Trial (or anything with `key` and, once recorded, `parallelism`)."""
    recorded = getattr(trial, "parallelism", None)
    if recorded not in (None, "", "None"):
        return str(recorded)
    found = _KEY.search(str(getattr(trial, "key", "")))
    return found.group(1) if found else DEFAULT
