"""`python -m sweeper.estimate [overrides]`: the memory of the sweep's config predicted on fake tensors,
printed before anything runs (the frontier under device.memory_budget_gb, each grid point's peak, and whether
even ZeRO-3 at the most workers is over the budget: data parallelism not enough).
"""

from __future__ import annotations

import sys
from typing import List, Optional

from sweeper import plan
from sweeper.config import SweeperConfig, budget_bytes
from sweeper.errors import first_line
from sweeper.driver import predicted
from sweeper.measure import sharded_memory
from sweeper.measure.fake_memory import point_estimates, predicted_frontier
from sweeper.units import format_bytes
from sweeper.workloads import models


def _mib(n: float) -> str:
    return format_bytes(n, 1, unit="MiB")


def report_lines(cfg: SweeperConfig, num_classes: int) -> List[str]:
    budget = budget_bytes(cfg.device)
    optim = cfg.optim.name if not cfg.optim._target_ else cfg.optim._target_
    lines = [
        f"Estimated on fake tensors (nothing allocated or run): model {cfg.model.name}, input "
        f"{list(cfg.model.input_shape)}, {num_classes} classes, optimizer {optim}.",
        "Tensor memory only: add the CUDA context (~0.3-1 GiB), cuDNN/cuBLAS workspaces and allocator slack.",
    ]
    recipes = [(p, c) for p in cfg.sweep.precisions for c in cfg.sweep.activation_checkpointing]
    if budget is not None and "ddp" in cfg.sweep.parallelism:
        for workers in sorted(set(cfg.sweep.num_workers)):
            for precision, checkpointing in recipes:
                lines.append(_frontier_line(cfg, num_classes, workers, budget, precision, checkpointing))
    sizes = cfg.sweep.micro_batch_sizes
    if isinstance(sizes, str):
        return lines
    points = plan.expand_grid(sizes, cfg.sweep.accumulation_steps, cfg.sweep.num_workers,
                              precisions=cfg.sweep.precisions, checkpointing=cfg.sweep.activation_checkpointing,
                              parallelisms=cfg.sweep.parallelism, gradient_syncs=cfg.sweep.gradient_sync)
    lines += _point_lines(cfg, num_classes, points, budget)
    limit = predicted.beyond_data_parallelism(cfg, points, num_classes, device=predicted.device_type(cfg))
    return lines + ([f"Data parallelism is not enough: {limit}."] if limit else [])


def _point_lines(cfg: SweeperConfig, num_classes: int, points: List[plan.GridPoint], budget: Optional[int]
                 ) -> List[str]:
    """One line per point: a DDP point's fake-tensor step, a sharded point's per-phase model
    (measure.sharded_memory: its peak phase, CUDA's margin on CUDA workers), whether it fits, and the bytes a
    worker sends per step."""
    device = predicted.device_type(cfg)
    whole = point_estimates(cfg, [p for p in points if p.parallelism == "ddp"], num_classes)
    sharded = predicted.predict(cfg, [p for p in points if p.parallelism != "ddp"], num_classes, device=device)
    sent = predicted.communication_per_step(cfg, points, num_classes)
    lines = []
    if any(p.parallelism != "ddp" for p in points):
        how = "CUDA workers: with CUDA_MARGIN" if device == "cuda" else "CPU workers"
        lines.append(f"Sharded points: measure.sharded_memory's peak per worker at its phase ({how}); DDP points: "
                     "one fake-tensor step of the whole model.")
    lines.append(f"{'point':<32}{'estimated peak':>16}  {'phase':<10}{'fits' if budget else '':>6}"
                 f"{'comm MiB/step':>15}")
    for point in points:
        comm = f"{sent[point] / 2 ** 20:.2f}" if point in sent else "-"
        if point.parallelism == "ddp":
            peak, phase = whole[point], "step"
        elif point in sharded:
            peak, phase = sharded[point].total, sharded[point].phase
        else:
            lines.append(f"{point.key:<32}{'not predicted':>16}  {'-':<10}{'':>6}{comm:>15}")
            continue
        fits = _fits(sharded.get(point), peak, budget, point.key) if budget is not None else ""
        lines.append(f"{point.key:<32}{_mib(peak):>16}  {phase:<10}{fits:>6}{comm:>15}")
    return lines


def _fits(prediction: Optional[sharded_memory.Prediction], peak: int, budget: int, key: str) -> str:
    """yes | no | near (over the budget within the prediction's error: the sweep launches it)."""
    if peak <= budget:
        return "yes"
    if prediction is not None and sharded_memory.over_budget(prediction, budget, key) is None:
        return "near"
    return "no"


def _frontier_line(cfg: SweeperConfig, num_classes: int, workers: int, budget: int, precision: str,
                   checkpointing: str) -> str:
    found = predicted_frontier(cfg, num_classes, workers, budget, 1, precision, checkpointing)
    line = found.model
    fit = f" (peak = {_mib(line.fixed_bytes)} + {line.per_sample_bytes / 1024:,.1f} KiB x micro-batch)" if line else ""
    accumulating = predicted_frontier(cfg, num_classes, workers, budget, 2, precision, checkpointing)
    recipe = f", {precision}" + (", checkpointing" if checkpointing != "none" else "")
    return (f"Budget {cfg.device.memory_budget_gb:g} GiB, {workers} worker(s){recipe}: largest micro-batch "
            f"{found.micro_batch_size}{fit}; {accumulating.micro_batch_size} with gradient accumulation")


def main(argv: Optional[List[str]] = None) -> int:
    from hydra import compose, initialize_config_module

    from sweeper import config
    from sweeper.config import load
    from sweeper.errors import ConfigError

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
