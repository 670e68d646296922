"""The critical batch size from one trunk and its branches, against the grid: per model (MLP/digits, a
BatchNorm-free MLP that learns, with AdamW; ResNet-18/digits with SGD), one branch sweep, the grid with
sweep.seeds=[0,1,2] (the answer that holds up), and the branches' schedule trained from scratch at the same
three seeds.

    python scripts/bench_branch.py [--out DIR] [--models mlp,resnet18] [--quick] [--reuse] [--evaluations 40]
                                   [--branch-seeds 1]

Prints, per model:
- compute: the branch sweep's point-seconds over the 3-seed grid's (goal <= 35 %), and over the one-seed grid's
  (its seed-0 points);
- agreement: whether the branch sweep's constant recommendation has the grid's recommended global batch, or the
  grid's own eligibility rule (non-inferiority) keeps it ("agree") or not ("disagree");
- the critical batch size three ways: branched (where it flattens, with the next global batch tried), the grid
  fit's B_crit with its interval (steps to the target below against the global batch), the mean B_simple;
- the schedule against the trunk's global batch and every layout of the grid, to two targets built on the
  trunk's final validation loss, taken robustly (the least-squares line through the last quarter of its
  evaluations, read at the budget's end, averaged over the grid's three runs of the trunk's layout: the trunk
  and two replicas): plus the tolerance at the last checkpoint (z x the trunks' noise over its tail: the
  issue's target), and plus the standard error of that seed mean (strict: the trunk's own final quality).
  Every run is evaluated at the same sample counts (a multiple of the grid's largest global batch). A run
  reaches a target at its first evaluation whose loss, averaged with its neighbours' (three evaluations,
  centred), is at or below it: one lucky evaluation on a small validation split does not count. Steps are
  optimizer steps to there; seconds are those steps at their layouts' measured step times (the grid's, same
  machine, same run; evaluations left out for every run alike; a schedule span at an accumulation the grid
  did not run is estimated, and said so). A layout or the schedule is ranked only when all three seeds got
  there. Goal: the schedule >= 30 % fewer optimizer steps than the trunk's global batch (the seed mean over
  the seeds where both got there); and whether the recommendation (schedule or constant) was the fastest.
Steps to the target are read from each run's recorded validation curve (MLflow's val_loss_curve, at samples
seen), so the grid does not depend on the branch sweep and --reuse keeps it while the branches change.
--quick: a tiny MLP with a short budget: checks the script runs. --reuse: keep the grid already under --out for
the same overrides and evaluation cadence (the branch sweep and the schedule run again).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml
from _sweeps import run_sweep
from mlflow.tracking import MlflowClient

from sweeper.report.critical_batch import fit_with_interval

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


def mean(values: Sequence[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def agreement(branch_key: str, grid: Sweep) -> str:
    recommendation = yaml.safe_load(grid.artifact("report/recommendation.yaml"))
    chosen = (recommendation.get("recommendation") or {})
    if not chosen:
        return "no grid answer to compare"
    if batch_of(branch_key) == chosen["global_batch_size"]:
        return f"agree (global batch {chosen['global_batch_size']}: grid {chosen['key']}, branch {branch_key})"
    why = (recommendation.get("excluded") or {}).get(branch_key)
    if why is None:
        return f"agree (the grid keeps {branch_key} eligible beside its pick {chosen['key']})"
    return f"disagree (grid picks {chosen['key']}; on {branch_key} it says: {why[:240]})"


def layout_of(key: str) -> Tuple[int, int, int]:
    """(micro-batch, accumulation, workers) of a point key such as mb16-acc2-w1."""
    mb, acc, w = key.split("-")[:3]
    return int(mb[2:]), int(acc[3:]), int(w[1:])


def batch_of(key: str) -> int:
    mb, acc, w = layout_of(key)
    return mb * acc * w


def curve(sweep: Sweep, run) -> List[Tuple[int, float]]:
    """A run's validation loss at each evaluation, by samples seen."""
    return [(int(m.step), m.value) for m in sweep.client.get_metric_history(run.info.run_id, "val_loss_curve")]


