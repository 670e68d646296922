"""Predicted against measured peak memory per worker, and predicted against counted communication per step, for DDP,
ZeRO-1, ZeRO-2, ZeRO-3 and HSDP (FSDP2; HSDP on simulated nodes of 2) at 1, 2 and 4 gloo workers on the CPU, with and
without accumulation in both gradient syncs: sweeper's GPT with AdamW in three shapes (activation-heavy, weight-heavy
at micro-batch 1, and the weight-heavy one in bf16).

Each world size runs in its own gloo processes (no Ray), every layout of a shape one after another: a warm-up
step, then one step under torch's MemTracker per rank (the figure: the largest rank's tracked peak, and the
phase it fell in) with its collectives counted where they reach the process group. The prediction is the
sweep's own: measure.sharded_memory.peak on the model's units, with the activation slope fitted as the sweep
fits it (fake_memory.activation_fit: two fake-tensor steps of the unsharded model at
fake_memory.SLOPE_MICRO_BATCHES) and the optimizer's cost measured as the sweep measures it
(fake_memory.optimizer_cost); the communication is measure.communication.per_step's.

    python scripts/bench_sharding.py                      # the table in docs/parallelism.md
    python scripts/bench_sharding.py --shapes weights --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from sweeper import plan, recipe
from sweeper.config import OptimConfig
from sweeper.measure import collective_count, communication, fake_memory, memory, node_traffic, sharded_memory
from sweeper.worker import collectives, sharding
from sweeper.worker.spec import WorkerContext
from sweeper.workloads.gpt import GPT
from sweeper.workloads.samples import Samples

MIB = 2 ** 20
VOCAB, HEADS = 256, 4
RANKS_PER_NODE = 2  # hsdp's simulated nodes


@dataclass(frozen=True)
class Shape:
    name: str
    context: int
    layers: int
    width: int
    micro: int
    precision: str = "fp32"


SHAPES = {
    # 3.2M parameters, 4.2 MiB of activations a sample: activations outweigh the weights at micro-batch 4.
    "activations": Shape("activations", 64, 4, 256, 4),
    # 7.2M parameters (27.5 MiB), context 8 at micro-batch 1: weights, gradients and AdamW's state are the peak.
    "weights": Shape("weights", 8, 4, 384, 1),
    # The same in bf16: FSDP2 gathers bf16 weights, autocast's copies are not counted twice.
    "bf16": Shape("bf16", 8, 4, 384, 1, "bf16"),
}
# (accumulation steps, gradient sync) of every layout; plan.gradient_sync folds the ones that are the same.
MODES = ((1, "final"), (2, "final"), (2, "every"))


def _model(shape: Shape) -> GPT:
    torch.manual_seed(0)
    return GPT(VOCAB, shape.context, shape.layers, HEADS, shape.width)


def layouts(world: int, parallelisms: Sequence[str] = plan.PARALLELISMS) -> List[Tuple[str, int, str]]:
    """(parallelism, accumulation, gradient sync) of every distinct layout of `parallelisms` at `world` workers."""
    found = [(p, acc, plan.gradient_sync(p, world, acc, sync)) for p in parallelisms for acc, sync in MODES]
    return list(dict.fromkeys(found))


def _rank(rank: int, world: int, folder: str, shape: Shape) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        out = {}
        for parallelism, accumulation, sync in layouts(world):
            out[(parallelism, accumulation, sync)] = _measure(shape, parallelism, accumulation, sync, rank)
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _measure(shape: Shape, parallelism: str, accumulation: int, sync: str, rank: int):
    """(the tracked step's breakdown, the collectives it issued) of one layout on this rank."""
    world = dist.get_world_size()
    # hsdp: nodes of RANKS_PER_NODE ranks, simulated (a node id per rank, as Ray reports them)
    nodes = [f"node{r // min(world, RANKS_PER_NODE)}" for r in range(world)]
    mesh = collectives.node_meshes([world], nodes, WorkerContext(rank, world)).get(world) \
        if parallelism == "hsdp" else None
    model, _ = sharding.apply(_model(shape), parallelism, precision=shape.precision, node_mesh=mesh)
    optimizer = sharding.optimizer_for(parallelism, recipe.build_optimizer(OptimConfig(name="adamw"),
                                                                           model.parameters(), 1e-3))
    tokens = torch.randint(0, VOCAB, (accumulation, shape.micro, shape.context + 1),
                           generator=torch.Generator().manual_seed(rank))
    cpu = torch.device("cpu")

    def step() -> None:
        for micro in range(accumulation):
            with sharding.accumulation_context(model, micro, accumulation, sync, parallelism):
                with recipe.autocast(cpu, shape.precision):
                    logits = model(tokens[micro, :, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[micro, :, 1:].flatten())
                (loss / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with collective_count.CollectiveCounter() as counter:
        breakdown = memory.track_step(model, sharding.local_optimizer(optimizer), step, cpu)
    return breakdown, counter.calls


def measure(shape: Shape, world: int):
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(world, folder, shape), nprocs=world, join=True)
        return [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def predictions(shape: Shape, world: int) -> Dict[Tuple[str, int, str], Tuple[sharded_memory.Prediction, int]]:
    """The sweep's prediction of every layout: memory and bytes sent per step."""
    optim = OptimConfig(name="adamw")
    per_sample, fixed = fake_memory.activation_fit(lambda: _model(shape), Samples((shape.context,), VOCAB, tokens=True),
                                                   optim, shape.precision)
    cost = fake_memory.optimizer_cost(optim, "cpu")
    model = _model(shape)
    units = sharded_memory.units_of(model, recipe.blocks(model))
    out = {}
    for parallelism, accumulation, sync in layouts(world):
        gather = 2 if (shape.precision != "fp32" and parallelism != "ddp") else None
        memory_ = sharded_memory.peak(units, parallelism, world, shape.micro, accumulation, per_sample, fixed,
                                      gather_bytes_per_value=gather, optimizer=cost, gradient_sync=sync,
                                      ranks_per_node=min(world, RANKS_PER_NODE))
        if parallelism in ("zero1", "hsdp"):  # measure.node_traffic's, on the simulated nodes
            sent = node_traffic.per_step(units, parallelism, world, accumulation,
                                         nodes=-(-world // RANKS_PER_NODE)).total_bytes
        else:
            sent = communication.per_step(units, parallelism, world, accumulation, sync,
                                          gather_bytes_per_value=gather).bytes
        out[(parallelism, accumulation, sync)] = (memory_, sent)
    return out


def _measured_phase(breakdown) -> str:
    return max(("forward", "backward", "optimizer"), key=lambda p: getattr(breakdown, f"{p}_peak_bytes"))


def rows_of(shape: Shape, world: int, verbose: bool) -> List[Tuple]:
    predicted = predictions(shape, world)
    ranks = measure(shape, world)
    rows = []
    for layout, (prediction, sent) in predicted.items():
        largest, calls = max((r[layout] for r in ranks), key=lambda m: m[0].peak_bytes)
        counted = communication.traffic(calls, world).bytes
        error = prediction.tensor_bytes / largest.peak_bytes - 1
        rows.append((shape.name, layout[0], world, layout[1], layout[2], f"{prediction.tensor_bytes / MIB:.2f}",
                     prediction.phase, f"{largest.peak_bytes / MIB:.2f}", _measured_phase(largest),
                     f"{error * 100:+.1f}", f"{sent / MIB:.2f}", f"{counted / MIB:.2f}"))
        if verbose:
            print(f"  {shape.name} {layout} x{world}: measured {largest}\n"
                  f"  predicted {sharded_memory.by_phase(prediction)} {prediction.parts}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--verbose", action="store_true", help="each layout's measured and predicted parts")
    parser.add_argument("--parallelism", nargs="+", default=list(sharding.PARALLELISMS), help="the layouts to run")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in args.shapes:
        shape = SHAPES[name]
        params = sum(p.numel() for p in _model(shape).parameters())
        print(f"{name}: GPT vocab {VOCAB}, context {shape.context}, {shape.layers} layers x {shape.width} "
              f"({params / 1e6:.2f}M parameters), AdamW, {shape.precision}, micro-batch {shape.micro}")
    header = ("shape", "parallelism", "workers", "accum", "sync", "predicted MiB", "phase", "measured MiB",
              "phase", "error %", "comm predicted MiB", "comm counted MiB")
    rows = [row for name in args.shapes for world in args.workers for row in rows_of(SHAPES[name], world, args.verbose)]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    errors = [float(r[9]) for r in rows]
    print(f"error band: {min(errors):+.1f} % to {max(errors):+.1f} % over {len(rows)} layouts "
          f"(sharded_memory.PREDICTION_ERROR_BAND: {sharded_memory.PREDICTION_ERROR_BAND})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
