"""A frontier search's files (sweep.micro_batch_sizes=auto) beside the sweep's report: its probes and
fitted line against the budget as a PNG, every probe's numbers as JSON."""

from __future__ import annotations

import json
import os
from typing import List

from sweeper.plan import GridPoint, frontier_label
from sweeper.report import plots
from sweeper.report.trials import Trial
from sweeper.schema import FrontierResult, PointResult

# A probe's figures kept in the JSON: what it tried and what it measured of memory.
KEEP = ("trial_key", "probe_role", "micro_batch_size", "accumulation_steps", "status", "error", "peak_memory_bytes",
        "memory_tracked_peak_bytes", "memory_activations_bytes", "memory_forward_activations_bytes")


def write(sweep_folder: str, search: GridPoint, probes: List[PointResult], result: FrontierResult) -> str:
    """A frontier search (a worker count in one recipe) as files in `<sweep folder>/frontier`: its
    probes and fitted line against the budget (PNG) and every probe's numbers (JSON), named by the
    search's label (w2, w2-bf16-ckpt). Returns the folder."""
    num_workers, label = search.num_workers, frontier_label(search)
    folder = os.path.join(sweep_folder, "frontier")
    os.makedirs(folder, exist_ok=True)
    trials = [
        Trial(
            key=p.trial_key,
            micro_batch_size=int(p.micro_batch_size),
            accumulation_steps=int(p.accumulation_steps or 1),
            num_workers=num_workers,
            global_batch_size=int(p.micro_batch_size) * int(p.accumulation_steps or 1) * num_workers,
            status=p.status or "failed",
            peak_memory_bytes=p.memory.peak_memory_bytes,
        )
        for p in probes
    ]
    # One line per (accumulation) series, fitted by the plot itself over that series' probes.
    plots.memory_vs_micro_batch(
        trials, os.path.join(folder, f"memory_frontier_{label}.png"), budget_bytes=result.memory_budget_bytes,
    )
    flat = [p.to_flat() for p in probes]
    record = {"frontier": result.to_flat(), "probes": [{k: p[k] for k in KEEP if k in p} for p in flat]}
    with open(os.path.join(folder, f"frontier_{label}.json"), "w") as f:
        json.dump(record, f, indent=2, default=str)
    return folder
