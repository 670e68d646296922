"""Points whose input pipeline could not keep up: their step waited on the data loader for more than
DATA_BOUND_FRACTION of its time (data_wait_fraction, measure.timing), so their throughput is the loader's and
not the model's, and a faster loader could change which micro-batch is fastest. Named in the
recommendation's reason, the alternatives and a section of their own, with the loader settings to raise.
Pure (stdlib)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

# Over half the step waiting: the step waits for its data longer than it computes, so the loader sets the pace.
# Measured here at loader_workers=0 (a single CPU process loads, then computes): digits in memory with a tiny MLP
# 11-34 % of sub-millisecond steps (indexing and collating are most of such a step, yet not the bottleneck); a
# dataset that sleeps 4 ms a sample, 97-99 % (tests/unit/test_data_bound.py).
DATA_BOUND_FRACTION = 0.5

RAISE = ("data.loader_workers (processes that make batches while the step runs), data.prefetch_factor (batches "
         "each keeps ready) and, on GPU, data.pin_memory=true")


def fraction(trial: Any) -> Optional[float]:
    return getattr(trial, "data_wait_fraction", None)


def is_data_bound(trial: Any) -> bool:
    share = fraction(trial)
    return share is not None and share > DATA_BOUND_FRACTION


def marker(trial: Any) -> str:
    """The alternatives table's mark after a verdict: ' (data-bound)' or ''."""
    return " (data-bound)" if is_data_bound(trial) else ""


def winner_note(trial: Any) -> Optional[str]:
    """The recommendation's warning when its point was data-bound (None otherwise)."""
    if not is_data_bound(trial):
        return None
    return (f"It waited on its data loader for {fraction(trial):.0%} of each step (data-bound: over "
            f"{DATA_BOUND_FRACTION:.0%}), so its throughput is the loader's: raise {RAISE} and measure again, "
            "since a loader that keeps up can change which micro-batch is fastest.")


def words(trials: Sequence[Any], params: Dict[str, str]) -> str:
    """The report's section: every data-bound point with its share of the step, and the loader it ran with
    (the sweep's params); '' when none was."""
    bound = sorted((t for t in trials if is_data_bound(t)), key=lambda t: -fraction(t))
    if not bound:
        return ""
    measured = [t for t in trials if fraction(t) is not None]
    listed = ", ".join(f"{t.key} ({fraction(t):.0%})" for t in bound)
    return (f"{len(bound)} of {len(measured)} points waited on their data loader for more than "
            f"{DATA_BOUND_FRACTION:.0%} of each step (data-bound): {listed}. They ran with {_loader(params)}. "
            f"Raise {RAISE}; their throughput, and which of them is fastest, may change.")


def _loader(params: Dict[str, str]) -> str:
    parts: List[str] = []
    for key, default in (("loader_workers", "0"), ("pin_memory", "True"), ("prefetch_factor", "None")):
        value = params.get(key)
        parts.append(f"data.{key}={value if value is not None else f'{default} (not recorded: the default)'}")
    return ", ".join(parts)
