"""Which parallelism a point measured (plan.PARALLELISMS), as the report reads it: the point's own record when
it has one, else its key's suffix after the worker count (`mb4-acc2-w2-zero3`); a point from before the
axis measured DDP. Pure (stdlib)."""

from __future__ import annotations

import re
from typing import Any

from sweeper.plan import DEFAULT_PARALLELISM as DEFAULT, PARALLELISMS

_KEY = re.compile(rf"-w\d+-({'|'.join(p for p in PARALLELISMS if p != DEFAULT)})(?=-|$)")


def of(trial: Any) -> str:
    """The parallelism of a Trial (or anything with `key` and, once recorded, `parallelism`)."""
    recorded = getattr(trial, "parallelism", None)
    if recorded not in (None, "", "None"):
        return str(recorded)
    found = _KEY.search(str(getattr(trial, "key", "")))
    return found.group(1) if found else DEFAULT
