"""Predicted against measured peak memory per worker, and throughput, for DDP, ZeRO-1, ZeRO-2, ZeRO-3 and HSDP
(FSDP2) at 1 and 2 gloo workers on the CPU, and HSDP at 4 on two simulated nodes of 2: sweeper's GPT with AdamW,
fp32.

Each layout runs in its own gloo processes (no Ray): warm-up steps, one step under torch's MemTracker per
rank (a fresh tracker per step: MemTracker keeps per-module state between iterations), then timed windows.
The figure is the largest rank's tracked peak; the prediction is measure.sharded_memory's, from the
model's parameter shapes and the activation slope of two fake-tensor steps in one process (what the sweep
measures per sample before it launches).

    python scripts/bench_sharding.py            # the table in docs/parallelism.md
    python scripts/bench_sharding.py --quick    # fewer steps, for a smoke run
    python scripts/bench_sharding.py --parallelism zero1 hsdp   # some layouts only
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from sweeper import recipe
from sweeper.config import OptimConfig
from sweeper.workloads.gpt import GPT
from sweeper.measure import memory, sharded_memory
from sweeper.workloads.samples import Samples
from sweeper.worker import collectives, sharding
from sweeper.worker.spec import WorkerContext

MIB = 2 ** 20
RANKS_PER_NODE = 2  # hsdp's simulated nodes


def _model(args) -> GPT:
    torch.manual_seed(0)
    return GPT(args.vocab, args.context, args.layers, args.heads, args.width)


def _optimizer(model):
    return recipe.build_optimizer(OptimConfig(name="adamw"), model.parameters(), 1e-3)


def _rank(rank: int, world: int, folder: str, parallelism: str, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        # hsdp: nodes of RANKS_PER_NODE ranks, simulated (a node id per rank, as Ray reports them)
        nodes = [f"node{r // min(world, RANKS_PER_NODE)}" for r in range(world)]
        mesh = collectives.node_meshes([world], nodes, WorkerContext(rank, world)).get(world) \
            if parallelism == "hsdp" else None
        model, done = sharding.apply(_model(args), parallelism, node_mesh=mesh)
        optimizer = sharding.optimizer_for(parallelism, _optimizer(model))
        accumulation = args.global_batch // (args.micro * world)
        generator = torch.Generator().manual_seed(rank)
        tokens = torch.randint(0, args.vocab, (accumulation, args.micro, args.context + 1), generator=generator)

        def step():
            for micro in range(accumulation):
                with sharding.accumulation_context(model, micro, accumulation):
                    logits = model(tokens[micro, :, :-1])
                    loss = F.cross_entropy(logits.flatten(0, 1), tokens[micro, :, 1:].flatten())
                    (loss / accumulation).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(args.warmup):
            step()
        breakdown = memory.track_step(model, sharding.local_optimizer(optimizer), step, torch.device("cpu"))
        windows = []
        for _ in range(args.windows):
            dist.barrier()
            began = time.perf_counter()
            for _ in range(args.steps_per_window):
                step()
            seconds = torch.tensor([time.perf_counter() - began])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets a data-parallel step's pace
            windows.append(args.steps_per_window * args.global_batch / seconds.item())
        torch.save(dict(breakdown=breakdown, windows=windows, units=done.units),
                   os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def measure(parallelism: str, world: int, args):
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(world, folder, parallelism, args), nprocs=world, join=True)
        return [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def activation_slope(args):
    """(bytes per sample, bytes at no sample) of what forward keeps for backward, from fake-tensor steps at two
    micro-batch sizes in one process (memory.estimate_step: what the sweep can estimate before launch)."""
    samples = Samples((args.context,), args.vocab, tokens=True)
    small, large = args.micro, 2 * args.micro
    kept = [memory.estimate_step(lambda: _model(args), samples, m, optim=OptimConfig(name="adamw"))
            .forward_activations_bytes for m in (small, large)]
    per_sample = (kept[1] - kept[0]) / (large - small)
    return per_sample, kept[0] - per_sample * small


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--steps-per-window", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="1 warm-up step, 2 windows of 2 steps")
    parser.add_argument("--verbose", action="store_true", help="each layout's measured and predicted parts")
    parser.add_argument("--parallelism", nargs="+", default=list(sharding.PARALLELISMS), help="the layouts to run")
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.windows, args.steps_per_window = 1, 2, 2
    os.environ["OMP_NUM_THREADS"] = "1"
    model = _model(args)
    units = sharded_memory.units_of(model, recipe.blocks(model))
    per_sample, fixed = activation_slope(args)
    print(f"GPT vocab {args.vocab}, context {args.context}, {args.layers} layers x {args.width}, AdamW fp32; "
          f"global batch {args.global_batch}, micro-batch {args.micro}; activation slope "
          f"{per_sample / MIB:.3f} MiB/sample (+{fixed / MIB:.2f} MiB fixed, fake-tensor steps)")
    header = ("parallelism", "workers", "accum", "predicted MiB", "measured MiB", "error %",
              "samples/s", "spread %")
    rows = []
    for parallelism in args.parallelism:
        for world in (1, 2, 4) if parallelism == "hsdp" else (1, 2):
            accumulation = args.global_batch // (args.micro * world)
            if accumulation < 1:
                print(f"  {parallelism} x{world}: skipped, --global-batch {args.global_batch} < micro x workers",
                      file=sys.stderr)
                continue
            predicted = sharded_memory.peak(units, parallelism, world, args.micro, accumulation, per_sample, fixed,
                                            ranks_per_node=min(world, RANKS_PER_NODE))
            ranks = measure(parallelism, world, args)
            largest = max(ranks, key=lambda r: r["breakdown"].peak_bytes)["breakdown"]
            windows = ranks[0]["windows"]
            mean = statistics.mean(windows)
            spread = (max(windows) - min(windows)) / mean * 100
            error = (predicted.total - largest.peak_bytes) / largest.peak_bytes * 100
            rows.append((parallelism, world, accumulation, f"{predicted.total / MIB:.2f}",
                         f"{largest.peak_bytes / MIB:.2f}", f"{error:+.1f}", f"{mean:.0f}", f"{spread:.0f}"))
            if args.verbose:
                print(f"  {parallelism} x{world}: measured {largest}\n  predicted {predicted}", file=sys.stderr)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
