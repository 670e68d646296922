"""What each per-step measurement costs, step by step: a plain hand-written optimizer step against
sweeper's Training.step with the gradient noise scale and the divergence check's gradient norm on,
with the noise scale measured one step in two (gns.every_steps=2), with the divergence check only,
and with neither. All four train side by side in one process, in
interleaved blocks of a few steps, so the machine's drift (a shared VM's neighbours) hits all alike;
bench_overhead.py times whole points instead, and its paired rounds can differ by 10 % here.

    python scripts/bench_step_costs.py [--model resnet18] [--micro 32] [--accum 2] [--blocks 16] [--block 5]

Prints each variant's median step time and the median of its per-block ratio to the plain step
(1.000 = free); the last line is the noise scale's own cost: throughput with it over without it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Callable, Dict, List

import torch
from bench_overhead import plain_step

from sweeper.config import DataConfig, DivergenceConfig, GnsConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.measure import telemetry
from sweeper.plan import GridPoint
from sweeper.worker import step as step_mod
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads import datasets as data_mod


def sweeper_step(spec: PointSpec, splits: data_mod.Splits) -> Callable[[], None]:
    run = step_mod.setup(spec, WorkerContext(), telemetry.select(False, 0), splits)
    run.model.train()
    done = iter(range(spec.steps))
    return lambda: run.step(next(done))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--block", type=int, default=5, help="steps per timed block")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model_cfg = ModelConfig(name=args.model, input_shape=[3, 32, 32] if args.model != "mlp" else [1, 32, 32])
    data_cfg = DataConfig(name="digits")
    splits = data_mod.load(data_cfg, model_cfg.input_shape)
    lr, warmup = 0.05, 3
    steps = warmup + args.blocks * args.block
    spec = PointSpec(model=model_cfg, data=data_cfg, train=TrainConfig(), point=GridPoint(args.micro, args.accum, 1),
                     lr=lr, steps=steps, optim=OptimConfig(lr=lr))
    variants: Dict[str, Callable[[], None]] = {
        "plain": plain_step(model_cfg, splits, args.micro, args.accum, lr),
        "sweeper_gns_and_divergence": sweeper_step(spec, splits),
        "sweeper_gns_every_2_and_divergence": sweeper_step(replace(spec, gns=GnsConfig(every_steps=2)), splits),
        "sweeper_divergence": sweeper_step(replace(spec, gns=GnsConfig(enabled=False)), splits),
        "sweeper_neither": sweeper_step(replace(spec, gns=GnsConfig(enabled=False),
                                                divergence=DivergenceConfig(check=False)), splits),
    }
    for step in variants.values():  # allocator, lazy init and optimizer state: untimed
        for _ in range(warmup):
            step()
    times: Dict[str, List[float]] = {name: [] for name in variants}
    names = list(variants)
    for b in range(args.blocks):
        for name in names[b % len(names):] + names[: b % len(names)]:  # rotate who goes first
            start = time.perf_counter()
            for _ in range(args.block):
                variants[name]()
            times[name].append((time.perf_counter() - start) / args.block)

    def ratio(name: str) -> float:
        return statistics.median(p / t for p, t in zip(times["plain"], times[name]))

    print(f"config: model={args.model} micro={args.micro} accum={args.accum} blocks={args.blocks} "
          f"block={args.block} threads={args.threads}")
    for name in names:
        print(f"{name}_ms_per_step: {1000 * statistics.median(times[name]):.1f} (plain over it: {ratio(name):.3f})")
    both = statistics.median(d / g for d, g in zip(times["sweeper_divergence"], times["sweeper_gns_and_divergence"]))
    print(f"gns_on_over_off_per_step: {both:.3f}")


if __name__ == "__main__":
    main()
