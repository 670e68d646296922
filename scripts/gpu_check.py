"""The GPU check of sharded data parallelism, in one command of a few minutes on a CUDA machine: what the CPU here
cannot show (CUDA's caching allocator, NCCL, bf16 kernels). On a machine without CUDA it says so and exits 0.

1. Layouts under NCCL, without Ray: sweeper's GPT in three shapes (weight-heavy fp32, activation-heavy fp32,
   weight-heavy bf16) x DDP, ZeRO-2, ZeRO-3 x (no accumulation, accumulation 2 in the final and the every sync),
   on min(2, GPUs) ranks. Per layout: the sweep's prediction (measure.sharded_memory on CUDA: the foreach
   optimizer's cost, with and without CUDA_MARGIN), the tracked peak (MemTracker, the largest rank),
   torch.cuda.max_memory_allocated and max_memory_reserved over the timed steps, samples/s, the bytes counted
   per step against the prediction, and each ZeRO layout's losses against DDP's (the same samples: equal to
   float32 rounding in fp32).
2. The CLI on the GPU (real Ray and MLflow, a store per run in a temporary folder): the demo
   (+experiment=resnet_batch), +experiment=gpt_sharded without a budget, and one bf16 ZeRO-3 point accumulating
   in the every sync, each point's predicted, tracked, allocated and reserved memory, its throughput and its
   communication from the sweep's own records.

    python scripts/gpu_check.py            # from the repo root, the package importable
    OUT=/some/folder python scripts/gpu_check.py   # the same lines also in $OUT/gpu_check.txt

docs/parallelism.md ("The GPU check") says how to read its lines.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from bench_sharding import Shape, layouts  # the CPU bench's shapes and layouts (scripts/ is on sys.path)

MIB = 2 ** 20
VOCAB, HEADS = 256, 8
# The layouts checked: measure.layouts' classes (zero1 and hsdp are priced from ddp's and zero3's, and hsdp
# needs a mesh by node: scripts/bench_sharding.py runs them on the CPU).
CHECKED = ("ddp", "zero2", "zero3")


# Sized for a data-centre GPU and a few seconds each: ~100M parameters where the weights weigh most.
GPU_SHAPES = (Shape("weights", 64, 8, 1024, 1), Shape("activations", 1024, 4, 512, 8),
              Shape("bf16", 64, 8, 1024, 1, "bf16"))


class Lines:
    """Every line printed, and written as it comes to $OUT/gpu_check.txt when OUT is set (a run cut short by
    its time limit keeps what it printed)."""

    def __init__(self, folder: Optional[str]):
        self.path = os.path.join(folder, "gpu_check.txt") if folder else None
        if self.path:
            os.makedirs(folder, exist_ok=True)
            open(self.path, "w").close()

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(text + "\n")


def _model(shape: Shape):
    import torch

    from sweeper.workloads.gpt import GPT

    torch.manual_seed(0)
    return GPT(VOCAB, shape.context, shape.layers, HEADS, shape.width)


def _rank(rank: int, world: int, folder: str, shapes: Sequence[Shape], device_type: str, steps: int) -> None:
    import gc

    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        out = {}
        for shape in shapes:
            for layout in layouts(world, CHECKED):
                out[(shape.name, *layout)] = _one_layout(shape, *layout, rank, world, device_type, steps)
                gc.collect()  # the layout's model and optimizer, before the next layout's peak is read
                if device_type == "cuda":
                    torch.cuda.empty_cache()
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _one_layout(shape: Shape, parallelism: str, accumulation: int, sync: str, rank: int, world: int,
                device_type: str, steps: int) -> Dict:
    """One layout on this rank: the tracked step, then `steps` timed steps; memory, losses, throughput."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sweeper import recipe
    from sweeper.config import OptimConfig
    from sweeper.measure import collective_count, memory
    from sweeper.worker import sharding

    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    model, _ = sharding.apply(_model(shape).to(device), parallelism, precision=shape.precision, device=device)
    optimizer = recipe.build_optimizer(OptimConfig(name="adamw"), model.parameters(), 1e-4)
    # Every layout sees the same samples at each step: micro-step m of rank r takes rows of one global batch.
    share = shape.micro * accumulation
    tokens = torch.randint(0, VOCAB, (steps + 2, world * share, shape.context + 1),
                           generator=torch.Generator().manual_seed(0)).to(device)
    losses: List[float] = []

    def step(index: int) -> None:
        total = torch.zeros((), device=device)
        for micro in range(accumulation):
            rows = tokens[index, rank * share + micro * shape.micro: rank * share + (micro + 1) * shape.micro]
            with sharding.accumulation_context(model, micro, accumulation, sync, parallelism):
                with recipe.autocast(device, shape.precision):
                    logits = model(rows[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten())
                (loss / accumulation).backward()
            total += loss.detach() / accumulation
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / world)

    step(0)
    with collective_count.CollectiveCounter() as counter:
        tracked = memory.track_step(model, optimizer, lambda: step(1), device)
    if device_type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    for index in range(2, steps + 2):
        step(index)  # .item() synchronizes each step
    seconds = time.perf_counter() - began
    figures = dict(tracked=tracked.peak_bytes, collectives=counter.calls, losses=losses,
                   samples_per_second=steps * world * share / seconds)
    if device_type == "cuda":
        figures.update(allocated=torch.cuda.max_memory_allocated(device),
                       reserved=torch.cuda.max_memory_reserved(device))
    return figures  # the model and its optimizer go with this frame: _rank frees the cache between layouts


