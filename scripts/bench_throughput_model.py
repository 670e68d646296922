"""The throughput model (sweeper/report/throughput_model.py) against layouts it never saw: real sweeps of the MLP,
ResNet-18 and GPT workloads under DDP and ZeRO-3 (micro-batch x accumulation {1,2} x workers {1,2}), then, per
sweep, fits to a part of its points that predict the rest, each prediction set beside the layout's measured
throughput. The held-out layouts were measured in the same sweep as the others (same machine, same hour) and
kept out of the fit: a sweep that left them out, then those layouts measured.

Held-out sets, per sweep:
- loo:        each point predicted by the fit to all the others (the report's own error rule);
- micro:      the middle micro-batch's points predicted from the smallest and the largest micro-batch's;
- accumulate: the 2-worker points with accumulation 2 predicted from every 1-worker point and the 2-worker points
              without accumulation (ZeRO-3 gathers at every micro-step: its bytes move with the accumulation);
- workers:    every 2-worker point but one predicted from the 1-worker points and that one (the smallest
              micro-batch without accumulation), which alone gives the fit its bandwidth.

With --goodput: goodput's predicted samples to the target against the measured ones instead, on an MLP/digits
sweep (global batches 8..128) and a small GPT on byte-level text (4..64), 3 seeds each: samples to the target
anchored at the smallest global batch,
predicted at the others from the points' mean gradient noise scale (report/goodput.py), with the Spearman rank
correlation of the predicted and measured times to the target over the points.

Prints `name: value` lines; the last lines are the headline (goal: median absolute error <= 10 %, worst <= 25 %).

    python scripts/bench_throughput_model.py [--out .sweeper/bench_throughput_model] [--only mlp-ddp gpt-zero3 ...]
    python scripts/bench_throughput_model.py --goodput [--only mlp gpt] [--out .sweeper/bench_goodput]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sweeps import run_sweep  # noqa: E402

from sweeper import tracking  # noqa: E402
from sweeper.config import ReportConfig  # noqa: E402
from sweeper.report import folding, goodput, projection  # noqa: E402
from sweeper.report import throughput_model as tm  # noqa: E402
from sweeper.report.analysis import recommend  # noqa: E402
from sweeper.report.recorded import trials_of  # noqa: E402

COMMON = ["sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1,2]", "measure.flops=false", "gns.enabled=false",
          "measure.memory_breakdown=true", "cluster.include_dashboard=false", "report.max_accuracy_drop=null"]
WORKLOADS: Dict[str, List[str]] = {
    "mlp": ["model=mlp", "model.depth=4", "model.width=512", "data=synthetic", "data.num_samples=8192",
            "sweep.micro_batch_sizes=[16,32,64]", "train.samples=65536", "optim=sgd", "optim.lr=0.01"],
    "resnet18": ["model=resnet18", "data=synthetic", "data.num_samples=2048", "sweep.micro_batch_sizes=[8,16,32]",
                 "train.samples=4096", "optim=sgd", "optim.lr=0.01"],
    "gpt": ["model=gpt", "data=text", "data.val_fraction=0.02", "sweep.micro_batch_sizes=[4,8,16]",
            "train.samples=8192", "optim=adamw", "optim.lr=0.001"],
}
# Goodput's sweeps, 3 seeds each: the noise scale is measured where a step has more than one micro-batch
# (worker/gns.py), so the global batches are one micro-batch x accumulation 1..16 (all but the first measure it).
GOODPUT_COMMON = ["sweep.accumulation_steps=[1,2,4,8,16]", "sweep.num_workers=[1]", "sweep.seeds=[0,1,2]",
                  "eval.every_samples=256", "eval.stop_at_target=true", "measure.memory_breakdown=false",
                  "measure.flops=false", "cluster.include_dashboard=false", "report.objective=time_to_target"]
GOODPUT: Dict[str, List[str]] = {
    "mlp": ["model=mlp", "model.depth=2", "model.width=128", "model.input_shape=[1,8,8]", "data=digits",
            "sweep.micro_batch_sizes=[8]", "train.epochs=60", "train.lr_scaling=sqrt", "train.base_batch_size=16",
            "train.warmup_steps=5", "optim=sgd", "optim.lr=0.05", "optim.momentum=0.9",
            "eval.target_accuracy=0.93"],
    # a small byte-level GPT to a loss of 2.5 nats per byte (3.6 bits; the text's unigram entropy is ~4.4)
    "gpt": ["model=gpt", "model.n_layer=2", "model.n_head=2", "model.d_model=64", "model.context=32", "data=text",
            "data.val_fraction=0.02", "sweep.micro_batch_sizes=[4]", "train.samples=16384", "train.lr_scaling=sqrt",
            "train.base_batch_size=8", "train.warmup_steps=5", "optim=adamw", "optim.lr=0.003",
            "eval.target_loss=2.5"],
}


def trials_in(folder: Path):
    reader = tracking.SweepReader.of(f"sqlite:///{folder / 'mlflow.db'}", "sweeper")
    return trials_of(reader.load())


def held_out_sets(observed: Sequence[tm.Observed]) -> Dict[str, List[Tuple[List[str], List[str]]]]:
    """Scheme -> [(keys fitted, keys predicted)]."""
    keys = [o.key for o in observed]
    by = {o.key: o.layout for o in observed}
    micros = sorted({layout.micro_batch_size for layout in by.values()})
    two = [k for k in keys if by[k].num_workers == 2]
    sets: Dict[str, List[Tuple[List[str], List[str]]]] = {
        "loo": [([k for k in keys if k != left], [left]) for left in keys]}
    if len(micros) >= 3:
        middle = [k for k in keys if by[k].micro_batch_size == micros[1]]
        sets["micro"] = [([k for k in keys if k not in middle], middle)]
    accumulating = [k for k in two if by[k].accumulation_steps == 2]
    if accumulating and len(accumulating) < len(two):
        sets["accumulate"] = [([k for k in keys if k not in accumulating], accumulating)]
    anchor = min(two, key=lambda k: (by[k].accumulation_steps, by[k].micro_batch_size), default=None)
    if anchor is not None and len(two) > 1:
        sets["workers"] = [([k for k in keys if by[k].num_workers == 1] + [anchor], [k for k in two if k != anchor])]
    return sets


def evaluate(name: str, folder: Path, stable: Optional[List[float]] = None) -> List[float]:
    """Every held-out prediction's relative error of this sweep's points, printed (those of points whose own
    throughput was stable, within 5 % over its last windows, also into `stable`)."""
    layouts = [t for t in folding.fold_layouts(trials_in(folder)) if t.status == "ok" and t.samples_per_second]
    for t in sorted(layouts, key=lambda t: (t.num_workers, t.micro_batch_size, t.accumulation_steps)):
        print(f"  measured {t.key}: {t.samples_per_second:,.1f} samples/s, windows' cv {t.samples_per_second_cv:.1%}"
              f"{'' if t.throughput_stable else ' (unstable)'}")
    errors: List[float] = []
    for group in sorted({tm.group_of(t) for t in layouts}, key=str):
        members = [t for t in layouts if tm.group_of(t) == group]
        full = tm.fit_group(group, members)
        if full is None:
            print(f"{name} {tm.group_label(group)}: no fit")
            continue
        print(f"{name} {tm.group_label(group)}: {len(members)} points, {full.coefficients}")
        for key, why in full.excluded.items():
            print(f"  left out of every fit: {key}: {why}")
        for scheme, splits in held_out_sets(full.observed).items():
            found = []
            for fitted, predicted in splits:
                model = tm.fit_group(group, [t for t in members if t.key in fitted])
                for t in (t for t in members if t.key in predicted):
                    got = None if model is None else model.predict(tm.Layout(t.micro_batch_size,
                                                                             t.accumulation_steps, t.num_workers))
                    if got is None:
                        print(f"  {scheme} {t.key}: not predicted")
                        continue
                    error = got.samples_per_second / t.samples_per_second - 1
                    found.append(error)
                    if stable is not None and t.throughput_stable:
                        stable.append(error)
                    print(f"  {scheme} {t.key}: predicted {got.samples_per_second:,.1f}, measured "
                          f"{t.samples_per_second:,.1f} samples/s, error {error:+.1%}")
            if found:
                print(f"  {scheme}: median |error| {statistics.median(abs(e) for e in found):.1%}, worst "
                      f"{max(abs(e) for e in found):.1%}, n={len(found)}")
            errors += found
    return errors


def measure(folder: Path, overrides: Sequence[str], reuse: bool) -> float:
    """Run the sweep into `folder` (its wall seconds), or with `reuse` read the one already there (0)."""
    return 0.0 if reuse else run_sweep(folder, overrides)


def throughput_bench(out: Path, only: Sequence[str], reuse: bool) -> None:
    every: List[float] = []
    stable: List[float] = []
    for workload, settings in WORKLOADS.items():
        for parallelism in ("ddp", "zero3"):
            name = f"{workload}-{parallelism}"
            if only and name not in only:
                continue
            overrides = [*settings, *COMMON, f"sweep.parallelism=[{parallelism}]"]
            print(f"config {name}: {' '.join(overrides)}")
            wall = measure(out / name, overrides, reuse)
            print(f"{name} sweep_wall_seconds: {wall:.0f}")
            found = evaluate(name, out / name, stable)
            every += found
            if found:
                print(f"{name}: median |error| {statistics.median(abs(e) for e in found):.1%}, worst "
                      f"{max(abs(e) for e in found):.1%}, n={len(found)}")
    if stable:
        print(f"stable points: median |error| {statistics.median(abs(e) for e in stable):.1%}, worst "
              f"{max(abs(e) for e in stable):.1%}, n={len(stable)}")
    if every:
        print(f"all: median |error| {statistics.median(abs(e) for e in every):.1%} (goal <= 10 %), worst "
              f"{max(abs(e) for e in every):.1%} (goal <= 25 %), n={len(every)}")


def goodput_bench(out: Path, workload: str, reuse: bool) -> None:
    overrides = [*GOODPUT[workload], *GOODPUT_COMMON]
    print(f"config goodput-{workload}: {' '.join(overrides)}")
    wall = measure(out / workload, overrides, reuse)
    print(f"goodput-{workload} sweep_wall_seconds: {wall:.0f}")
    trials = trials_in(out / workload)
    rec = recommend(trials, "time_to_target")
    projected = projection.project(rec, trials, ReportConfig(objective="time_to_target"),
                                   {"eval_every_samples": "256"})
    if projected.noise is None or projected.anchor is None:
        print(f"goodput-{workload}: no noise scale or no point reached the target in every seed: raise the budget")
        return
    print(f"noise_scale: {projected.noise.value:.1f} ({projected.noise.source})")
    print(f"anchor: {projected.anchor.key}, global batch {projected.anchor.global_batch}, "
          f"{projected.anchor.samples:,.0f} samples to the target")
    errors = []
    for r in sorted(projected.ranked, key=lambda r: r.candidate.global_batch):
        measured = r.candidate.measured_samples
        if measured is None:
            print(f"{r.candidate.key}: predicted {r.predicted_samples:,.0f} samples, measured: not reached in every "
                  "seed")
            continue
        error = r.predicted_samples / measured - 1
        if r.candidate.global_batch != projected.anchor.global_batch:
            errors.append(error)
        print(f"{r.candidate.key}: predicted {r.predicted_samples:,.0f} samples, measured {measured:,.0f} "
              f"({error:+.1%}); predicted {r.predicted_seconds:.1f} s, measured {r.candidate.measured_seconds:.1f} s")
    both = [(r.predicted_samples, r.candidate.measured_samples) for r in projected.ranked
            if r.candidate.measured_samples is not None]
    samples_rho = goodput.spearman([p for p, _ in both], [m for _, m in both])
    if errors:
        print(f"samples_to_target: median |error| {statistics.median(abs(e) for e in errors):.1%}, worst "
              f"{max(abs(e) for e in errors):.1%}, n={len(errors)} (the anchor left out)")
    print(f"spearman_samples_to_target: {samples_rho if samples_rho is None else f'{samples_rho:+.2f}'}")
    rho = projected.agreement
    print(f"spearman_time_to_target: {rho if rho is None else f'{rho:+.2f}'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", nargs="*", default=[], help="e.g. mlp-ddp gpt-zero3 (with --goodput: mlp gpt)")
    parser.add_argument("--goodput", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="read sweeps already in --out instead of running them")
    args = parser.parse_args()
    out = Path(args.out or (".sweeper/bench_goodput" if args.goodput else ".sweeper/bench_throughput_model")).resolve()
    if args.goodput:
        for workload in GOODPUT:
            if not args.only or workload in args.only:
                goodput_bench(out, workload, args.reuse)
    else:
        throughput_bench(out, args.only, args.reuse)


if __name__ == "__main__":
    main()
