"""Batch-size finders side by side: sweeper's frontier search against PyTorch Lightning's
`Tuner.scale_batch_size` (power and binsearch), same model, same data, same (CPU-simulated) budget.

For each: the probes it ran (each a few training steps), its wall time and the batch size it answered,
against the true maximum, found by bisection over the same probe (peak memory grows with the batch;
tests/unit/test_oom.py checks the search against an exhaustive scan on a small model).

    pip install -e ".[bench]"      # Lightning is a benchmark-only extra
    python scripts/bench_batch_finder.py [--model resnet18] [--budget-gb 0.2]

The budget is enforced the same way for everyone: the training step runs under sweeper's memory
tracker, and the op that takes tensor memory over the budget raises the CPU allocator's
out-of-memory error (memory.SimulatedOutOfMemoryError), which Lightning recognizes as an OOM.
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
import warnings
from dataclasses import replace
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.measure import memory, telemetry
from sweeper.plan import GridPoint
from sweeper.worker.points import run_point
from sweeper.worker.probes import run_frontier
from sweeper.worker.spec import FrontierSpec, PointSpec, WorkerContext
from sweeper.workloads import datasets as data_mod
from sweeper.workloads import models

STEPS = 3  # per probe, for everyone: Lightning's steps_per_trial default, sweeper's warm-up steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="resnet18 (3x32x32) or mlp (1x8x8, depth 8, width 1024)")
    parser.add_argument("--budget-gb", type=float, default=0.2, help="simulated device memory, GiB")
    parser.add_argument("--init", type=int, default=8, help="first batch size for every finder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    budget = int(args.budget_gb * 2**30)
    model_cfg = (
        ModelConfig(name="resnet18", input_shape=[3, 32, 32])
        if args.model == "resnet18"
        else ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=8, width=1024)
    )
    data_cfg = DataConfig(name="digits")
    splits = data_mod.load(data_cfg, model_cfg.input_shape)
    upper = len(splits.train)
    template = PointSpec(
        model=model_cfg, data=data_cfg, train=TrainConfig(), measure=MeasureConfig(warmup_steps=STEPS),
        point=GridPoint(1, 1, 1), lr=0.05, steps=STEPS,
    )
    device = telemetry.select(False, 0)
    print(f"model {model_cfg.name} {model_cfg.input_shape}, digits ({upper} training samples), SGD momentum 0.9, "
          f"budget {args.budget_gb:g} GiB simulated on CPU, {STEPS} steps per probe, {args.threads} threads")

    def fits(size: int) -> bool:
        spec = replace(template, point=GridPoint(size, 1, 1), memory_budget_bytes=budget, evaluate=False)
        return run_point(spec, WorkerContext(), device, splits).status == "ok"

    rows: List[Tuple[str, int, float, int]] = []

    start = time.perf_counter()
    reports: list = []
    run_frontier(FrontierSpec(template, budget, {"first_probe": args.init}, upper), WorkerContext(), reports.append)
    ours = reports[-1]
    rows.append(("sweeper frontier search", len(reports) - 1, time.perf_counter() - start,
                 int(ours.plain.micro_batch_size)))

    for mode in ("power", "binsearch"):
        start = time.perf_counter()
        found, tried = lightning_scale_batch_size(model_cfg, splits.train, budget, mode, args.init)
        rows.append((f"Lightning scale_batch_size({mode})", len(tried), time.perf_counter() - start, found))

    start = time.perf_counter()
    truth, probes = bisect_max(fits, upper)
    print(f"true maximum: {truth} (bisection, {probes} probes, {time.perf_counter() - start:.0f} s)\n")

    print(f"{'finder':<36}{'probes':>7}{'wall s':>9}{'answer':>8}{'of max':>8}  fits")
    for name, count, seconds, answer in rows:
        ok = "yes" if answer <= truth else "NO (over the budget)"
        print(f"{name:<36}{count:>7}{seconds:>9.1f}{answer:>8}{answer / truth:>8.1%}  {ok}")


def bisect_max(fits: Callable[[int], bool], upper: int) -> Tuple[int, int]:
    """The largest size in [1, upper] that fits, by bisection (fits is monotone); and the probe count."""
    lo, hi, probes = 0, upper + 1, 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def lightning_scale_batch_size(model_cfg: ModelConfig, dataset, budget: int, mode: str, init: int):
    """Lightning's finder on the same model and data, every step after the first under the budget."""
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = models.build(model_cfg, 10)
            self.batch_size = init
            self.tried: List[int] = []

        def train_dataloader(self):
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, drop_last=True)

        def on_train_batch_start(self, batch, batch_idx):
            if batch_idx == 0:
                self.tried.append(self.batch_size)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            # Copied inside the tracked step, as sweeper's probe copies its batch to the device.
            return F.cross_entropy(self.net(inputs.clone()), targets.clone())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            def step():
                optimizer.step(closure=optimizer_closure)

            if batch_idx == 0:  # builds the momentum buffers, as sweeper's first warm-up step
                step()
            else:
                memory.track_step(self.net, optimizer, step, torch.device("cpu"), budget_bytes=budget)

    module = Module()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    found = Tuner(trainer).scale_batch_size(module, mode=mode, steps_per_trial=STEPS, init_val=init, max_trials=25)
    gc.collect()
    return int(found), module.tried


if __name__ == "__main__":
    main()