def predictions(shape: Shape, world: int, device_type: str) -> Dict[Tuple, Tuple]:
    """The sweep's prediction of each layout on `device_type` workers: (memory Prediction without the margin,
    with it, bytes sent per step)."""
    from sweeper import recipe
    from sweeper.config import OptimConfig
    from sweeper.measure import communication, fake_memory, sharded_memory
    from sweeper.workloads.samples import Samples

    optim = OptimConfig(name="adamw")
    per_sample, fixed = fake_memory.activation_fit(lambda: _model(shape), Samples((shape.context,), VOCAB, tokens=True),
                                                   optim, shape.precision)
    cost = fake_memory.optimizer_cost(optim, device_type)
    model = _model(shape)
    units = sharded_memory.units_of(model, recipe.blocks(model))
    out = {}
    for parallelism, accumulation, sync in layouts(world, CHECKED):
        gather = 2 if (shape.precision != "fp32" and parallelism != "ddp") else None
        args = (units, parallelism, world, shape.micro, accumulation, per_sample, fixed)
        kwargs = dict(gather_bytes_per_value=gather, optimizer=cost, gradient_sync=sync)
        out[(shape.name, parallelism, accumulation, sync)] = (
            sharded_memory.peak(*args, **kwargs),
            sharded_memory.peak(*args, **kwargs, margin=sharded_memory.margin_for(device_type)),
            communication.per_step(units, parallelism, world, accumulation, sync, gather_bytes_per_value=gather).bytes)
    return out


def check_layouts(say: Lines, shapes: Sequence[Shape], world: int, device_type: str, steps: int) -> None:
    """Section 1: every layout of every shape on `world` ranks, one line each, then the losses compared."""
    import torch.multiprocessing as mp

    from sweeper.measure import communication

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(world, folder, tuple(shapes), device_type, steps), nprocs=world, join=True)
        import torch

        ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(world)]
    say(f"layouts on {world} rank(s), {'NCCL' if device_type == 'cuda' else 'gloo'}, {steps} timed steps each "
        "(MiB; error = predicted tensors / tracked - 1; margin: with CUDA_MARGIN against reserved):")
    say("shape | parallelism | accum | sync | predicted | +margin | tracked | allocated | reserved | error % | "
        "margin vs reserved % | samples/s | comm predicted | comm counted")
    for shape in shapes:
        predicted = predictions(shape, world, device_type)
        for key, (tensors, margined, sent) in predicted.items():
            largest = max((r[key] for r in ranks), key=lambda f: f["tracked"])
            counted = communication.traffic(largest["collectives"], world).bytes
            reserved = largest.get("reserved")
            say(" | ".join([
                shape.name, key[1], str(key[2]), key[3], f"{tensors.tensor_bytes / MIB:.1f}",
                f"{margined.total / MIB:.1f}", f"{largest['tracked'] / MIB:.1f}",
                _mib(largest.get("allocated")), _mib(reserved),
                f"{(tensors.tensor_bytes / largest['tracked'] - 1) * 100:+.1f}",
                "-" if not reserved else f"{(margined.total / reserved - 1) * 100:+.1f}",
                f"{largest['samples_per_second']:.1f}", f"{sent / MIB:.1f}", f"{counted / MIB:.1f}"]))
        _compare_losses(say, shape, ranks[0])


