"""The critical batch size from one trunk and its branches, against the grid: per model (MLP/digits, a
BatchNorm-free MLP that learns, with AdamW; ResNet-18/digits with SGD), one branch sweep, the grid with
sweep.seeds=[0,1,2] (the answer that holds up), and the branches' schedule trained from scratch as one point.

    python scripts/bench_branch.py [--out DIR] [--models mlp,resnet18] [--quick] [--reuse] [--evaluations 40]

Prints, per model:
- compute: the branch sweep's point-seconds over the 3-seed grid's (goal <= 35 %), and over the one-seed grid's
  (its seed-0 points);
- agreement: whether the branch sweep's constant recommendation has the grid's recommended global batch, or the
  grid's own eligibility rule (non-inferiority) keeps it ("agree") or not ("disagree");
- the critical batch size three ways: branched (where it flattens, with the next global batch tried), the grid
  fit's B_crit with its interval (steps to the target below against the global batch), the mean B_simple;
- the schedule: the target is the trunk's final validation loss plus the branches' tolerance there; the steps
  and wall time the schedule point takes to it against the trunk's global batch (the grid's seed-0 point of the
  trunk's layout: the trunk itself, trained again), goal >= 30 % fewer optimizer steps; and every constant global
  batch of the grid that reaches it (mean over its seeds), side by side; whether the recommendation (schedule or
  constant) was the faster one.
--quick: a tiny MLP with a short budget: checks the script runs. --reuse: keep the grid already run for the same
target (the branch sweep and the schedule point run again).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

import yaml
from _sweeps import run_sweep
from mlflow.tracking import MlflowClient

GRID = ["data=digits", "sweep.micro_batch_sizes=[16,64]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1,2]",
        "cluster.include_dashboard=false"]
MODELS = {
    # seed 003's MLP, 8 x 1024 (BatchNorm-free); AdamW with the square-root rule from the trunk's batch
    "mlp": ["model=mlp", "optim=adamw", "optim.lr=0.003", "train.lr_scaling=sqrt", "train.base_batch_size=16",
            "train.epochs=8"],
    # the README demo's ResNet-18 and SGD, square-root rule as the demo
    "resnet18": ["model=resnet18", "optim=sgd", "optim.lr=0.05", "train.lr_scaling=sqrt", "train.base_batch_size=16",
                 "train.epochs=2"],
}
QUICK = ["data=digits", "model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]", "optim=adamw",
         "optim.lr=0.003", "train.lr_scaling=sqrt", "train.base_batch_size=16", "train.epochs=2",
         "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1]",
         "measure.warmup_steps=2", "measure.windows=3", "smart.throughput_steps=12", "measure.flops=false",
         "cluster.include_dashboard=false"]


class Sweep:
    """A finished sweep read back from its MLflow store."""

    def __init__(self, folder: Path):
        self.client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        experiment = self.client.get_experiment_by_name("sweeper")
        self.runs = self.client.search_runs([experiment.experiment_id], max_results=10_000)
        self.parent = next(r for r in self.runs if r.data.tags.get("sweeper.role") == "sweep")
        self.metrics = dict(self.parent.data.metrics)

    def role(self, role: str) -> list:
        return [r for r in self.runs if r.data.tags.get("sweeper.role") == role]

    def points(self) -> List[dict]:
        return [{**r.data.params, **r.data.metrics, "status": r.data.tags.get("sweeper.status"), "run": r}
                for r in self.role("trial")]

    def artifact(self, path: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            return Path(self.client.download_artifacts(self.parent.info.run_id, path, tmp)).read_text()


def mean(values: List[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def agreement(branch_key: str, grid: Sweep) -> str:
    recommendation = yaml.safe_load(grid.artifact("report/recommendation.yaml"))
    chosen = (recommendation.get("recommendation") or {})
    batch = lambda key: int(key.split("-")[0][2:]) * int(key.split("-")[1][3:]) * int(key.split("-")[2][1:])  # noqa: E731
    if not chosen:
        return "no grid answer to compare"
    if batch(branch_key) == chosen["global_batch_size"]:
        return f"agree (global batch {chosen['global_batch_size']}: grid {chosen['key']}, branch {branch_key})"
    why = (recommendation.get("excluded") or {}).get(branch_key)
    if why is None:
        return f"agree (the grid keeps {branch_key} eligible beside its pick {chosen['key']})"
    return f"disagree (grid picks {chosen['key']}; on {branch_key} it says: {why[:240]})"


def compare(name: str, out: Path, overrides: List[str], reuse: bool, evaluations: int) -> Dict[str, object]:
    figures: Dict[str, object] = {}
    b_folder = out / f"{name}-branch"
    shutil.rmtree(b_folder, ignore_errors=True)
    b_wall = run_sweep(b_folder, [*overrides, "sweep.strategy=branch"])
    branch = Sweep(b_folder)
    answer = json.loads(branch.artifact("branch/answer.json"))
    trunk = branch.role("trunk")[0]
    tol = answer["checkpoints"][-1]["tolerance"] if answer["checkpoints"] else 0.0
    target = trunk.data.metrics["val_loss"] + tol
    every = max(answer["budget_samples"] // evaluations, 1)
    print(f"{name}_branch_wall_seconds: {b_wall:.0f}")
    print(f"{name}_trunk: {trunk.data.tags['sweeper.trial_key']}, final val_loss {trunk.data.metrics['val_loss']:.4f}; "
          f"target val_loss {target:.4f} (+ tolerance {tol:.4f})", flush=True)

    g_folder = out / f"{name}-grid"
    marker = g_folder / "target.json"
    if reuse and marker.exists() and json.loads(marker.read_text()) == {"target": round(target, 6), "every": every}:
        grid = Sweep(g_folder)  # --reuse: the grid this script ran before for the same target (the trunk is the same)
        g_wall = grid.metrics["sweep_wall_seconds"]
    else:
        shutil.rmtree(g_folder, ignore_errors=True)
        g_wall = run_sweep(g_folder, [*overrides, "sweep.seeds=[0,1,2]", f"eval.target_loss={target}",
                                      f"eval.every_samples={every}", "report.objective=throughput"])
        marker.write_text(json.dumps({"target": round(target, 6), "every": every}))
        grid = Sweep(g_folder)
    points = grid.points()
    print(f"{name}_grid_wall_seconds: {g_wall:.0f}", flush=True)

    # compute
    grid_cost = sum(p.get("trial_seconds", 0.0) for p in points)
    one_seed = sum(p.get("trial_seconds", 0.0) for p in points if p.get("seed") == "0")
    cost = branch.metrics["compute_point_seconds"]
    print(f"{name}_branch_point_seconds: {cost:.1f} "
          f"(throughput {branch.metrics['compute_throughput_point_seconds']:.1f}, "
          f"trunk {branch.metrics['compute_trunk_point_seconds']:.1f}, branches "
          f"{branch.metrics['compute_branch_point_seconds']:.1f} in {branch.metrics['branch_runs']:.0f})")
    print(f"{name}_grid_point_seconds: {grid_cost:.1f} (3 seeds, {len(points)} runs); one seed {one_seed:.1f}")
    ratio = cost / grid_cost
    print(f"{name}_compute_ratio: {ratio:.1%} of the 3-seed grid (goal <= 35 %); "
          f"{cost / one_seed:.1%} of the one-seed grid")

    # agreement
    agreed = agreement(answer["constant"], grid)
    print(f"{name}_agreement: {agreed}")

    # the critical batch size three ways
    flat = answer["checkpoints"][-1] if answer["checkpoints"] else None
    branched = f"{flat['critical_batch_size']} to {flat['next_tried'] or 'beyond the grid'}" if flat else "none"
    fit = grid.metrics.get("critical_batch_size")
    fit_text = (f"{fit:.1f} [{grid.metrics.get('critical_batch_size_low', float('nan')):.1f}, "
                f"{grid.metrics.get('critical_batch_size_high', float('nan')):.1f}]" if fit is not None else
                f"no fit ({grid.parent.data.tags.get('sweeper.critical_batch', 'no reason recorded')})")
    b_simple = grid.metrics.get("gns_b_simple_mean")
    over = ", ".join("{}@{}".format(c["critical_batch_size"], c["samples"]) for c in answer["checkpoints"])
    simple = f"mean B_simple {b_simple:.1f}" if b_simple is not None else "no B_simple"
    print(f"{name}_critical_batch: branched {branched} (over training: {over}); grid fit B_crit {fit_text}; {simple}")

    # the schedule, trained from scratch, against every constant global batch
    by_batch = defaultdict(list)
    for p in points:
        if p["status"] == "ok":
            by_batch[int(p["global_batch_size"])].append(p)
    base = answer["base_global_batch"]
    trunk_layout = trunk.data.tags["sweeper.trial_key"].split("trunk-")[1].rsplit("-s", 1)[0]
    replica = next((p for p in points if p["point"] == trunk_layout and p.get("seed") == "0"), None)
    trunk_steps = replica.get("steps_to_target") if replica else None
    print(f"{name}_trunk_steps_to_target: {trunk_steps} (the grid's {trunk_layout} seed 0: the trunk trained again)")
    schedule = answer["schedule"]
    s_steps = s_time = None
    if len(schedule) > 1:
        mb, workers = (int(x) for x in _layout(answer["schedule_layouts"][0]))
        first_acc = schedule[0][1] // (mb * workers)
        s_folder = out / f"{name}-schedule"
        shutil.rmtree(s_folder, ignore_errors=True)
        run_sweep(s_folder, [*overrides, f"sweep.micro_batch_sizes=[{mb}]", f"sweep.accumulation_steps=[{first_acc}]",
                             f"sweep.num_workers=[{workers}]", "sweep.seeds=[0]", f"eval.target_loss={target}",
                             f"eval.every_samples={every}",
                             "train.batch_schedule=[" + ",".join(f"[{s},{g}]" for s, g in schedule) + "]"])
        s_point = Sweep(s_folder).points()[0]
        s_steps, s_time = s_point.get("steps_to_target"), s_point.get("time_to_target_seconds")
        fewer = 1 - s_steps / trunk_steps if s_steps and trunk_steps else None
        print(f"{name}_schedule: {schedule}: steps to target {s_steps}, time {s_time and round(s_time, 1)} s, "
              f"final val_loss {s_point.get('val_loss', float('nan')):.4f}; "
              + (f"{fewer:.0%} fewer optimizer steps than the trunk's global batch {base} (goal >= 30 %)"
                 if fewer is not None else "did not reach the target, or the trunk's replica did not"))
    else:
        print(f"{name}_schedule: a constant global batch ({schedule}): nothing to train apart")
    rows = []
    for g in sorted(by_batch):
        reached = [p for p in by_batch[g] if p.get("reached_target") == 1.0]
        steps = mean([p["steps_to_target"] for p in reached])
        seconds = mean([p["time_to_target_seconds"] for p in reached])
        rows.append((g, len(reached), len(by_batch[g]), steps, seconds))
        print(f"{name}_constant_{g}: {len(reached)} of {len(by_batch[g])} runs reached the target; "
              + (f"mean steps {steps:.0f}, mean time {seconds:.1f} s" if reached else "-"))
    fastest = min((r for r in rows if r[1]), key=lambda r: r[4], default=None)
    picked = "schedule" if answer["recommend_schedule"] else answer["constant"]
    if fastest is not None:
        best_constant_time = fastest[4]
        winner = "the schedule" if s_time is not None and s_time < best_constant_time else f"constant {fastest[0]}"
        print(f"{name}_recommendation: {picked} (predicted schedule {answer['schedule_predicted_seconds']:.3g} s, "
              f"constant {answer['constant_predicted_seconds']:.3g} s); measured fastest to the target: {winner} "
              f"({s_time and round(s_time, 1)} s schedule, {best_constant_time:.1f} s constant {fastest[0]})")
    figures.update(ratio=ratio, agreement=agreed.split(" (")[0], schedule_steps=s_steps, trunk_steps=trunk_steps)
    return figures


def _layout(key: str):
    parts = key.split("-")
    return int(parts[0][2:]), int(parts[2][1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".sweeper/bench_branch")
    parser.add_argument("--models", default="mlp,resnet18")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--evaluations", type=int, default=40,
                        help="evaluations over the budget, for the steps to the target (each costs a validation pass: "
                             "ResNet-18's are dear, use ~10)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a grid already under --out for the same target (the branch sweep runs again)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    cases = {"quick_mlp": QUICK} if args.quick else {name: [*GRID, *MODELS[name]] for name in args.models.split(",")}
    results = {}
    for name, overrides in cases.items():
        print(f"config_{name}: {' '.join(overrides)}", flush=True)
        results[name] = compare(name, out, overrides, args.reuse, args.evaluations)
    (out / "summary.json").write_text(json.dumps(results, indent=2, default=str))
    print("headline: " + "; ".join(f"{n} {r['ratio']:.1%} of the 3-seed grid's compute, {r['agreement']}"
                                  for n, r in results.items()))


if __name__ == "__main__":
    sys.exit(main())
