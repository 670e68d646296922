"""The critical batch size from one trunk and its branches, against the grid: per model (MLP/digits, a
BatchNorm-free MLP that learns, with AdamW; ResNet-18/digits with SGD; with --models gpt the language-model
demo, +experiment=gpt_batch), one branch sweep, the grid with
sweep.seeds=[0,1,2] (the answer that holds up), and the branches' schedule trained from scratch at the same
three seeds.

    python scripts/bench_branch.py [--out DIR] [--models mlp,resnet18,gpt] [--quick] [--reuse] [--evaluations 40]
                                   [--branch-seeds 1] [--branch-overrides "branch.window=2304 ..."]

Prints, per model:
- compute: the branch sweep's point-seconds over the 3-seed grid's (goal <= 35 %), and over the one-seed grid's
  (its seed-0 points), each run's evaluation seconds left out of both sides and printed apart (the grid
  evaluates on the bench's cadence, ~40 times a run; the branch sweep at its own);
- agreement: whether the branch sweep's constant recommendation has the grid's recommended global batch, or the
  grid's own eligibility rule (non-inferiority) keeps it ("agree"); or the grid calls it "unproven" beside its
  pick, neither certified within the margin nor shown beyond it ("not told apart": the grid's data cannot
  say which is right, so a disagreement would claim more than they show); or it shows it worse or excludes
  it for another reason ("disagree");
- the critical batch size three ways: branched (where it flattens, with the next global batch tried), the grid
  fit's B_crit with its interval (steps to the target below against the global batch), the mean B_simple;
- the schedule against the trunk's global batch and every layout of the grid, to three targets, each a
  validation loss beside a validation noise, built on the trunk's final validation loss taken robustly (the
  least-squares line through the last quarter of its evaluations, read at the budget's end, averaged over the
  grid's three runs of the trunk's layout: the trunk and two replicas): that loss itself ("final": the
  answer's own predictions are to the trunk's final loss, so they are printed against the measured seconds
  there), plus z x the validation loss's standard error over the held-out set ("noise"), and plus the standard
  error of that seed mean ("strict"). Every run is evaluated at the same sample counts (a multiple of the
  grid's largest global batch). A run reaches a target at its first evaluation whose loss, averaged with its
  neighbours' (three evaluations, centred), is at or below it: one lucky evaluation on a small validation split
  does not count. Steps are optimizer steps to there; seconds are measured on the run's own clock at that
  evaluation (val_wall_seconds_curve), its evaluations' share (val_eval_seconds_curve) printed apart and left
  out of the ranking; steps x the grid's step times are printed beside them as predictions. A layout or the
  schedule is ranked only when all three seeds got there. Goal: the schedule >= 30 % fewer optimizer steps
  than the trunk's global batch (the seed mean over the seeds where both got there); and whether the
  recommendation (schedule or constant) was the fastest.
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
from dataclasses import dataclass
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
# The language-model demo (+experiment=gpt_batch), where the critical batch size matters most: its own grid
# (micro-batch 16/32 x accumulation 1/2 x workers 1/2, 4,096 sequences), not GRID's digits overrides.
OWN_GRID = {"gpt": ["+experiment=gpt_batch", "cluster.include_dashboard=false"]}
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
    if why.startswith(("unproven", "faster but unproven")):
        return f"not told apart (grid picks {chosen['key']}; on {branch_key} it says: {why[:240]})"
    return f"disagree (grid picks {chosen['key']}; on {branch_key} it says: {why[:240]})"


def layout_of(key: str) -> Tuple[int, int, int]:
    """(micro-batch, accumulation, workers) of a point key such as mb16-acc2-w1."""
    mb, acc, w = key.split("-")[:3]
    return int(mb[2:]), int(acc[3:]), int(w[1:])


def batch_of(key: str) -> int:
    mb, acc, w = layout_of(key)
    return mb * acc * w


def curve(sweep: Sweep, run, name: str = "val_loss_curve") -> List[Tuple[int, float]]:
    """A run's validation loss at each evaluation, by samples seen (or another curve of the run's)."""
    return [(int(m.step), m.value) for m in sweep.client.get_metric_history(run.info.run_id, name)]


@dataclass
class Run:
    """One run's evaluations: the validation loss, and its own clock there (val_wall_seconds_curve: seconds
    since training started, evaluations included; val_eval_seconds_curve: the seconds evaluating so far)."""

    loss: List[Tuple[int, float]]
    wall: Dict[int, float]
    evaluating: Dict[int, float]

    @classmethod
    def of(cls, sweep: Sweep, run) -> "Run":
        return cls(curve(sweep, run), dict(curve(sweep, run, "val_wall_seconds_curve")),
                   dict(curve(sweep, run, "val_eval_seconds_curve")))

    def seconds_to(self, target: float) -> Optional[Tuple[int, float, float]]:
        """(samples, wall seconds, of which evaluating) at the evaluation where it got to `target`
        (samples_to's rule), measured on its own clock; None: never, or no clock recorded."""
        got = samples_to(self.loss, target)
        if got is None or got not in self.wall:
            return None
        return got, self.wall[got], self.evaluating.get(got, 0.0)


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
            branch_seeds: int = 1, branch_overrides: Sequence[str] = ()) -> Dict[str, object]:
    b_folder = out / f"{name}-branch"
    shutil.rmtree(b_folder, ignore_errors=True)
    seeds = f"sweep.seeds=[{','.join(map(str, range(branch_seeds)))}]"
    b_wall = run_sweep(b_folder, [*overrides, "sweep.strategy=branch", seeds, *branch_overrides])
    branch = Sweep(b_folder)
    answer = json.loads(branch.artifact("branch/answer.json"))
    budget = answer["budget_samples"]
    # every run evaluated at the same sample counts: a multiple of the grid's largest global batch (a run
    # evaluates every ceil(every / its global batch) steps)
    tried = [int(g) for c in answer["checkpoints"][:1] for g in c["differences"]]
    largest = max([answer["base_global_batch"], *tried, *answer.get("unjudged_global_batches", [])])
    every = max(1, round(budget / evaluations / largest)) * largest
    print(f"{name}_branch_wall_seconds: {b_wall:.0f}", flush=True)
    grid = grid_sweep(name, out, overrides, reuse, every)
    points = [p for p in grid.points() if p["status"] == "ok"]
    figures: Dict[str, object] = {"ratio": compute(name, branch, grid)}

    agreed = agreement(answer["constant"], grid)
    figures["agreement"] = agreed.split(" (")[0]
    print(f"{name}_agreement: {agreed}")
    # The targets, every one a validation loss beside a validation noise: the trunk's final validation loss,
    # robustly ("final": what the answer's predictions are to, so they are checked there); plus z x the
    # validation loss's own standard error over the held-out set ("noise"); plus the standard error of that
    # seed mean ("strict"). (Until issue 46 the first target added the branches' training-loss tolerance.)
    trunk = min(branch.role("trunk"), key=lambda r: r.data.tags["sweeper.trial_key"])  # seed 0's
    trunk_layout = trunk.data.tags["sweeper.trial_key"].split("trunk-")[1].rsplit("-s", 1)[0]
    replicas = sorted((p for p in points if p["point"] == trunk_layout), key=lambda p: p["seed"])
    runs = {(p["point"], p["seed"]): Run.of(grid, p["run"]) for p in points}  # read once, for every target
    curves = {key: run.loss for key, run in runs.items()}
    finals = [smoothed_final(curves[(p["point"], p["seed"])], budget) for p in replicas]
    final = statistics.fmean(finals)
    z = statistics.NormalDist().inv_cdf(0.95)
    val_se = mean([p["val_loss_se"] for p in replicas if p.get("val_loss_se") is not None]) or 0.0
    se = statistics.stdev(finals) / math.sqrt(len(finals)) if len(finals) > 1 else 0.0
    print(f"{name}_trunk_final: val_loss {final:.4f}, the trunk's smoothed final loss (seeds "
          f"{', '.join(f'{v:.3f}' for v in finals)}; the seed-0 trunk's own last evaluation "
          f"{trunk.data.metrics['val_loss']:.4f})")

    step_time = {}  # each layout's mean measured step time over the grid's seeds
    for p in points:
        step_time.setdefault(p["point"], []).append(p["step_time_seconds"])
    step_time = {k: statistics.fmean(v) for k, v in step_time.items()}
    ran = run_schedule(out / f"{name}-schedule", overrides, answer, every)
    for label, target, why in (
            ("final", final, "the trunk's smoothed final validation loss: the answer's predictions are to it"),
            ("noise", final + z * val_se, f"+ z x the validation loss's standard error, {z:.3f} x {val_se:.4f}"),
            ("strict", final + se, f"+ its standard error over the seeds {se:.4f}")):
        print(f"{name}_target_{label}: val_loss {target:.4f} ({final:.4f} {why})")
        reached = {run: samples_to(values, target) for run, values in curves.items()}
        critical_batch(f"{name}_{label}", answer, grid, points, reached)
        trunk_steps = {p["seed"]: reached[(trunk_layout, p["seed"])] // answer["base_global_batch"]
                       for p in replicas if reached[(trunk_layout, p["seed"])] is not None}
        print(f"{name}_{label}_trunk_steps_to_target: " + ", ".join(f"seed {s}: {n}" for s, n in trunk_steps.items())
              + f" ({trunk_layout}: the trunk and its replicas; {len(trunk_steps)} of {len(replicas)} got there)")
        got = judge_schedule(f"{name}_{label}", ran, answer, target, step_time, trunk_steps)
        constants(f"{name}_{label}", answer, points, runs, target, step_time, got, label == "final")
        figures[label] = {"target": target, **{k: v for k, v in got.items() if k != "seconds"}}
    return figures


