"""Repeatability: the same one-point sweep run several times from scratch (a fresh Ray, fresh worker
processes each time); prints each run's `samples_per_second` and their CV. Prints `name: value`
lines; the last line is the headline (CV across runs; goal <= 3 %).

    python scripts/bench_repeatability.py [--runs 3] [--out .sweeper/bench_repeat] [-- Hydra overrides]
"""

from __future__ import annotations

import statistics

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
    args = options.parse_args()
    out, overrides = start(args, DEFAULT)

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
