"""Training-step memory predicted on fake tensors, before anything runs: per grid point (checked against
what the points measure) and the frontier under any budget, e.g. an 80 GB card from a laptop.

`python -m sweeper.estimate [overrides]` (sweeper/estimate.py) prints these for a sweep's config.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

from sweeper import recipe
from sweeper.config import OptimConfig, SweeperConfig
from sweeper.measure import frontier, memory, sharded_memory
from sweeper.plan import GridPoint
from sweeper.workloads import models

# Where the activation slope is fitted: two fake-tensor steps, as scripts/bench_sharding.py fits it.
SLOPE_MICRO_BATCHES = (2, 4)


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


def activation_slope(cfg: SweeperConfig, num_classes: int, precision: str = "fp32", checkpointing: str = "none"
                     ) -> Tuple[float, float]:
    """(bytes per sample, bytes at no sample) of what forward keeps for backward in this recipe, fitted through
    two fake-tensor steps (memory.estimate_step's forward_activations_bytes at SLOPE_MICRO_BATCHES)."""
    small, large = SLOPE_MICRO_BATCHES
    kept = [memory.estimate_step(lambda: models.build(cfg.model, num_classes), models.samples(cfg.model, num_classes),
                                 m, optim=cfg.optim, precision=precision, checkpointing=checkpointing,
                                 checkpoint_modules=cfg.model.checkpoint_modules).forward_activations_bytes
            for m in (small, large)]
    per_sample = (kept[1] - kept[0]) / (large - small)
    return per_sample, max(kept[0] - per_sample * small, 0.0)


def state_values_per_param(optim: OptimConfig) -> Optional[int]:
    """Optimizer-state values per parameter value (AdamW's two moments, SGD's momentum); None for an optimizer
    of your own (not predicted)."""
    if optim._target_:
        return None
    if optim.name in ("adam", "adamw"):
        return 2
    return 1 if optim.momentum else 0


def sharded_predictions(cfg: SweeperConfig, points: Iterable[GridPoint], num_classes: int
                        ) -> Dict[GridPoint, sharded_memory.Prediction]:
    """Each point's peak per worker under its parallelism (measure.sharded_memory.peak): the model's units from
    its parameter shapes on the meta device, the activation slope fitted once per recipe; nothing for an
    optimizer of your own."""
    values = state_values_per_param(cfg.optim)
    if values is None:
        return {}
    model = models.build_on_meta(cfg.model, num_classes)
    units = sharded_memory.units_of(model, recipe.blocks(model, cfg.model.checkpoint_modules))
    slopes: Dict[Tuple[str, str], Tuple[float, float]] = {}
    out: Dict[GridPoint, sharded_memory.Prediction] = {}
    for point in points:
        if point.recipe not in slopes:
            slopes[point.recipe] = activation_slope(cfg, num_classes, *point.recipe)
        per_sample, fixed = slopes[point.recipe]
        out[point] = sharded_memory.peak(
            units, point.parallelism, point.num_workers, point.micro_batch_size, point.accumulation_steps,
            per_sample, fixed, gather_bytes_per_value=2 if point.precision != "fp32" else None,
            state_values_per_param=values)
    return out
