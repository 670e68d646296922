"""Training-step memory predicted on fake tensors, before anything runs: per grid point (checked against
what the points measure) and the frontier under any budget, e.g. an 80 GB card from a laptop.

`python -m sweeper.estimate [overrides]` (sweeper/estimate.py) prints these for a sweep's config.
"""

from __future__ import annotations

from typing import Dict, Iterable, Tuple

from sweeper.config import SweeperConfig
from sweeper.measure import frontier, memory
from sweeper.plan import GridPoint
from sweeper.workloads import models


def step_peak(cfg: SweeperConfig, num_classes: int, micro_batch_size: int, accumulation_steps: int = 1,
              num_workers: int = 1, precision: str = "fp32", checkpointing: str = "none") -> int:
    """The tracked peak of one steady-state step (memory.estimate_step) for this config's model and
    recipe."""
    return memory.estimate_step(
        lambda: models.build(cfg.model, num_classes),
        models.samples(cfg.model, num_classes),
        micro_batch_size,
        accumulation_steps,
        num_workers,
        optim=cfg.optim,
        precision=precision,
        checkpointing=checkpointing,
        checkpoint_modules=cfg.model.checkpoint_modules,
    ).peak_bytes


def point_estimates(cfg: SweeperConfig, points: Iterable[GridPoint], num_classes: int) -> Dict[GridPoint, int]:
    """Each point's estimated peak. Points that differ only in how many accumulation steps (beyond one)
    or workers (beyond one) they have hold the same tensors at the peak, so they share one trace."""
    cache: Dict[Tuple[int, bool, bool, str, str], int] = {}
    out: Dict[GridPoint, int] = {}
    for point in points:
        key = (point.micro_batch_size, point.accumulation_steps > 1, point.num_workers > 1, *point.recipe)
        if key not in cache:
            accumulation, workers = (2 if key[1] else 1), (2 if key[2] else 1)
            cache[key] = step_peak(cfg, num_classes, point.micro_batch_size, accumulation, workers, *point.recipe)
        out[point] = cache[key]
    return out


def predicted_frontier(
    cfg: SweeperConfig, num_classes: int, num_workers: int, budget: int, accumulation_steps: int = 1,
    precision: str = "fp32", checkpointing: str = "none",
) -> frontier.Frontier:
    """The frontier search of `sweep.micro_batch_sizes=auto`, with every probe a fake-tensor trace."""
    search = frontier.FrontierSearch(
        budget_bytes=budget,
        first_probe=cfg.frontier.first_probe,
        growth=cfg.frontier.growth,
        max_fit_probes=cfg.frontier.max_fit_probes,
        max_verifications=cfg.frontier.max_verifications,
        multiple_of=cfg.frontier.multiple_of,
    )
    while (size := search.next_size()) is not None:
        peak = step_peak(cfg, num_classes, size, accumulation_steps, num_workers, precision, checkpointing)
        search.record(size, peak)
    return search.result()
