"""The answer beyond the sweep's own budget and grid, gathered for the report: the run the answer configures
(report.run_samples / run_tokens, report.price_per_device_hour) and the sweep's own cost against it, the run's time
to the target at each global batch, the throughput model's predictions with their errors, goodput, and the answer
at report.target_workers. Each part has its own pure module (run_cost.py, throughput_model.py, goodput.py,
target_cluster.py); this one joins them and says them: headline words, YAML, MLflow metrics, page sections.
Pure (stdlib; numpy through throughput_model)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from sweeper.config.report import ReportConfig
from sweeper.report import folding, goodput, run_cost, target_cluster
from sweeper.report import throughput_model as tm
from sweeper.report.run_cost import figure, hours_text
from sweeper.report.trials import Recommendation, Trial


@dataclass
class Projection:
    run: Optional[run_cost.RunCost] = None
    run_note: Optional[str] = None  # why there is no run (report.run_tokens without a context)
    sweep_device_seconds: Optional[float] = None
    models: Dict[tm.Group, tm.GroupModel] = field(default_factory=dict)
    best_group: Optional[tm.Group] = None
    predictions: List[tm.Prediction] = field(default_factory=list)  # the recommended group's grid
    noise: Optional[goodput.NoiseScale] = None
    anchor: Optional[goodput.Anchor] = None
    ranked: List[goodput.Ranked] = field(default_factory=list)
    agreement: Optional[float] = None
    to_target: List[run_cost.TargetAtFullLength] = field(default_factory=list)
    target: Optional[Dict[str, Any]] = None  # report.target_workers' answer
    target_run: Optional[run_cost.RunCost] = None
    memory: Optional[target_cluster.MemoryModel] = None  # the recommended group's memory per worker

    @property
    def sweep_device_hours(self) -> Optional[float]:
        return None if self.sweep_device_seconds is None else self.sweep_device_seconds / run_cost.HOUR

    @property
    def share_of_run(self) -> Optional[float]:
        if self.run is None or self.sweep_device_hours is None or not self.run.device_hours:
            return None
        return self.sweep_device_hours / self.run.device_hours

    def elastic_predictor(self) -> Optional[Callable[[int, int, int], Optional[Dict[str, Any]]]]:
        """The elastic plan's predictions (report/elastic.py's Predictor) from the recommended group's models."""
        model = self.models.get(self.best_group) if self.best_group else None
        if model is None:
            return None
        memory, memory_error = self.memory, None if self.memory is None else self.memory.error()

        def predict(micro: int, accumulation: int, workers: int) -> Optional[Dict[str, Any]]:
            found = model.predict(tm.Layout(micro, accumulation, workers))
            if found is None:
                return None
            peak = None if memory is None else memory.predict(micro, accumulation, workers)
            return {"samples_per_second": float(found.samples_per_second), "samples_per_second_error": found.error,
                    "error_rule": found.rule, "peak_memory_bytes": None if peak is None else int(peak),
                    "peak_memory_error": memory_error if peak is not None else None}
        return predict


def run_samples(cfg: ReportConfig, best: Trial) -> Optional[float]:
    """The run's samples: report.run_samples, or report.run_tokens over the recommended point's context."""
    if cfg.run_samples is not None:
        return float(cfg.run_samples)
    if cfg.run_tokens is not None and best.context:
        return float(cfg.run_tokens) / best.context
    return None


