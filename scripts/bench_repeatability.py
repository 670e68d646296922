"""Repeatability: the same one-point sweep run several times from scratch (a fresh Ray, fresh worker
processes each time); prints each run's `samples_per_second` and their CV. Beside each sweep, a plain
hand-written loop (bench_overhead's) in a fresh process on one thread measures the machine's own
run-to-run spread: interleaved, so drift of the machine reaches both alike. Prints `name: value`
lines; the last line is the headline (the sweeps' CV across runs; goal <= 3 %).

    python scripts/bench_repeatability.py [--runs 3] [--plain-steps 300] [--out .sweeper/bench_repeat]
        [-- Hydra overrides]

The default plain loop (ResNet-18, digits, micro-batch 32) matches the default sweep; with other
overrides pass --plain-steps 0 or compare with care.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

from _sweeps import parser, read_sweep, run_sweep, start

DEFAULT = [
    "model=resnet18",
    "data=digits",
    "train.epochs=3",
    "sweep.micro_batch_sizes=[32]",
    "sweep.accumulation_steps=[1]",
    "sweep.num_workers=[1]",
]


def main() -> None:
    options = parser(__doc__, ".sweeper/bench_repeat", DEFAULT)
    options.add_argument("--runs", type=int, default=3)
    options.add_argument("--plain-steps", type=int, default=300, help="0: no plain-loop reference")
    args = options.parse_args()
    out, overrides = start(args, DEFAULT)

    rates, plain = [], []
    for i in range(args.runs):
        if args.plain_steps:
            plain.append(plain_rate(args.plain_steps))
            print(f"run{i}_plain_loop_samples_per_second: {plain[-1]:.1f}")
        folder = out / f"run{i}"
        run_sweep(folder, overrides)
        _, children = read_sweep(folder)
        (child,) = children
        rates.append(child["samples_per_second"])
        print(
            f"run{i}_samples_per_second: {child['samples_per_second']:.1f} "
            f"(within-run cv {child['samples_per_second_cv']:.1%}, stable windows {child['stable_windows_used']:.0f})"
        )
    if plain:
        print(f"plain_loop_cv_across_runs: {cv(plain):.2%} (the machine's own spread, fresh processes)")
    mean = statistics.fmean(rates)
    print(f"mean_samples_per_second: {mean:.1f}")
    # Sample stdev: with three runs the population form would understate the spread by ~18 %.
    print(f"cv_across_runs: {cv(rates):.2%}")


def cv(values) -> float:
    # One run has no spread to report (and stdev needs two values).
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


PLAIN = """
import torch
torch.set_num_threads(1)
from bench_overhead import plain_loop
from sweeper.config import DataConfig, ModelConfig
model, data = ModelConfig(name="resnet18", input_shape=[3, 32, 32]), DataConfig(name="digits")
print(plain_loop(model, data, 32, 1, {steps}, 3, 0.05))
"""


def plain_rate(steps: int) -> float:
    """bench_overhead's plain loop in a fresh process (samples/s), as a sweep's trial starts fresh."""
    done = subprocess.run([sys.executable, "-c", PLAIN.format(steps=steps)], cwd=Path(__file__).parent,
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