def grid_sweep(name: str, out: Path, overrides: List[str], reuse: bool, every: int) -> Sweep:
    """The 3-seed grid evaluated every `every` samples; with `reuse`, the one this script ran before with the
    same overrides and cadence (its wall seconds then from that run, at that time's load)."""
    g_folder = out / f"{name}-grid"
    marker, wanted = g_folder / "grid.json", {"overrides": overrides, "every": every}
    if reuse and marker.exists() and json.loads(marker.read_text()) == wanted:
        grid = Sweep(g_folder)
        g_wall = grid.metrics["sweep_wall_seconds"]
    else:
        shutil.rmtree(g_folder, ignore_errors=True)
        g_wall = run_sweep(g_folder, [*overrides, "sweep.seeds=[0,1,2]", f"eval.every_samples={every}",
                                      "report.objective=throughput"])
        marker.write_text(json.dumps(wanted))
        grid = Sweep(g_folder)
    print(f"{name}_grid_wall_seconds: {g_wall:.0f}" + (" (reused)" if reuse else ""), flush=True)
    return grid


def compute(name: str, branch: Sweep, grid: Sweep) -> float:
    """The branch sweep's point-seconds over the 3-seed grid's, evaluations left out of both (the grid
    evaluates on the bench's cadence, every run of the branch sweep at its own: each run's eval_seconds is
    taken out) and printed apart, with the ratio they would give counted in."""
    points = grid.points()
    grid_cost = sum(p.get("trial_seconds", 0.0) for p in points)
    grid_eval = sum(p.get("eval_seconds", 0.0) for p in points)
    one_seed = sum(p.get("trial_seconds", 0.0) - p.get("eval_seconds", 0.0) for p in points if p.get("seed") == "0")
    cost = branch.metrics["compute_point_seconds"]
    # the runs its ledger counts (a "trial" run of the trunk's layout carries the trunk's figures: not twice)
    branch_eval = sum(r.data.metrics.get("eval_seconds", 0.0) for r in branch.runs
                      if r.data.tags.get("sweeper.role") in ("throughput", "trunk", "branch"))
    print(f"{name}_branch_point_seconds: {cost - branch_eval:.1f} without its evaluations ({branch_eval:.1f} s of "
          f"them apart; throughput {branch.metrics['compute_throughput_point_seconds']:.1f}, "
          f"trunk {branch.metrics['compute_trunk_point_seconds']:.1f}, branches "
          f"{branch.metrics['compute_branch_point_seconds']:.1f} in {branch.metrics['branch_runs']:.0f}, evaluations "
          "included)")
    print(f"{name}_grid_point_seconds: {grid_cost - grid_eval:.1f} without its evaluations ({grid_eval:.1f} s of them "
          f"apart; 3 seeds, {len(points)} runs); one seed {one_seed:.1f}")
    ratio = (cost - branch_eval) / (grid_cost - grid_eval)
    print(f"{name}_compute_ratio: {ratio:.1%} of the 3-seed grid, evaluations left out of both (goal <= 35 %); "
          f"{(cost - branch_eval) / one_seed:.1%} of the one-seed grid; {cost / grid_cost:.1%} with every "
          "evaluation counted (the grid's cadence is the bench's, not the branch sweep's)")
    return ratio