def smoothed_final(points: Sequence[Tuple[int, float]], budget: int) -> float:
    """The least-squares line through the evaluations in the last quarter of the budget (loss against samples
    seen), read at the budget's end; their mean with fewer than three."""
    tail = [(x, v) for x, v in points if x >= 0.75 * budget] or points[-1:]
    if len(tail) < 3:
        return statistics.fmean(v for _, v in tail)
    slope, intercept = statistics.linear_regression([x for x, _ in tail], [v for _, v in tail])
    return intercept + slope * budget


def samples_to(points: Sequence[Tuple[int, float]], target: float) -> Optional[int]:
    """The samples seen at the first evaluation whose loss, averaged with its neighbours' (centred, three
    evaluations, two at the ends), is at or below `target`; None: never."""
    values = [v for _, v in points]
    for i, (x, _) in enumerate(points):
        around = values[max(0, i - 1):i + 2]
        if all(math.isfinite(v) for v in around) and statistics.fmean(around) <= target:
            return x
    return None


def steps_over(spans: Sequence[Sequence[int]], samples: int) -> List[int]:
    """Optimizer steps per span of `spans` [(start samples, global batch), ...] to `samples` seen."""
    starts = [int(s[0]) for s in spans] + [math.inf]
    return [max(0, math.ceil((min(samples, starts[i + 1]) - starts[i]) / int(span[1]))) if samples > starts[i] else 0
            for i, span in enumerate(spans)]


