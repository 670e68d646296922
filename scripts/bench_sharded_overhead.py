"""Sweeper's sharded training step against a plain hand-written FSDP2 loop: same model, same data, same global
batch, in the same gloo processes, alternating rounds; the paired ratio per parallelism (goal >= 0.98).

    python scripts/bench_overhead.py --sharded zero2 zero3 [--workers 2] [--micro 4] [--accum 2] [--steps 30]
        [--warmup 3] [--rounds 6]

sweeper's GPT at conf/model/gpt.yaml's size on data=text, AdamW, fp32, one thread per process.

What is compared: "sweeper" is the worker's own sharded path, `worker/step.setup` for a point with
`parallelism` zero2/zero3 over the real gloo group (the seeded model, `sharding.apply` per block then the root,
the optimizer built on the shards, the point's GlobalBatchSampler loader), timed through `Training.step`, which
accumulates under `sharding.accumulation_context`. The gradient noise scale (refused with sharding) and the
divergence check (a per-step norm the plain loop has no counterpart for) are off. "plain" is the loop a user
writes from FSDP2's docs: `fully_shard` per block then the root, torch.optim.AdamW, a DistributedSampler DataLoader, and
`set_requires_gradient_sync(last micro-step)`. Each side's samples/s is the global batch's, over the timed
steps after warm-up, paced by the slowest rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from sweeper.config import DataConfig, DivergenceConfig, GnsConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.measure import telemetry
from sweeper.plan import GridPoint
from sweeper.worker import sharding, step
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads import datasets as data_mod
from sweeper.workloads import models

LR = 1e-3


def _configs():
    return ModelConfig(name="gpt", input_shape=[64]), DataConfig(name="text", val_fraction=0.1)


def _timed(run_step, steps: int, warmup: int, global_batch: int) -> float:
    """Global samples/s over the steps after warm-up; the slowest rank's time sets the pace."""
    for i in range(warmup):
        run_step(i)
    dist.barrier()
    began = time.perf_counter()
    for i in range(warmup, steps):
        run_step(i)
    seconds = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return (steps - warmup) * global_batch / seconds.item()


def _sweeper(parallelism, rank, world, splits, args) -> float:
    model_cfg, data_cfg = _configs()
    point = GridPoint(args.micro, args.accum, world, "fp32", parallelism=parallelism)
    spec = PointSpec(model=model_cfg, data=data_cfg, train=TrainConfig(), point=point, lr=LR, steps=args.steps,
                     optim=OptimConfig(name="adamw", lr=LR, weight_decay=0.01), gns=GnsConfig(enabled=False),
                     divergence=DivergenceConfig(check=False), evaluate=False)
    training = step.setup(spec, WorkerContext(rank=rank, world_size=world), telemetry.Device(torch.device("cpu")),
                          splits)
    assert sharding.is_sharded(training.model), "the point's model was not sharded"
    return _timed(training.step, args.steps, args.warmup, point.global_batch_size)


def _plain(parallelism, rank, world, splits, args) -> float:
    from torch.distributed.fsdp import fully_shard

    model_cfg, _ = _configs()
    torch.manual_seed(0)
    model = models.build(model_cfg, splits.num_classes)
    for block in model.blocks:  # the GPT's transformer blocks, then the root
        fully_shard(block, reshard_after_forward=parallelism == "zero3")
    fully_shard(model, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sampler = DistributedSampler(splits.train, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(splits.train, batch_size=args.micro, sampler=sampler, drop_last=True)
    batches = iter(loader)

    def one_step(_: int) -> None:
        nonlocal batches
        for micro in range(args.accum):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            model.set_requires_gradient_sync(micro == args.accum - 1)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            (loss / args.accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed(one_step, args.steps, args.warmup, args.micro * args.accum * world)


def _rank(rank: int, world: int, folder: str, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        model_cfg, data_cfg = _configs()
        splits = data_mod.load(data_cfg, model_cfg.input_shape)
        sides = {"plain": _plain, "sweeper": _sweeper}
        runs = {(p, side): [] for p in args.sharded for side in sides}
        for i in range(args.rounds):
            for p in args.sharded:
                # Rotate which side goes first, so neither always inherits the other's warm caches.
                for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                    runs[(p, side)].append(sides[side](p, rank, world, splits, args))
        if rank == 0:
            torch.save(runs, os.path.join(folder, "runs.pt"))
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharded", nargs="+", choices=["zero2", "zero3"], default=["zero2", "zero3"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(args.workers, folder, args), nprocs=args.workers, join=True)
        runs = torch.load(os.path.join(folder, "runs.pt"))
    print(f"config: sharded model=gpt workers={args.workers} micro={args.micro} accum={args.accum} "
          f"global={args.micro * args.accum * args.workers} steps={args.steps} warmup={args.warmup} "
          f"rounds={args.rounds} threads=1/process optim=adamw precision=fp32 load={os.getloadavg()[0]:.2f}")
    print("parallelism | plain samples/s | sweeper samples/s | paired ratios (sweeper/plain) | median ratio")
    print("------------|-----------------|-------------------|-------------------------------|-------------")
    for p in args.sharded:
        plain, ours = runs[(p, "plain")], runs[(p, "sweeper")]
        ratios = [o / q for o, q in zip(ours, plain)]
        print(f"{p:<11} | {statistics.median(plain):<15.1f} | {statistics.median(ours):<17.1f} | "
              f"{', '.join(f'{r:.3f}' for r in ratios):<29} | {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
