"""The wall-clock figures the unit tests do not assert: sweeper's clocks against work of known duration,
on this machine. The tests check the arithmetic behind each figure exactly, on a clock only a model's
forwards move (tests.helpers.forwards_take); what the real clock reads, and how much a loaded machine
moves it, is this script's to print.

- a training step of known duration: 2 micro-batches of 8 through a forward that sleeps 20 ms, so at
  most 16 / 0.040 = 400 samples/s; the measured samples/s and its share of that;
- an inference forward that sleeps 10 ms: its median latency;
- the CPU's memory bandwidth on one thread (the roofline's, a copy of 256 MiB);
- a compiled point's first step (where torch.compile compiles) over its timed step;
- how long the utilization sampler takes to stop with a 10 s interval (it must not wait it out).

    python scripts/bench_clocks.py [--threads 1]

Each line is `name: value`, the headline (the training step's share of its known rate) last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig  # noqa: E402
from sweeper.inference.latency import InferenceSpec, run_inference_point  # noqa: E402
from sweeper.measure import bandwidth, telemetry  # noqa: E402
from sweeper.plan import GridPoint  # noqa: E402
from sweeper.worker.spec import PointSpec, WorkerContext  # noqa: E402
from sweeper.worker.train import train_point  # noqa: E402

DIGITS = DataConfig(name="digits")


class Sleepy(torch.nn.Module):
    """A forward of known duration, `seconds` whatever the batch."""

    def __init__(self, num_classes: int, inputs: int = 64, seconds: float = 0.02):
        super().__init__()
        self.linear = torch.nn.Linear(inputs, num_classes)
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.linear(x.flatten(1))


def training_step() -> float:
    """samples/s of 2 x 8 samples a step through a 20 ms forward, and its share of the 400 it can be."""
    model = ModelConfig(name="sleepy", _target_="__main__.Sleepy", input_shape=[1, 8, 8])
    measure = MeasureConfig(warmup_steps=2, windows=3, stable_windows=3, stability_tolerance=0.2, flops=False)
    r = train_point(PointSpec(model=model, data=DIGITS, train=TrainConfig(seed=3), measure=measure,
                              point=GridPoint(8, 2, 1), lr=0.1, steps=14), WorkerContext())
    print(f"training_step_samples_per_second: {r['samples_per_second']:.1f} (at most 400)")
    print(f"training_step_forward_backward_seconds: {r['forward_backward_seconds_per_step']:.4f} (at least 0.040)")
    return r["samples_per_second"] / 400


def inference_forward() -> None:
    model = ModelConfig(name="sleepy", _target_="__main__.Sleepy", input_shape=[8], kwargs={"inputs": 8,
                                                                                           "seconds": 0.01})
    r = run_inference_point(InferenceSpec(model=model, num_classes=4, batch_size=4, warmup_runs=1, timed_runs=20,
                                          min_timed_seconds=0.0))
    print(f"inference_latency_p50_seconds: {r['latency_p50_seconds']:.4f} (at least 0.010)")


def compiled_step() -> None:
    model = ModelConfig(name="mlp", depth=4, width=256, input_shape=[1, 16, 16])
    measure = MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, flops=False, memory_breakdown=False)
    r = train_point(PointSpec(model=model, data=DIGITS, train=TrainConfig(seed=1, compile=True), measure=measure,
                              point=GridPoint(16, 1, 1), lr=0.05, steps=8), WorkerContext())
    print(f"compile_step_over_step_time: {r['compile_step_seconds'] / r['step_time_seconds']:.0f}")


def sampler_stop() -> None:
    sampler = telemetry.UtilizationSampler(interval_seconds=10.0).start()
    began = time.perf_counter()
    sampler.stop()
    print(f"sampler_stop_seconds: {time.perf_counter() - began:.4f} (its interval: 10)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (a worker's one core: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    inference_forward()
    rate = bandwidth.measure_cpu_bandwidth(threads=1)
    print(f"cpu_bandwidth_bytes_per_second: {rate.bytes_per_second:.3e} ({rate.source})")
    compiled_step()
    sampler_stop()
    share = training_step()
    print(f"training_step_share_of_known_rate: {share:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