def compare(name: str, out: Path, overrides: List[str], reuse: bool, evaluations: int,
            branch_seeds: int = 1) -> Dict[str, object]:
    b_folder = out / f"{name}-branch"
    shutil.rmtree(b_folder, ignore_errors=True)
    seeds = f"sweep.seeds=[{','.join(map(str, range(branch_seeds)))}]"
    b_wall = run_sweep(b_folder, [*overrides, "sweep.strategy=branch", seeds])
    branch = Sweep(b_folder)
    answer = json.loads(branch.artifact("branch/answer.json"))
    budget = answer["budget_samples"]
    # every run evaluated at the same sample counts: a multiple of the grid's largest global batch (a run
    # evaluates every ceil(every / its global batch) steps)
    tried = [int(g) for c in answer["checkpoints"][:1] for g in c["differences"]]
    largest = max([answer["base_global_batch"], *tried, *answer.get("unjudged_global_batches", [])])
    every = max(1, round(budget / evaluations / largest)) * largest
    print(f"{name}_branch_wall_seconds: {b_wall:.0f}", flush=True)

    g_folder = out / f"{name}-grid"
    marker, wanted = g_folder / "grid.json", {"overrides": overrides, "every": every}
    if reuse and marker.exists() and json.loads(marker.read_text()) == wanted:
        grid = Sweep(g_folder)  # --reuse: the grid this script ran before with the same overrides
        g_wall = grid.metrics["sweep_wall_seconds"]
    else:
        shutil.rmtree(g_folder, ignore_errors=True)
        g_wall = run_sweep(g_folder, [*overrides, "sweep.seeds=[0,1,2]", f"eval.every_samples={every}",
                                      "report.objective=throughput"])
        marker.write_text(json.dumps(wanted))
        grid = Sweep(g_folder)
    points = [p for p in grid.points() if p["status"] == "ok"]
    print(f"{name}_grid_wall_seconds: {g_wall:.0f}", flush=True)
    figures: Dict[str, object] = {"ratio": compute(name, branch, grid)}

    agreed = agreement(answer["constant"], grid)
    figures["agreement"] = agreed.split(" (")[0]
    print(f"{name}_agreement: {agreed}")

    # the targets: the trunk's final validation loss, robustly, plus the branches' tolerance (the issue's) or
    # plus the standard error of that seed mean (strict)
    trunk = min(branch.role("trunk"), key=lambda r: r.data.tags["sweeper.trial_key"])  # seed 0's
    trunk_layout = trunk.data.tags["sweeper.trial_key"].split("trunk-")[1].rsplit("-s", 1)[0]
    replicas = sorted((p for p in points if p["point"] == trunk_layout), key=lambda p: p["seed"])
    curves = {(p["point"], p["seed"]): curve(grid, p["run"]) for p in points}  # read once, for both targets
    finals = [smoothed_final(curves[(p["point"], p["seed"])], budget) for p in replicas]
    final = statistics.fmean(finals)
    tol = answer["checkpoints"][-1]["tolerance"] if answer["checkpoints"] else 0.0
    se = statistics.stdev(finals) / math.sqrt(len(finals)) if len(finals) > 1 else 0.0
    print(f"{name}_trunk_final: val_loss {final:.4f}, the trunk's smoothed final loss (seeds "
          f"{', '.join(f'{v:.3f}' for v in finals)}; the seed-0 trunk's own last evaluation "
          f"{trunk.data.metrics['val_loss']:.4f})")

    step_time = {}  # each layout's mean measured step time over the grid's seeds
    for p in points:
        step_time.setdefault(p["point"], []).append(p["step_time_seconds"])
    step_time = {k: statistics.fmean(v) for k, v in step_time.items()}
    ran = run_schedule(out / f"{name}-schedule", overrides, answer, every)
    for label, target, why in (("tolerance", final + tol, f"+ the tolerance at the last checkpoint {tol:.4f}, z x "
                                                          "the trunks' noise over its tail: the issue's"),
                               ("strict", final + se, f"+ its standard error over the seeds {se:.4f}")):
        print(f"{name}_target_{label}: val_loss {target:.4f} ({final:.4f} {why})")
        reached = {run: samples_to(values, target) for run, values in curves.items()}
        critical_batch(f"{name}_{label}", answer, grid, points, reached)
        trunk_steps = {p["seed"]: reached[(trunk_layout, p["seed"])] // answer["base_global_batch"]
                       for p in replicas if reached[(trunk_layout, p["seed"])] is not None}
        print(f"{name}_{label}_trunk_steps_to_target: " + ", ".join(f"seed {s}: {n}" for s, n in trunk_steps.items())
              + f" ({trunk_layout}: the trunk and its replicas; {len(trunk_steps)} of {len(replicas)} got there)")
        got = judge_schedule(f"{name}_{label}", ran, answer, target, step_time, trunk_steps)
        constants(f"{name}_{label}", answer, points, reached, step_time, got)
        figures[label] = {"target": target, **{k: v for k, v in got.items() if k != "seconds"}}
    return figures


def compute(name: str, branch: Sweep, grid: Sweep) -> float:
    points = grid.points()
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
    return ratio


