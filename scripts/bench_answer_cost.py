"""The same answer for less compute: the demo grid (micro-batch [16,64] x accumulation [1,2] x workers
[1,2]) with 3 seeds and 2 LR multipliers, on MLP/digits and on resnet18/digits, measured three times per
model: sweep.strategy=grid (every point trains its whole budget), sweep.strategy=smart with every rung
from step 0 (smart.continue_rungs=false, the strategy before checkpoints) and smart with each rung
continuing from the one before's checkpoint. Prints, per model, the point-seconds each spent (the grid:
its points' trial_seconds; smart: its measurement runs' compute_point_seconds) and smart's ratio to the
grid (goal <= 35 %) before and after continuation, smart's own estimate of the grid against the grid
measured, and whether the recommendations agree: the same point, the same layout (another LR
multiplier), within the noise (on the full grid's records, the two points' accuracy intervals over
seeds overlap and their throughputs lie within twice the larger of their windows' spread), or not.

    python scripts/bench_answer_cost.py [--out DIR] [--models mlp,resnet18] [--epochs 2] [--seeds [0,1,2]]
        [--lr-multipliers [1,2]] [--quick] [--reuse]

--quick: one tiny MLP grid (2 x 2 layouts, 2 seeds, 2 multipliers, 1 epoch): checks the script runs.
--reuse: keep the sweeps already under --out (say, the grid's) and run only the missing ones.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml
from _sweeps import run_sweep
from mlflow.tracking import MlflowClient
from scipy.stats import t as student_t

DEMO_GRID = ["sweep.micro_batch_sizes=[16,64]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1,2]",
             "train.lr_scaling=sqrt", "train.base_batch_size=32",
             ]  # epochs, seeds and LR multipliers: --epochs, --seeds, --lr-multipliers
COMMON = ["data=digits", "cluster.include_dashboard=false"]
MODELS = {
    # seed 003's MLP, 8 x 1024 (BatchNorm-free), with the recipe experiment's AdamW: with SGD at 0.05 it sits
    # on its initial plateau (val loss ln 10) for most of 2 epochs, where no rung can rank anything
    "mlp": ["model=mlp", "optim=adamw", "optim.lr=0.003"],
    "resnet18": ["model=resnet18", "optim.lr=0.05"],  # the README demo's; BatchNorm: classes keep the micro-batch
}
QUICK = ["model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]",
         "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1]",
         "sweep.seeds=[0,1]", "sweep.lr_multipliers=[1,2]", "train.epochs=1", "measure.warmup_steps=2",
         "measure.windows=3", "smart.throughput_steps=12", "measure.flops=false"]


def read(folder: Path) -> Tuple[Dict[str, float], Dict[str, str], List[dict]]:
    """The sweep's parent metrics, its recommendation (report/recommendation.yaml) and its points."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sweeper")
    runs = client.search_runs([experiment.experiment_id], max_results=10_000)
    parent = next(r for r in runs if r.data.tags.get("sweeper.role") == "sweep")
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(parent.info.run_id, "report/recommendation.yaml", tmp)
        recommendation = yaml.safe_load(Path(path).read_text())
    points = [{**r.data.params, **r.data.metrics, "status": r.data.tags.get("sweeper.status")}
              for r in runs if r.data.tags.get("sweeper.role") == "trial"]
    return dict(parent.data.metrics), recommendation, points


def picked(recommendation: dict) -> Optional[str]:
    chosen = recommendation.get("recommendation") or {}
    return chosen.get("key")


def by_point(points: List[dict]) -> Dict[str, List[dict]]:
    out = defaultdict(list)
    for p in points:
        out[p["point"]].append(p)
    return out