def project(rec: Recommendation, trials: Sequence[Trial], cfg: ReportConfig, params: Dict[str, str],
            spent: Sequence[Dict[str, Any]] = (), budget_bytes: Optional[float] = None,
            branch_critical: Optional[float] = None) -> Projection:
    """Everything beyond the sweep's budget for `rec` (the sweep's `params`, its runs' `spent` rows)."""
    out = Projection(sweep_device_seconds=run_cost.sweep_device_seconds(spent))
    every = _number(params.get("eval_every_samples"))
    layouts = folding.fold_layouts(trials)
    out.models = tm.fit_all(layouts, _number(params.get("interconnect_gbps")))
    points = list(rec.points.values())
    out.to_target = run_cost.to_target(points, every)
    best = rec.best
    if best is None:
        return out
    samples = run_samples(cfg, best)
    if cfg.run_tokens is not None and samples is None:
        out.run_note = "report.run_tokens needs a language model's context: the recommended point has none"
    writes = run_cost.checkpoint_seconds(trials)
    if samples is not None and best.samples_per_second:
        out.run = run_cost.run_cost(best, samples, every, writes, cfg.price_per_device_hour)
    out.best_group = tm.group_of(best)
    model = out.models.get(out.best_group)
    members = [t for t in layouts if tm.group_of(t) == out.best_group]
    if model is not None:
        counts = tm.worker_counts([o.layout.num_workers for o in model.observed], cfg.max_workers,
                                  [cfg.target_workers] if cfg.target_workers else [])
        out.predictions = tm.predict_grid(model, _axis(params, "micro_batch_sizes", members, "micro_batch_size"),
                                          _axis(params, "accumulation_steps", members, "accumulation_steps"), counts)
    _goodput(out, points, model, every, folding.b_simple_mean(trials), branch_critical)
    if model is not None:
        out.memory = target_cluster.memory_model(model, members, target_cluster.decode_units(params.get("model_units")))
    if cfg.target_workers:
        micro = _axis(params, "micro_batch_sizes", members, "micro_batch_size")
        out.target = target_cluster.at_target(best, int(cfg.target_workers), model, out.memory, micro, budget_bytes)
        if samples is not None and out.target.get("samples_per_second"):
            shown = _error_text(out.target.get("throughput_error"))
            out.target_run = run_cost.run_cost(best, samples, every, writes, cfg.price_per_device_hour,
                                               out.target["samples_per_second"], int(cfg.target_workers),
                                               f"predicted \u00b1{shown}")
    return out


def _axis(params: Dict[str, str], name: str, members: Sequence[Trial], field_name: str) -> List[int]:
    """The grid's values of an axis (its parent param, a list; `auto` leaves the measured ones) and the measured."""
    values = {int(getattr(t, field_name)) for t in members}
    values |= {int(v) for v in re.findall(r"\d+", str(params.get(name) or ""))}
    return sorted(v for v in values if v >= 1)


def _goodput(out: Projection, points: Sequence[Any], model: Optional[tm.GroupModel], every: Optional[float],
             b_simple: Optional[float], branch_critical: Optional[float]) -> None:
    """The layouts ranked by predicted time to the target: the measured points, and the recommended group's
    layouts not measured within the measured worker counts (their throughput predicted)."""
    out.noise = goodput.noise_scale(b_simple, branch_critical)
    if out.noise is None:
        return
    reached = [p for p in points if p.reached_in_every_seed and p.trial.samples_to_target]
    if reached:
        low = min(int(p.trial.global_batch_size) for p in reached)
        at_low = [p for p in reached if int(p.trial.global_batch_size) == low]
        out.anchor = goodput.Anchor(low, sum(p.trial.samples_to_target for p in at_low) / len(at_low), at_low[0].key)
    candidates = []
    for p in points:
        t = p.trial
        done = p.reached_in_every_seed and t.time_to_target_seconds is not None
        rate = t.samples_per_second or (run_cost.rate_to_target(t) if done else None)
        if t.status != "ok" or not rate:
            continue
        # A point that stopped at the target untimed (eval.stop_at_target): its rate to the target holds its
        # evaluations already.
        timed = bool(t.samples_per_second)
        candidates.append(goodput.Candidate(
            t.key, int(t.global_batch_size), float(rate), "measured" if timed else "measured to the target",
            _eval_per_sample(t, every) if timed else 0.0,
            t.time_to_target_seconds if done else None, t.samples_to_target if done else None))
    measured = {(c.global_batch, c.key) for c in candidates}
    for pred in out.predictions:
        if pred.measured is None and model is not None and pred.layout.num_workers <= model.largest_workers:
            key = pred.layout.key + ("" if model.parallelism == "ddp" else f"-{model.parallelism}")
            if (pred.layout.global_batch_size, key) not in measured:
                candidates.append(goodput.Candidate(key, pred.layout.global_batch_size, pred.samples_per_second,
                                                    f"predicted \u00b1{_error_text(pred.error)}"))
    out.ranked = goodput.rank(candidates, out.noise, out.anchor)
    out.agreement = goodput.measured_agreement(out.ranked)