def critical_batch(name: str, answer: dict, grid: Sweep, points: List[dict], reached: dict) -> None:
    """Branched (where it flattens), the grid fit's B_crit (the report's rule: every layout whose every seed
    got to the target, one pair per run), B_simple."""
    said = [c for c in answer["checkpoints"] if c.get("informative") is not False]  # a checkpoint may say nothing
    flat = said[-1] if said else None
    branched = (f"{answer['critical_batch_size_flat']:.0f} fitted; the last checkpoint with a reading read "
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
    over = ", ".join("{}@{}".format("none" if c.get("informative") is False else c["critical_batch_size"],
                                    c["samples"]) for c in answer["checkpoints"])
    simple = f"mean B_simple {b_simple:.1f}" if b_simple is not None else "no B_simple"
    print(f"{name}_critical_batch: branched {branched} (readings: {over}); grid fit B_crit {fit_text}; {simple}")


def run_schedule(folder: Path, overrides: List[str], answer: dict, every: int) -> Optional[Dict[str, Run]]:
    """The branches' schedule trained from scratch at the grid's three seeds, on the grid's evaluation
    cadence: each seed's evaluations and clock (None: the schedule is a constant)."""
    spans = answer["schedule"]
    if len(spans) < 2:
        return None
    mb, acc, workers = layout_of(answer["schedule_layouts"][0])
    shutil.rmtree(folder, ignore_errors=True)
    run_sweep(folder, [*overrides, f"sweep.micro_batch_sizes=[{mb}]", f"sweep.accumulation_steps=[{acc}]",
                       f"sweep.num_workers=[{workers}]", "sweep.seeds=[0,1,2]", f"eval.every_samples={every}",
                       "train.batch_schedule=[" + ",".join("[" + ",".join(map(str, s)) + "]" for s in spans) + "]"])
    sweep = Sweep(folder)
    return {p["seed"]: Run.of(sweep, p["run"]) for p in sweep.points()}


def judge_schedule(name: str, runs: Optional[Dict[str, Run]], answer: dict, target: float,
                   step_time: Dict[str, float], trunk_steps: Dict[str, int]) -> Dict[str, object]:
    """The schedule's steps and seconds to `target` per seed, against the trunk's global batch: the seconds
    measured on each run's own clock at the evaluation where it got there (its evaluations' share apart);
    steps x the grid's step times beside them, labelled a prediction."""
    spans = answer["schedule"]
    if runs is None:
        print(f"{name}_schedule: a constant global batch ({spans}): nothing to train apart")
        return {}
    timed = answer.get("schedule_timed_as") or answer["schedule_layouts"]
    per_span = []  # each span's step time: its layout's in the grid, else its timing layout's per sample
    for layout, by in zip(answer["schedule_layouts"], timed):
        per_span.append(step_time[layout] if layout in step_time else
                        step_time[by] * batch_of(layout) / batch_of(by) if by in step_time else math.nan)
    steps, wall, training, predicted, fewer = {}, {}, {}, {}, []
    for seed in sorted(runs):
        got = runs[seed].seconds_to(target)
        if got is None:
            continue
        counts = steps_over(spans, got[0])
        steps[seed], wall[seed], training[seed] = sum(counts), got[1], got[1] - got[2]
        predicted[seed] = sum(n * t for n, t in zip(counts, per_span))
        if seed in trunk_steps:
            fewer.append(1 - steps[seed] / trunk_steps[seed])
    paired = [s for s in steps if s in trunk_steps]
    mean_fewer = (1 - statistics.fmean(steps[s] for s in paired) / statistics.fmean(trunk_steps[s] for s in paired)
                  if paired else None)
    print(f"{name}_schedule: {spans} on {', '.join(dict.fromkeys(answer['schedule_layouts']))}: "
          + ", ".join(f"seed {s}: {steps[s]} steps, measured {training[s]:.3g} s training + "
                      f"{wall[s] - training[s]:.3g} s evaluating (predicted from step times {predicted[s]:.3g} s)"
                      for s in steps)
          + f" ({len(steps)} of 3 seeds got to the target); "
          + (f"{mean_fewer:.0%} fewer optimizer steps than the trunk's global batch {answer['base_global_batch']} "
             f"over the {len(paired)} seed(s) where both got there (per seed: "
             f"{', '.join(f'{f:.0%}' for f in fewer)}; goal >= 30 %)" if paired else
             "no seed where both the schedule and the trunk's global batch got to the target"))
    return {"schedule_steps": mean(list(steps.values())), "trunk_steps": mean(list(trunk_steps.values())),
            "fewer_steps": mean_fewer, "schedule_seeds_reached": len(steps),
            "seconds": mean(list(training.values())),
            "schedule_measured_training_seconds": mean(list(training.values())),
            "schedule_measured_wall_seconds": mean(list(wall.values()))}


def constants(name: str, answer: dict, points: List[dict], runs: Dict[Tuple[str, str], Run], target: float,
              step_time: Dict[str, float], schedule: Dict[str, object], check: bool) -> None:
    """Every layout of the grid to the target, by global batch: mean over its seeds of the training seconds
    measured on each run's clock at the evaluation where it got there (evaluations apart; ranked only when
    every seed got there, as the report's critical-batch fit counts a point), and whether the recommendation
    was the faster one. `check`: the target is the one the answer's predictions are to, so print them
    against what was measured."""
    rows = []  # (layout, global batch, mean steps, mean measured training seconds) of layouts every seed got there
    for g in sorted({batch_of(p["point"]) for p in points}):
        parts = []
        for key in sorted({p["point"] for p in points if batch_of(p["point"]) == g}):
            got = [runs[(key, p["seed"])].seconds_to(target) for p in points if p["point"] == key]
            done = [x for x in got if x is not None]
            text = f"{key} {len(done)} of {len(got)}"
            if done:
                steps = statistics.fmean(x[0] / g for x in done)
                training = statistics.fmean(x[1] - x[2] for x in done)
                text += (f" ({steps:.0f} steps, measured {training:.3g} s training + "
                         f"{statistics.fmean(x[2] for x in done):.3g} s evaluating; predicted from its step time "
                         f"{steps * step_time[key]:.3g} s)")
                if len(done) == len(got):
                    rows.append((key, g, steps, training))
            parts.append(text)
        print(f"{name}_constant_{g}: " + "; ".join(parts) + " got to the target")
    fastest = min(rows, key=lambda r: r[3], default=None)
    picked = "the schedule" if answer["recommend_schedule"] else f"constant {answer['constant']}" + (
        " (a tie with the schedule: inside the predictions' noise)" if answer.get("choice") == "tie" else "")
    chosen = next((r for r in rows if r[0] == answer["constant"]), None)
    s_seconds = schedule.get("seconds") if schedule.get("schedule_seeds_reached") == 3 else None
    measured = (f"schedule {'-' if s_seconds is None else f'{s_seconds:.3g} s'}, the recommended constant "
                f"{answer['constant']} {'-' if chosen is None else f'{chosen[3]:.3g} s'}")
    if check:
        # The answer predicts training seconds (no evaluations) to the trunk's final loss: this target.
        pairs = [("schedule", answer["schedule_predicted_seconds"], s_seconds),
                 (f"constant {answer['constant']}", answer["constant_predicted_seconds"], chosen and chosen[3])]
        print(f"{name}_prediction_check: " + "; ".join(
            f"{what} predicted {p:.3g} s, measured {'-' if m is None else f'{m:.3g} s ({m / p:.2f}x)'}"
            for what, p, m in pairs if p is not None)
              + " (training seconds to the trunk's smoothed final validation loss, every seed there)")
    if fastest is None:
        print(f"{name}_recommendation: {picked}; measured to the target: {measured}; no layout got there in every seed")
        return
    winner = "the schedule" if s_seconds is not None and s_seconds < fastest[3] else f"constant {fastest[0]}"
    tied = [r[0] for r in rows if r[0] != fastest[0] and f"{r[3]:.3g}" == f"{fastest[3]:.3g}"]
    winner += f" (tied with {', '.join(tied)} at 3 significant digits)" if tied else ""
    print(f"{name}_recommendation: {picked}; measured training seconds to the target (every seed there): "
          f"{measured}, the fastest constant {fastest[0]} {fastest[3]:.3g} s: fastest of all {winner}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".sweeper/bench_branch")
    parser.add_argument("--models", default="mlp,resnet18", help="of mlp, resnet18, gpt (the language-model demo)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--evaluations", type=int, default=40,
                        help="evaluations over the budget, for the steps to the target (each costs a validation pass: "
                             "ResNet-18's are dear, use ~10)")
    parser.add_argument("--branch-seeds", type=int, default=1,
                        help="replicate trunks of the branch sweep (sweep.seeds=[0..n-1]; the grid keeps its three)")
    parser.add_argument("--branch-overrides", default="",
                        help="Hydra overrides for the branch sweep only, space-separated (e.g. branch.window=2304)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a grid already under --out for the same overrides and cadence (the branch sweep and "
                             "the schedule run again)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    cases = {"quick_mlp": QUICK} if args.quick else {
        name: OWN_GRID[name] if name in OWN_GRID else [*GRID, *MODELS[name]] for name in args.models.split(",")}
    results = {}
    for name, overrides in cases.items():
        print(f"config_{name}: {' '.join(overrides)}", flush=True)
        print(f"branch_overrides_{name}: sweep.seeds=[0..{args.branch_seeds - 1}] {args.branch_overrides}", flush=True)
        results[name] = compare(name, out, overrides, args.reuse, args.evaluations, args.branch_seeds,
                                args.branch_overrides.split())
    (out / "summary.json").write_text(json.dumps(results, indent=2, default=str))
    print("headline: " + "; ".join(f"{n} {r['ratio']:.1%} of the 3-seed grid's compute, {r['agreement']}"
                                  for n, r in results.items()))


if __name__ == "__main__":
    sys.exit(main())