def interval(values: List[float], level: float = 0.95) -> Tuple[float, float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = student_t.ppf(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def agreement(grid_pick: Optional[str], smart_pick: Optional[str], grid_points: List[dict]) -> str:
    """How the smart strategy's answer relates to the full grid's, judged on the full grid's records."""
    if grid_pick is None or smart_pick is None:
        return f"no answer to compare (grid {grid_pick}, smart {smart_pick})"
    if grid_pick == smart_pick:
        return "same point"
    layout = lambda key: key.split("-lrx")[0]  # noqa: E731
    if layout(grid_pick) == layout(smart_pick):
        return "same layout (another LR multiplier)"
    points = by_point(grid_points)
    ok = {key: [p for p in runs if p["status"] == "ok"] for key, runs in points.items()}
    a, b = ok.get(grid_pick), ok.get(smart_pick)
    if not a or not b:
        return f"disagree ({smart_pick} has no ok record in the full grid)"
    acc_a = interval([p["val_accuracy"] for p in a])
    acc_b = interval([p["val_accuracy"] for p in b])
    rate_a = statistics.fmean(p["samples_per_second"] for p in a)
    rate_b = statistics.fmean(p["samples_per_second"] for p in b)
    cv = max(statistics.fmean(p.get("samples_per_second_cv", 0.0) for p in runs) for runs in (a, b))
    accuracy_tied = acc_b[1] <= acc_a[2] and acc_a[1] <= acc_b[2]
    rate_tied = abs(rate_b / rate_a - 1) <= 2 * cv
    words = (f"grid's {grid_pick}: val acc {acc_a[0]:.3f} [{acc_a[1]:.3f}, {acc_a[2]:.3f}], {rate_a:.0f} samples/s; "
             f"smart's {smart_pick} in the full grid: val acc {acc_b[0]:.3f} [{acc_b[1]:.3f}, {acc_b[2]:.3f}], "
             f"{rate_b:.0f} samples/s; windows' cv {cv:.1%}")
    if accuracy_tied and rate_tied:
        return f"within the noise ({words})"
    return f"disagree ({words})"


# smart before and after its rungs continued from checkpoints (smart.continue_rungs), beside the grid
STRATEGIES = {"grid": ["sweep.strategy=grid"],
              "smart-from-step-0": ["sweep.strategy=smart", "smart.continue_rungs=false"],
              "smart": ["sweep.strategy=smart"]}


def compare(name: str, out: Path, overrides: List[str], reuse: bool) -> Dict[str, object]:
    figures: Dict[str, object] = {}
    for strategy, chosen in STRATEGIES.items():
        folder = out / f"{name}-{strategy}"
        if reuse and (folder / "mlflow.db").exists():
            metrics, _, _ = read(folder)  # a sweep this script ran before (--reuse): its own wall time
            wall = metrics["sweep_wall_seconds"]
        else:
            shutil.rmtree(folder, ignore_errors=True)
            wall = run_sweep(folder, [*overrides, *chosen])
        metrics, recommendation, points = read(folder)
        figures[strategy] = (wall, metrics, recommendation, points)
        print(f"{name}_{strategy}_wall_seconds: {wall:.0f}", flush=True)
    g_wall, g_metrics, g_rec, g_points = figures["grid"]
    grid_cost = sum(p.get("trial_seconds", 0.0) for p in g_points)
    _, before, before_rec, _ = figures["smart-from-step-0"]
    print(f"{name}_smart_from_step_0_compute_ratio: {before['compute_point_seconds'] / grid_cost:.1%} of the full grid "
          f"(every rung from step 0); recommendation {picked(before_rec)}, "
          f"{agreement(picked(g_rec), picked(before_rec), g_points).split(' (')[0]}")
    s_wall, s_metrics, s_rec, _ = figures["smart"]
    print(f"{name}_smart_continued_runs: {s_metrics.get('smart_continued_runs', 0):.0f}, sparing "
          f"{s_metrics.get('compute_continuation_saved_point_seconds', 0.0):.1f} s of repeated steps")
    smart_cost = s_metrics["compute_point_seconds"]
    estimate = s_metrics.get("full_grid_point_seconds_estimate", float("nan"))
    print(f"{name}_points: {len(g_points)} ({len(by_point(g_points))} points x seeds)")
    print(f"{name}_grid_point_seconds: {grid_cost:.1f}")
    print(f"{name}_smart_point_seconds: {smart_cost:.1f} "
          f"(throughput {s_metrics['compute_throughput_point_seconds']:.1f}, "
          f"accuracy {s_metrics['compute_accuracy_point_seconds']:.1f}, stopped early "
          f"{s_metrics['compute_stopped_point_seconds']:.1f}; {s_metrics['smart_measurement_runs']:.0f} runs, "
          f"{s_metrics['smart_classes_stopped']:.0f} of {s_metrics['smart_accuracy_classes']:.0f} classes stopped)")
    print(f"{name}_smart_estimate_of_grid: {estimate:.1f} point-seconds "
          f"({estimate / grid_cost:.2f} x the grid measured)")
    print(f"{name}_wall_ratio: {s_wall / g_wall:.2f}")
    print(f"{name}_recommendations: grid {picked(g_rec)}, smart {picked(s_rec)}")
    agreed = agreement(picked(g_rec), picked(s_rec), g_points)
    print(f"{name}_agreement: {agreed}")
    ratio = smart_cost / grid_cost
    print(f"{name}_compute_ratio: {ratio:.1%} of the full grid (goal <= 35 %)", flush=True)
    return {"ratio": ratio, "agreement": agreed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".sweeper/bench_answer_cost")
    parser.add_argument("--models", default="mlp,resnet18", help="comma-separated: mlp, resnet18")
    parser.add_argument("--quick", action="store_true", help="one tiny MLP grid: checks the script runs")
    parser.add_argument("--seeds", default="[0,1,2]")
    parser.add_argument("--epochs", type=int, default=2, help="the sample budget of every point")
    parser.add_argument("--lr-multipliers", default="[1,2]")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the sweeps already in --out (e.g. the grid's) and run only the missing ones")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every sweep")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if not args.reuse:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    cases = {"quick_mlp": [*COMMON, *QUICK]} if args.quick else {
        name: [*COMMON, *MODELS[name], *DEMO_GRID, f"train.epochs={args.epochs}", f"sweep.seeds={args.seeds}",
               f"sweep.lr_multipliers={args.lr_multipliers}"] for name in args.models.split(",")}
    results = {}
    for name, overrides in cases.items():
        overrides = [*overrides, *args.overrides]
        print(f"config_{name}: {' '.join(overrides)}", flush=True)
        results[name] = compare(name, out, overrides, args.reuse)
    (out / "summary.json").write_text(json.dumps(results, indent=2))
    print("headline: " + "; ".join(f"{n} {r['ratio']:.1%} of the grid's compute, {r['agreement'].split(' (')[0]}"
                                  for n, r in results.items()))


if __name__ == "__main__":
    sys.exit(main())