def _eval_per_sample(t: Trial, every: Optional[float]) -> float:
    per_eval = run_cost.seconds_per_evaluation(t)
    if per_eval is None or not every:
        return 0.0
    return per_eval / (math.ceil(every / t.global_batch_size) * t.global_batch_size)


def _number(text: Any) -> Optional[float]:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _error_text(error: Optional[float]) -> str:
    return "unbounded" if error is None else f"{error:.0%}"


# ---------------------------------------------------------------------------------------------------
# Saying it


def run_words(p: Projection, detail: int) -> Optional[str]:
    """The run and the sweep's share of it for the headline, shorter as `detail` falls (2, 1, 0; -1 names the
    run's train.samples, for a headline whose override line is the sweep's own)."""
    run = p.run
    if run is None:
        return None
    price = "" if run.price is None else f", price {figure(run.price)}"
    hours = figure(run.device_hours)
    if detail >= 2:
        words = (f"run of {figure(run.samples)} samples: {hours_text(run.wall_seconds)}, {hours} device-hours{price}")
    elif detail >= 0:
        words = f"run {hours_text(run.wall_seconds)}, {hours} device-h{price}"
    else:
        words = f"run (train.samples={int(round(run.samples))}) {hours_text(run.wall_seconds)}, {hours} device-h{price}"
    if p.sweep_device_hours is not None and p.share_of_run is not None:
        sweep, share = figure(p.sweep_device_hours), _percent(p.share_of_run)
        words += (f"; this sweep {sweep} device-hours, {share} of the run" if detail >= 2 else
                  f"; sweep {sweep} device-h ({share})")
    return words


def _percent(share: float) -> str:
    return f"{share:.1%}" if share < 0.1 else f"{share:.0%}"


def run_override(line: Optional[str], p: Projection) -> Optional[str]:
    """The override line with the run's length: train.samples is the budget the LR schedule's decay spans
    (sweeper/lr_schedule.py, in samples; its warm-up stays train.warmup_steps), the run's instead of the sweep's."""
    if line is None or p.run is None:
        return line
    return f"{line} train.samples={int(round(p.run.samples))}"


def metrics(p: Projection) -> Dict[str, float]:
    """The parent run's metrics of the projection, by MLflow name (those there are)."""
    out: Dict[str, float] = {}
    if p.sweep_device_hours is not None:
        out["sweep_device_hours"] = p.sweep_device_hours
    if p.run is not None:
        out.update(run_samples=p.run.samples, run_wall_seconds=p.run.wall_seconds, run_device_hours=p.run.device_hours,
                   run_eval_seconds=p.run.eval_seconds, run_checkpoint_seconds=p.run.checkpoint_seconds)
        if p.run.price is not None:
            out["run_price"] = p.run.price
        if p.share_of_run is not None:
            out["sweep_share_of_run"] = p.share_of_run
    model = p.models.get(p.best_group) if p.best_group else None
    if model is not None:
        if model.within_error is not None:
            out["throughput_model_loo_max_error"] = model.within_error
            out["throughput_model_loo_median_error"] = model.within_median
        if model.beyond_error is not None:
            out["throughput_model_beyond_error"] = model.beyond_error
    if p.noise is not None:
        out["goodput_noise_scale"] = p.noise.value
    if p.agreement is not None:
        out["goodput_rank_correlation"] = p.agreement
    if p.target_run is not None:
        out.update(target_workers_samples_per_second=p.target_run.samples_per_second,
                   target_workers_run_wall_seconds=p.target_run.wall_seconds,
                   target_workers_run_device_hours=p.target_run.device_hours)
    return out
