"""Repeatability: the same one-point sweep run several times from scratch (a fresh Ray, fresh worker
processes each time); prints each run's `samples_per_second` and their CV. Prints `name: value`
lines; the last line is the headline (CV across runs; goal <= 3 %).

    python scripts/bench_repeatability.py [--runs 3] [--out .sweeper/bench_repeat] [-- Hydra overrides]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from _sweeps import read_sweep, run_sweep

DEFAULT = [
    "model=resnet18",
    "data=digits",
    "train.epochs=3",
    "sweep.micro_batch_sizes=[32]",
    "sweep.accumulation_steps=[1]",
    "sweep.num_workers=[1]",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=".sweeper/bench_repeat")
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides (default: {' '.join(DEFAULT)})")
    args = parser.parse_args()
    overrides = args.overrides or DEFAULT
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    print(f"config: {' '.join(overrides)}")

    rates = []
    for i in range(args.runs):
        folder = out / f"run{i}"
        run_sweep(folder, overrides)
        _, children = read_sweep(folder)
        (child,) = children
        rates.append(child["samples_per_second"])
        print(
            f"run{i}_samples_per_second: {child['samples_per_second']:.1f} "
            f"(within-run cv {child['samples_per_second_cv']:.1%}, stable windows {child['stable_windows_used']:.0f})"
        )
    mean = statistics.fmean(rates)
    print(f"mean_samples_per_second: {mean:.1f}")
    print(f"cv_across_runs: {statistics.pstdev(rates) / mean:.2%}")


if __name__ == "__main__":
    main()