def critical_batch(name: str, answer: dict, grid: Sweep, points: List[dict], reached: dict) -> None:
    """Branched (where it flattens), the grid fit's B_crit (the report's rule: every layout whose every seed
    got to the target, one pair per run), B_simple."""
    flat = answer["checkpoints"][-1] if answer["checkpoints"] else None
    branched = (f"{answer['critical_batch_size_flat']:.0f} fitted; the last checkpoint read "
                f"{flat['critical_batch_size']} to {flat['next_tried'] or 'beyond the grid'}" if flat else "none")
    observations = []
    for key in {p["point"] for p in points}:
        runs = [p for p in points if p["point"] == key]
        got = [reached[(key, p["seed"])] for p in runs]
        if len(runs) == 3 and all(x is not None for x in got):
            observations += [(batch_of(key), x // batch_of(key)) for x in got]
    fit = fit_with_interval(observations)
    fit_text = (f"{fit.critical_batch_size:.1f} [{fit.low or math.nan:.1f}, {fit.high or math.nan:.1f}] over "
                f"{fit.points} global batches" if fit else
                f"no fit ({len({b for b, _ in observations})} global batch(es) got to the target in every seed)")
    b_simple = grid.metrics.get("gns_b_simple_mean")
    over = ", ".join("{}@{}".format(c["critical_batch_size"], c["samples"]) for c in answer["checkpoints"])
    simple = f"mean B_simple {b_simple:.1f}" if b_simple is not None else "no B_simple"
    print(f"{name}_critical_batch: branched {branched} (readings: {over}); grid fit B_crit {fit_text}; {simple}")


def run_schedule(folder: Path, overrides: List[str], answer: dict, every: int
                 ) -> Optional[Dict[str, List[Tuple[int, float]]]]:
    """The branches' schedule trained from scratch at the grid's three seeds: each seed's validation curve
    (None: the schedule is a constant)."""
    spans = answer["schedule"]
    if len(spans) < 2:
        return None
    mb, acc, workers = layout_of(answer["schedule_layouts"][0])
    shutil.rmtree(folder, ignore_errors=True)
    run_sweep(folder, [*overrides, f"sweep.micro_batch_sizes=[{mb}]", f"sweep.accumulation_steps=[{acc}]",
                       f"sweep.num_workers=[{workers}]", "sweep.seeds=[0,1,2]", f"eval.every_samples={every}",
                       "train.batch_schedule=[" + ",".join("[" + ",".join(map(str, s)) + "]" for s in spans) + "]"])
    sweep = Sweep(folder)
    return {p["seed"]: curve(sweep, p["run"]) for p in sweep.points()}


def judge_schedule(name: str, curves: Optional[Dict[str, List[Tuple[int, float]]]], answer: dict, target: float,
                   step_time: Dict[str, float], trunk_steps: Dict[str, int]) -> Dict[str, object]:
    """The schedule's steps and seconds to `target` per seed, against the trunk's global batch."""
    spans = answer["schedule"]
    if curves is None:
        print(f"{name}_schedule: a constant global batch ({spans}): nothing to train apart")
        return {}
    timed = answer.get("schedule_timed_as") or answer["schedule_layouts"]
    per_span, estimated = [], []  # each span's step time: its layout's in the grid, else estimated
    for layout, by in zip(answer["schedule_layouts"], timed):
        if layout in step_time:
            per_span.append(step_time[layout])
        elif by in step_time:  # more accumulation than the grid ran: its timing layout's rate per sample
            per_span.append(step_time[by] * batch_of(layout) / batch_of(by))
            estimated.append(layout)
        else:
            per_span.append(math.nan)
            estimated.append(layout)
    steps, seconds, fewer = {}, {}, []
    for seed in sorted(curves):
        got = samples_to(curves[seed], target)
        if got is None:
            continue
        counts = steps_over(spans, got)
        steps[seed], seconds[seed] = sum(counts), sum(n * t for n, t in zip(counts, per_span))
        if seed in trunk_steps:
            fewer.append(1 - steps[seed] / trunk_steps[seed])
    paired = [s for s in steps if s in trunk_steps]
    mean_fewer = (1 - statistics.fmean(steps[s] for s in paired) / statistics.fmean(trunk_steps[s] for s in paired)
                  if paired else None)
    print(f"{name}_schedule: {spans} on {', '.join(dict.fromkeys(answer['schedule_layouts']))}: "
          + ", ".join(f"seed {s}: {steps[s]} steps, {seconds[s]:.3g} s" for s in steps)
          + f" ({len(steps)} of 3 seeds got to the target"
          + (f"; seconds estimated for {', '.join(estimated)}: not run in the grid, timed at its rate per "
             "sample at less accumulation" if estimated else "") + "); "
          + (f"{mean_fewer:.0%} fewer optimizer steps than the trunk's global batch {answer['base_global_batch']} "
             f"over the {len(paired)} seed(s) where both got there (per seed: "
             f"{', '.join(f'{f:.0%}' for f in fewer)}; goal >= 30 %)" if paired else
             "no seed where both the schedule and the trunk's global batch got to the target"))
    return {"schedule_steps": mean(list(steps.values())), "trunk_steps": mean(list(trunk_steps.values())),
            "fewer_steps": mean_fewer, "schedule_seeds_reached": len(steps), "seconds": mean(list(seconds.values()))}


def constants(name: str, answer: dict, points: List[dict], reached: dict, step_time: Dict[str, float],
              schedule: Dict[str, object]) -> None:
    """Every layout of the grid to the target, by global batch (mean over its seeds; ranked only when every
    seed got there, as the report's critical-batch fit counts a point), and whether the recommendation was
    the faster one."""
    rows = []  # (layout, global batch, mean steps, mean seconds) of the layouts whose every seed got there
    for g in sorted({batch_of(p["point"]) for p in points}):
        parts = []
        for key in sorted({p["point"] for p in points if batch_of(p["point"]) == g}):
            got = [reached[(key, p["seed"])] for p in points if p["point"] == key]
            done = [x for x in got if x is not None]
            text = f"{key} {len(done)} of {len(got)}"
            if done:
                steps = statistics.fmean(x / g for x in done)
                text += f" ({steps:.0f} steps, {steps * step_time[key]:.3g} s)"
                if len(done) == len(got):
                    rows.append((key, g, steps, steps * step_time[key]))
            parts.append(text)
        print(f"{name}_constant_{g}: " + "; ".join(parts) + " got to the target")
    fastest = min(rows, key=lambda r: r[3], default=None)
    picked = "the schedule" if answer["recommend_schedule"] else f"constant {answer['constant']}"
    chosen = next((r for r in rows if r[0] == answer["constant"]), None)
    s_seconds = schedule.get("seconds") if schedule.get("schedule_seeds_reached") == 3 else None
    measured = (f"schedule {'-' if s_seconds is None else f'{s_seconds:.3g} s'}, the recommended constant "
                f"{answer['constant']} {'-' if chosen is None else f'{chosen[3]:.3g} s'}")
    if fastest is None:
        print(f"{name}_recommendation: {picked}; measured to the target: {measured}; no layout got there in every seed")
        return
    winner = "the schedule" if s_seconds is not None and s_seconds < fastest[3] else f"constant {fastest[0]}"
    tied = [r[0] for r in rows if r[0] != fastest[0] and f"{r[3]:.3g}" == f"{fastest[3]:.3g}"]
    winner += f" (tied with {', '.join(tied)} at 3 significant digits)" if tied else ""
    print(f"{name}_recommendation: {picked} (predicted: schedule {answer['schedule_predicted_seconds']:.3g} s, "
          f"constant {answer['constant_predicted_seconds']:.3g} s); measured to the target (every seed there): "
          f"{measured}, the fastest constant {fastest[0]} {fastest[3]:.3g} s: fastest of all {winner}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".sweeper/bench_branch")
    parser.add_argument("--models", default="mlp,resnet18")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--evaluations", type=int, default=40,
                        help="evaluations over the budget, for the steps to the target (each costs a validation pass: "
                             "ResNet-18's are dear, use ~10)")
    parser.add_argument("--branch-seeds", type=int, default=1,
                        help="replicate trunks of the branch sweep (sweep.seeds=[0..n-1]; the grid keeps its three)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a grid already under --out for the same overrides and cadence (the branch sweep and "
                             "the schedule run again)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    cases = {"quick_mlp": QUICK} if args.quick else {name: [*GRID, *MODELS[name]] for name in args.models.split(",")}
    results = {}
    for name, overrides in cases.items():
        print(f"config_{name}: {' '.join(overrides)}", flush=True)
        results[name] = compare(name, out, overrides, args.reuse, args.evaluations, args.branch_seeds)
    (out / "summary.json").write_text(json.dumps(results, indent=2, default=str))
    print("headline: " + "; ".join(f"{n} {r['ratio']:.1%} of the 3-seed grid's compute, {r['agreement']}"
                                  for n, r in results.items()))


if __name__ == "__main__":
    sys.exit(main())
