"""Byte units, and the one way sweeper writes a byte count for people. Standard library only."""

from __future__ import annotations

from typing import Optional

KiB, MiB, GiB = 2**10, 2**20, 2**30
_UNITS = {"GiB": GiB, "MiB": MiB, "KiB": KiB}


def format_bytes(n: float, decimals: int = 2, unit: Optional[str] = None) -> str:
    """`n` bytes in `unit` (GiB, MiB or KiB), or in the largest unit it reaches: 158480000 ->
    "151.14 MiB" (binary units: 1 KiB = 1024 B)."""
    if unit is None:
        unit = next((name for name, size in _UNITS.items() if abs(n) >= size), "B")
    value = n / _UNITS.get(unit, 1)
    return f"{value:,.{0 if unit == 'B' else decimals}f} {unit}"
