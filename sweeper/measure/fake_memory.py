"""Training-step memory predicted on fake tensors, before anything runs: per grid point (checked against
what the points measure) and the frontier under any budget, e.g. an 80 GB card from a laptop.

`python -m sweeper.estimate [overrides]` (sweeper/estimate.py) prints these for a sweep's config.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from sweeper import recipe
from sweeper.config import OptimConfig, SweeperConfig
from sweeper.measure import frontier, memory, sharded_memory
from sweeper.plan import GridPoint
from sweeper.workloads import models

# Where the activation slope is fitted: two fake-tensor steps (the sweep's, and scripts/bench_sharding.py's).
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


def activation_fit(build_model: Callable[[], Any], samples: Any, optim: OptimConfig, precision: str = "fp32",
                   checkpointing: str = "none", checkpoint_modules: Sequence[str] = ()) -> Tuple[float, float]:
    """(bytes per sample, bytes at no sample) of what forward keeps for backward in this recipe, fitted through
    two fake-tensor steps of the unsharded model in one process (memory.estimate_step's
    forward_activations_bytes at SLOPE_MICRO_BATCHES): what the sweep fits before launch, and the bench too."""
    small, large = SLOPE_MICRO_BATCHES
    kept = [memory.estimate_step(build_model, samples, m, optim=optim, precision=precision,
                                 checkpointing=checkpointing, checkpoint_modules=checkpoint_modules
                                 ).forward_activations_bytes for m in (small, large)]
    per_sample = (kept[1] - kept[0]) / (large - small)
    return per_sample, max(kept[0] - per_sample * small, 0.0)


def activation_slope(cfg: SweeperConfig, num_classes: int, precision: str = "fp32", checkpointing: str = "none"
                     ) -> Tuple[float, float]:
    """activation_fit for this config's model and recipe."""
    return activation_fit(lambda: models.build(cfg.model, num_classes), models.samples(cfg.model, num_classes),
                          cfg.optim, precision, checkpointing, cfg.model.checkpoint_modules)


# The probe tensors of optimizer_cost: a large tensor, a small one, then a large one of two sizes, so a cost per
# element and one per largest tensor come apart (a single-tensor step holds the previous tensor's temporary while
# it makes the next one's: the small one between keeps that out of the fit); 64 KiB a large tensor, so CUDA's
# 512-byte rounding is below 1 %.
PROBE_VALUES, PROBE_SMALL_VALUES = 2 ** 14, 16


def optimizer_cost(optim: OptimConfig, device_type: str = "cpu") -> Optional[sharded_memory.OptimizerCost]:
    """The optimizer's state and step temporaries per parameter element (sharded_memory.OptimizerCost), measured
    once on fake tensors on `device_type` (its step there: CUDA's foreach, the CPU's single-tensor loop): built
    with optim's factory (yours too) on tensors of n, a few and n, then n, a few and 3n elements, stepped once,
    then a step tracked (MemTracker). None when it cannot be measured (the factory refuses fake tensors)."""
    n, small = PROBE_VALUES, PROBE_SMALL_VALUES
    try:
        (state_a, temps_a), (state_b, temps_b) = (_optimizer_probe(optim, device_type, sizes)
                                                  for sizes in ((n, small, n), (n, small, 3 * n)))
    except Exception:  # noqa: BLE001 - a user's factory may not build on fake tensors: no prediction, not a failure
        return None
    per_value = (state_b - state_a) / (2 * n)
    per_largest = max(0.0, (temps_b - 2 * temps_a) / n)
    return sharded_memory.OptimizerCost(
        state_bytes_per_value=per_value,
        state_bytes_per_tensor=max(0.0, (state_a - (2 * n + small) * per_value) / 3),
        step_bytes_per_value=max(0.0, (temps_a - per_largest * n) / (2 * n)), step_bytes_per_largest_value=per_largest)


def _optimizer_probe(optim: OptimConfig, device_type: str, sizes: Sequence[int]) -> Tuple[int, int]:
    """(state bytes on the device, the step's temporaries) of one optimizer over fp32 parameters of `sizes`."""
    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.optim import optimizer as optimizers

    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    # torch.optim picks its foreach step for plain tensors on CUDA only (_default_to_fused_or_foreach reads the
    # tensor type from this private list): a fake tensor stands for a real one here, as it does for its memory.
    optimizers._foreach_supported_types.append(FakeTensor)
    try:
        with torch.random.fork_rng(devices=[]), FakeTensorMode():
            params = nn.ParameterList(nn.Parameter(torch.zeros(size, device=device)) for size in sizes)
            optimizer = recipe.build_optimizer(optim, params.parameters(), lr=1e-3)

            def fill() -> None:
                for p in params:
                    p.grad = torch.ones_like(p)

            fill()
            optimizer.step()
            fill()
            breakdown = memory.track_step(params, optimizer, optimizer.step, device)
            held = [t for state in optimizer.state.values() for t in state.values()
                    if isinstance(t, torch.Tensor) and t.device.type == device.type]
            state = sum(_tracked(t, device) for t in held)
            before = state + sum(_tracked(p, device) + _tracked(p.grad, device) for p in params)
    finally:
        optimizers._foreach_supported_types.remove(FakeTensor)
    return state, max(0, breakdown.optimizer_peak_bytes - before)


def _tracked(tensor: Any, device: Any) -> int:
    """A tensor's bytes as MemTracker counts them (CUDA rounds each storage up to 512 bytes)."""
    size = tensor.numel() * tensor.element_size()
    return -(-size // 512) * 512 if device.type == "cuda" else size


def sharded_predictions(cfg: SweeperConfig, points: Iterable[GridPoint], num_classes: int, device_type: str = "cpu"
                        ) -> Dict[GridPoint, sharded_memory.Prediction]:
    """Each point's peak per worker under its parallelism and gradient sync (measure.sharded_memory.peak): the
    model's units from its parameter shapes on the meta device, the activation slope fitted once per recipe, the
    optimizer's cost measured once (yours too; nothing when it cannot be), CUDA's margin on a CUDA worker."""
    optimizer = optimizer_cost(cfg.optim, device_type)
    if optimizer is None:
        return {}
    units = model_units(cfg, num_classes)
    slopes: Dict[Tuple[str, str], Tuple[float, float]] = {}
    out: Dict[GridPoint, sharded_memory.Prediction] = {}
    for point in points:
        if point.recipe not in slopes:
            slopes[point.recipe] = activation_slope(cfg, num_classes, *point.recipe)
        per_sample, fixed = slopes[point.recipe]
        out[point] = sharded_memory.peak(
            units, point.parallelism, point.num_workers, point.micro_batch_size, point.accumulation_steps,
            per_sample, fixed, gather_bytes_per_value=2 if point.precision != "fp32" else None,
            optimizer=optimizer, gradient_sync=point.gradient_sync, margin=sharded_memory.margin_for(device_type))
    return out


def model_units(cfg: SweeperConfig, num_classes: int) -> List[sharded_memory.Unit]:
    """The units sharding wraps, from the model's parameter shapes on the meta device (nothing allocated)."""
    model = models.build_on_meta(cfg.model, num_classes)
    return sharded_memory.units_of(model, recipe.blocks(model, cfg.model.checkpoint_modules))