def _mib(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def _compare_losses(say: Lines, shape: Shape, figures: Dict) -> None:
    """Each ZeRO layout's per-step losses against DDP's at the same accumulation (the same samples; the sync
    changes when gradients are reduced, not what they add up to)."""
    worst = []
    for (name, parallelism, accumulation, sync), found in figures.items():
        if name != shape.name or parallelism == "ddp":
            continue
        reference = figures.get((name, "ddp", accumulation, "final"))
        if reference is None:
            continue
        gap = max(abs(a - b) for a, b in zip(found["losses"], reference["losses"]))
        worst.append(f"{parallelism} acc{accumulation} {sync}: {gap:.2e}")
    say(f"  {shape.name} ({shape.precision}): largest |loss - DDP's loss| over the steps: " + "; ".join(worst))


def cli_runs(gpus: int) -> List[Tuple[str, List[str]]]:
    """(name, overrides) of each CLI sweep of section 2 (at most `gpus` workers: a worker per GPU)."""
    workers = f"sweep.num_workers=[{min(2, gpus)}]"
    gpu = ["cluster.use_gpu=true", "device.memory_budget_gb=null"]
    return [
        ("demo", ["+experiment=resnet_batch", "sweep.num_workers=[1]", "train.epochs=1", *gpu]),
        ("gpt_sharded", ["+experiment=gpt_sharded", workers, *gpu]),
        ("bf16 zero3", ["+experiment=gpt_sharded", workers, "sweep.parallelism=[zero3]", "sweep.precisions=[bf16]",
                        "sweep.micro_batch_sizes=[4]", "sweep.accumulation_steps=[2]", "sweep.gradient_sync=[every]",
                        *gpu]),
    ]


COLUMNS = ("memory_predicted_bytes", "memory_tracked_peak_bytes", "cuda_max_memory_allocated_bytes",
           "cuda_max_memory_reserved_bytes", "memory_prediction_error", "samples_per_second",
           "communication_bytes_per_step")


def check_cli(say: Lines, gpus: int, timeout_s: float) -> None:
    """Section 2: each CLI sweep in a fresh folder; each point's figures from its own records."""
    import sweeper

    for name, overrides in cli_runs(gpus):
        with tempfile.TemporaryDirectory() as cwd:
            began = time.time()
            try:
                done = subprocess.run([sys.executable, "-m", "sweeper", *overrides], cwd=cwd, capture_output=True,
                                      text=True, timeout=timeout_s, env={**os.environ, "PYTHONPATH": _package_path()})
            except subprocess.TimeoutExpired:
                say(f"{name}: not finished within {timeout_s:.0f} s (python -m sweeper {' '.join(overrides)})")
                continue
            say(f"{name}: python -m sweeper {' '.join(overrides)}: exit {done.returncode}, {time.time() - began:.0f} s")
            if done.returncode != 0:
                say("  " + (done.stderr or done.stdout)[-1500:].replace("\n", "\n  "))
            try:
                frame = sweeper.results("sweeper", tracking_uri=f"sqlite:///{cwd}/mlflow.db")
            except Exception as exc:  # noqa: BLE001 - a run that recorded nothing: said, the check goes on
                say(f"  no records: {exc}")
                continue
            say("  key | status | " + " | ".join(COLUMNS))
            for _, row in frame.iterrows():
                values = [_cell(row.get(c), c) for c in COLUMNS]
                say(f"  {row['key']} | {row['status']} | " + " | ".join(values))


def _cell(value, column: str) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value / MIB:.1f} MiB" if column.endswith("_bytes") or column.endswith("_per_step") else f"{value:.3g}"


def _package_path() -> str:
    """The folder holding the `sweeper` package imported here, first on PYTHONPATH for the CLI's runs."""
    import sweeper

    here = os.path.dirname(os.path.dirname(os.path.abspath(sweeper.__file__)))
    return os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per layout")
    parser.add_argument("--skip-cli", action="store_true", help="section 1 only")
    parser.add_argument("--cli-timeout", type=float, default=200, help="seconds per CLI sweep")
    parser.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)  # section 1's code path, for tests
    args = parser.parse_args(argv)
    say = Lines(os.environ.get("OUT"))
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        say("scripts/gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False here): nothing checked. "
            "Run it on a machine with one (docs/parallelism.md, \"The GPU check\").")
        return 0
    began = time.time()
    if args.cpu:
        check_layouts(say, (Shape("tiny", 8, 2, 32, 1), Shape("tiny bf16", 8, 2, 32, 1, "bf16")), 2, "cpu", args.steps)
        return 0
    gpus = torch.cuda.device_count()
    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}, "
        f"{gpus} x {torch.cuda.get_device_name(0)}")
    check_layouts(say, GPU_SHAPES, min(2, gpus), "cuda", args.steps)
    say(f"section 1 done in {time.time() - began:.0f} s")
    if not args.skip_cli:
        check_cli(say, gpus, args.cli_timeout)
    say(f"done in {time.time() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
