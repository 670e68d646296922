"""Plain hand-written PyTorch loop vs. sweeper's training step, same model/data/batch, one process,
alternating rounds. Prints `name: value` lines; the last line is the headline ratio.

    python scripts/bench_overhead.py [--model resnet18|mlp|gpt] [--micro 32] [--accum 1] [--steps 80]
        [--rounds 10] [--precision fp32|bf16|fp16] [--optim sgd|adamw]
    python scripts/bench_overhead.py --sharded zero2 zero3 [--workers 2] [--micro 4] [--accum 2] [--steps 30]

`--sharded`: sweeper's sharded step against a plain hand-written FSDP2 loop in `--workers` gloo processes
(scripts/bench_sharded_overhead.py: its options, and exactly what is compared).

Both sides train the same recipe: the plain loop writes autocast, the GradScaler and the optimizer by
hand, as a user would. `--model gpt` trains sweeper's GPT (conf/model/gpt.yaml's size) on data=text
against a nanoGPT-style loop (random windows of the byte stream, `get_batch`), in tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from sweeper.config import DataConfig, GnsConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.train import train_point
from sweeper.workloads import datasets as data_mod
from sweeper.workloads import models


def plain_step(model_cfg, splits, micro, accum, lr, precision="fp32", optim="sgd") -> Callable[[], None]:
    """The optimizer step a user would write by hand: shuffle, batch, accumulate, step."""
    torch.manual_seed(0)
    model = models.build(model_cfg, splits.num_classes)
    if optim == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    loader = DataLoader(splits.train, batch_size=micro, shuffle=True, drop_last=True)
    batches = iter(loader)

    def next_batch():
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    if models.is_language_model(model_cfg):
        next_batch = nano_gpt_batches(splits.train.tokens, model_cfg.context, micro)
    model.train()

    def step() -> None:
        for _ in range(accum):
            x, y = next_batch()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            (scaler.scale(loss / accum) if scaler else loss / accum).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def nano_gpt_batches(stream, context: int, micro: int) -> Callable[[], tuple]:
    """nanoGPT's get_batch: `micro` windows of the token stream at random offsets, and their next tokens."""
    data = torch.from_numpy(stream.astype("int64"))

    def get_batch():
        ix = torch.randint(len(data) - context, (micro,))
        x = torch.stack([data[i: i + context] for i in ix])
        y = torch.stack([data[i + 1: i + 1 + context] for i in ix])
        return x, y

    return get_batch


def plain_loop(model_cfg, data_cfg, micro, accum, steps, warmup, lr, precision="fp32", optim="sgd") -> float:
    """plain_step `steps` times, the last `steps - warmup` timed. Returns samples/s."""
    splits = data_mod.load(data_cfg, model_cfg.input_shape)
    step = plain_step(model_cfg, splits, micro, accum, lr, precision, optim)
    start = None
    for i in range(steps):
        if i == warmup:
            start = time.perf_counter()
        step()
    return (steps - warmup) * micro * accum / (time.perf_counter() - start)


def main() -> None:
    if "--sharded" in sys.argv:
        from bench_sharded_overhead import main as sharded  # beside this script

        return sharded(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--optim", default="sgd", choices=["sgd", "adamw"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.model == "gpt":
        model_cfg, data_cfg = ModelConfig(name="gpt", input_shape=[64]), DataConfig(name="text", val_fraction=0.1)
    else:
        model_cfg = ModelConfig(name=args.model, input_shape=[3, 32, 32] if args.model != "mlp" else [1, 32, 32])
        data_cfg = DataConfig(name="digits")
    # The sweeper's step times one window over the same measured steps as the plain loop, with
    # everything it does in a trial switched on: phase marks, the utilization sampler thread, the
    # memory breakdown (on a warm-up step, as in a sweep).
    measure_cfg = MeasureConfig(warmup_steps=args.warmup, windows=1, stable_windows=1)
    lr = 0.001 if args.optim == "adamw" else 0.05
    optim = OptimConfig(name="adamw", lr=lr, weight_decay=0.01) if args.optim == "adamw" else OptimConfig(lr=lr)
    spec = PointSpec(model=model_cfg, data=data_cfg, train=TrainConfig(), measure=measure_cfg,
                     point=GridPoint(args.micro, args.accum, 1, args.precision), lr=lr, steps=args.steps, optim=optim)

    # With more than one micro-batch per step the gradient noise scale is measured (gns.enabled, on by
    # default): the sweeper then also runs with it off, in the same rounds, to isolate its cost.
    variants = {"plain": None, "ours": spec}
    if args.accum > 1:
        variants["ours_no_gns"] = replace(spec, gns=GnsConfig(enabled=False))
    runs = {name: [] for name in variants}
    for i in range(args.rounds):
        # Rotate which goes first, so none always inherits another's warm caches.
        names = list(variants)
        for name in names[i % len(names):] + names[: i % len(names)]:
            if variants[name] is None:
                runs[name].append(plain_loop(model_cfg, data_cfg, args.micro, args.accum, args.steps, args.warmup,
                                             lr, args.precision, args.optim))
            else:
                runs[name].append(train_point(variants[name], WorkerContext())["samples_per_second"])
    plain, ours = runs["plain"], runs["ours"]
    # Each round's ratio compares two runs seconds apart, so slow drift of the machine (other
    # processes, thermal state) cancels; the headline is the median of those paired ratios.
    ratios = [o / p for o, p in zip(ours, plain)]
    print(f"config: model={args.model} micro={args.micro} accum={args.accum} steps={args.steps} "
          f"warmup={args.warmup} threads={args.threads} rounds={args.rounds} precision={args.precision} "
          f"optim={args.optim}")
    print(f"plain_samples_per_second: {statistics.median(plain):.1f} (rounds: {', '.join(f'{v:.1f}' for v in plain)})")
    print(f"sweeper_samples_per_second: {statistics.median(ours):.1f} (rounds: {', '.join(f'{v:.1f}' for v in ours)})")
    print(f"paired_ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    if "ours_no_gns" in runs:
        off = runs["ours_no_gns"]
        print(f"sweeper_no_gns_samples_per_second: {statistics.median(off):.1f} "
              f"(rounds: {', '.join(f'{v:.1f}' for v in off)})")
        print(f"no_gns_ratio_sweeper_over_plain: {statistics.median(o / p for o, p in zip(off, plain)):.3f}")
        print(f"gns_on_over_off: {statistics.median(o / f for o, f in zip(ours, off)):.3f}")
    positions = models.positions(model_cfg)
    if positions is not None:
        print(f"context: {positions} tokens per sequence")
        print(f"plain_tokens_per_second: {statistics.median(plain) * positions:.0f}")
        print(f"sweeper_tokens_per_second: {statistics.median(ours) * positions:.0f}")
    print(f"throughput_ratio_sweeper_over_plain: {statistics.median(ratios):.3f}")

if __name__ == "__main__":
    main()
