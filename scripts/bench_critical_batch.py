"""The critical batch size against what it predicts: a real MLP/digits sweep over global batches
(micro-batch 16 x accumulation 1..16) to a target accuracy, each global batch at its best LR
multiplier (Shallue et al. 2019: steps to a result are compared at the tuned LR); the fit
S = S_min (1 + B_crit / B) on every global batch but the largest predicts the largest's steps to the
target; and B_crit set beside the gradient noise scale B_simple the points measured. Prints
`name: value` lines; the last line is the headline (the held-out prediction's error; goal <= 25 %;
B_crit and B_simple within a factor of 3).

    python scripts/bench_critical_batch.py [--out .sweeper/bench_critical] [-- Hydra overrides]
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from _sweeps import parser, read_sweep, run_sweep, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sweeper.report.critical_batch import fit, fit_with_interval  # noqa: E402

DEFAULT = [
    "model=mlp", "model.depth=2", "model.width=128", "model.input_shape=[1,8,8]", "data=digits",
    "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1,2,4,8,16]", "sweep.num_workers=[1]",
    "sweep.lr_multipliers=[0.5,1,2]", "sweep.seeds=[0,1]", "train.epochs=40", "train.lr_scaling=linear",
    "train.base_batch_size=16", "train.warmup_steps=5", "optim.lr=0.05", "optim.momentum=0.9",
    "eval.every_samples=128", "eval.target_accuracy=0.93", "eval.stop_at_target=true",
    "measure.memory_breakdown=false", "measure.flops=false", "cluster.include_dashboard=false",
]


def best_steps(children):
    """Per global batch: the mean steps to the target over seeds at its best LR multiplier (one that
    reached it in every seed), and the mean B_simple of its points."""
    by_point = defaultdict(list)
    for child in children:
        if child.get("status") == "ok":
            by_point[(int(child["global_batch_size"]), child["lr_multiplier"])].append(child)
    steps, noise = {}, defaultdict(list)
    for (batch, _), runs in by_point.items():
        noise[batch] += [r["gns_b_simple_train_avg"] for r in runs if "gns_b_simple_train_avg" in r]
        if all(r.get("reached_target") == 1.0 for r in runs):
            mean = statistics.fmean(r["steps_to_target"] for r in runs)
            steps[batch] = min(steps.get(batch, mean), mean)
    return steps, {b: statistics.fmean(v) for b, v in noise.items() if v}


def main() -> None:
    args = parser(__doc__, ".sweeper/bench_critical", DEFAULT).parse_args()
    out, overrides = start(args, DEFAULT)
    wall = run_sweep(out, overrides)
    _, children = read_sweep(out)
    steps, noise = best_steps(children)
    print(f"sweep_wall_seconds: {wall:.0f}")
    for batch in sorted(steps):
        print(f"steps_to_target_at_{batch}: {steps[batch]:.1f} (B_simple {noise.get(batch, float('nan')):.1f})")
    batches = sorted(steps)
    if len(batches) < 3:
        sys.exit(f"only {len(batches)} global batches reached the target in every seed: lower "
                 "eval.target_accuracy or raise train.epochs")
    held_out = batches[-1]
    known = fit([(b, steps[b]) for b in batches[:-1]])
    full = fit_with_interval([(b, steps[b]) for b in batches])
    if known is None or full is None:
        sys.exit("the steps to the target show no diminishing return to fit")
    predicted = known.steps(held_out)
    b_simple = statistics.fmean(noise.values()) if noise else float("nan")
    print(f"fit_without_{held_out}: B_crit {known.critical_batch_size:.1f}, S_min {known.s_min:.1f}, "
          f"R^2 {known.r_squared:.3f}")
    print(f"critical_batch_size: {full.critical_batch_size:.1f} (95 % interval {full.low:.1f}-{full.high:.1f}, "
          f"R^2 {full.r_squared:.3f})")
    print(f"mean_b_simple: {b_simple:.1f}")
    print(f"b_crit_over_b_simple: {full.critical_batch_size / b_simple:.2f} (goal: within a factor of 3)")
    print(f"held_out_{held_out}_steps: predicted {predicted:.1f}, measured {steps[held_out]:.1f}")
    print(f"held_out_prediction_error: {abs(predicted / steps[held_out] - 1):.1%}")


if __name__ == "__main__":
    main()
