"""Training-step memory predicted on fake tensors, before anything runs: per grid point (checked against
what the trials measure) and the frontier under any budget, e.g. an 80 GB card from a laptop.

`python -m sweeper.estimate [overrides]` takes the sweep's own config and prints the answer.
"""

from __future__ import annotations

import sys
from typing import Dict, Iterable, List, Optional, Tuple

from sweeper import frontier, memory, models
from sweeper.config import SweeperConfig, budget_bytes, first_line
from sweeper.plan import GridPoint


def step_peak(cfg: SweeperConfig, num_classes: int, micro_batch_size: int, accumulation_steps: int = 1,
              num_workers: int = 1) -> int:
    """The tracked peak of one steady-state step (memory.estimate_step) for this config's model."""
    return memory.estimate_step(
        lambda: models.build(cfg.model, num_classes),
        cfg.model.input_shape,
        num_classes,
        micro_batch_size,
        accumulation_steps,
        num_workers,
        momentum=cfg.train.momentum,
        weight_decay=cfg.train.weight_decay,
    ).peak_bytes


def point_estimates(cfg: SweeperConfig, points: Iterable[GridPoint], num_classes: int) -> Dict[GridPoint, int]:
    """Each point's estimated peak. Points that differ only in how many accumulation steps (beyond one)
    or workers (beyond one) they have hold the same tensors at the peak, so they share one trace."""
    cache: Dict[Tuple[int, bool, bool], int] = {}
    out: Dict[GridPoint, int] = {}
    for point in points:
        key = (point.micro_batch_size, point.accumulation_steps > 1, point.num_workers > 1)
        if key not in cache:
            accumulation, workers = (2 if key[1] else 1), (2 if key[2] else 1)
            cache[key] = step_peak(cfg, num_classes, point.micro_batch_size, accumulation, workers)
        out[point] = cache[key]
    return out


def predicted_frontier(
    cfg: SweeperConfig, num_classes: int, num_workers: int, budget: int, accumulation_steps: int = 1
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
        search.record(size, step_peak(cfg, num_classes, size, accumulation_steps, num_workers))
    return search.result()


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def report_lines(cfg: SweeperConfig, num_classes: int) -> List[str]:
    budget = budget_bytes(cfg.device)
    lines = [
        f"Estimated on fake tensors (nothing allocated or run): model {cfg.model.name}, input "
        f"{list(cfg.model.input_shape)}, {num_classes} classes, fp32, SGD (momentum {cfg.train.momentum:g}).",
        "Tensor memory only: add the CUDA context (~0.3-1 GiB), cuDNN/cuBLAS workspaces and allocator slack.",
    ]
    if budget is not None:
        for workers in sorted(set(cfg.sweep.num_workers)):
            found = predicted_frontier(cfg, num_classes, workers, budget)
            line = found.model
            fit_text = f" (peak = {_mib(line.fixed_bytes)} + {line.per_sample_bytes / 1024:,.1f} KiB x micro-batch)" \
                if line else ""
            accumulating = predicted_frontier(cfg, num_classes, workers, budget, accumulation_steps=2)
            lines.append(
                f"Budget {cfg.device.memory_budget_gb:g} GiB, {workers} worker(s): largest micro-batch "
                f"{found.micro_batch_size}{fit_text}; {accumulating.micro_batch_size} with gradient accumulation"
            )
    sizes = cfg.sweep.micro_batch_sizes
    if isinstance(sizes, str):
        return lines
    points = [GridPoint(int(m), int(a), int(w)) for m in sizes for a in cfg.sweep.accumulation_steps
              for w in cfg.sweep.num_workers]
    lines.append(f"{'point':<22}{'estimated peak':>18}{'fits' if budget else '':>8}")
    for point, peak in point_estimates(cfg, points, num_classes).items():
        fits = ("yes" if peak <= budget else "no") if budget is not None else ""
        lines.append(f"{point.key:<22}{_mib(peak):>18}{fits:>8}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    from hydra import compose, initialize_config_module

    from sweeper import config
    from sweeper.config import ConfigError, load

    config.register()
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        with initialize_config_module(config_module="sweeper.conf", version_base="1.3"):
            cfg = load(compose(config_name="config", overrides=overrides))
        problems = models.check(cfg.model)
        if problems:
            raise ConfigError(problems)
        for line in report_lines(cfg, cfg.data.num_classes):
            print(line)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - Hydra/OmegaConf reject a bad override with their own types
        if type(exc).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
