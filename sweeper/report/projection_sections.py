"""The projection (report/projection.py) as the report shows it: recommendation.yaml's blocks and the page's
sections, every predicted figure labelled a prediction with its error. Pure (stdlib)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from sweeper.report import goodput, run_cost
from sweeper.report import throughput_model as tm
from sweeper.report.html import Section
from sweeper.report.projection import Projection, run_override
from sweeper.report.run_cost import figure, hours_text

MODEL_RULE = ("step seconds = accumulation x (fixed + per_sample x micro-batch) + per_step + [workers > 1] x "
              "(latency + bytes moved per step / bandwidth + contention x samples per worker), fitted per "
              "parallelism and recipe (Pollux, OSDI'21); error: leave-one-out over the measured points within the "
              "measured world sizes, beyond them the error of predicting the largest measured world size from the "
              "smaller ones (unbounded where there is none)")


def _num(value: Optional[float]) -> Optional[float]:
    return None if value is None else float(value)


def yaml_blocks(p: Projection, line: Optional[str]) -> Dict[str, Any]:
    """recommendation.yaml's blocks of the projection (those there are)."""
    out: Dict[str, Any] = {}
    if p.run is not None:
        out["run"] = {**_run_block(p.run), "overrides": run_override(line, p)}
    elif p.run_note:
        out["run"] = {"why": p.run_note}
    if p.sweep_device_seconds is not None:
        out["sweep_cost"] = {
            "device_hours": p.sweep_device_hours, "share_of_run": _num(p.share_of_run),
            "how": "every run that trained or probed: its workers x its wall time in its workers, worker-group "
                   "start-up included (measured)"}
    if p.to_target:
        out["time_to_target_at_full_length"] = [
            {"global_batch_size": r.global_batch, "point": r.key, "samples_to_target": _num(r.samples),
             "seconds": _num(r.seconds), "device_hours": _num(r.device_hours),
             "source": "measured" if r.key else "unknown: no point of this global batch reached the target in every "
                                                "seed"} for r in p.to_target]
    if p.models:
        out["throughput_model"] = {"prediction": True, "rule": MODEL_RULE,
                                   "groups": [_group_block(m) for m in p.models.values()],
                                   "predictions": [_prediction_block(x) for x in p.predictions]}
    if p.noise is not None:
        out["goodput"] = _goodput_block(p)
    if p.target is not None:
        out["target_workers"] = {**p.target, **({} if p.target_run is None else {"run": _run_block(p.target_run)})}
    return out


def _run_block(run: run_cost.RunCost) -> Dict[str, Any]:
    return {"point": run.key, "samples": run.samples, "num_workers": run.workers,
            "samples_per_second": run.samples_per_second, "throughput": run.throughput_from,
            "train_seconds": run.train_seconds, "evaluations": run.evaluations, "eval_seconds": run.eval_seconds,
            "checkpoints": run.checkpoints, "checkpoint_seconds": run.checkpoint_seconds,
            "wall_seconds": run.wall_seconds, "device_hours": run.device_hours,
            "price_per_device_hour": _num(run.price_per_device_hour), "price": _num(run.price), "notes": run.notes}


def _group_block(m: tm.GroupModel) -> Dict[str, Any]:
    c = m.coefficients
    bandwidth = None
    if c.seconds_per_byte and m.parameter_bytes:
        bandwidth = 8 / c.seconds_per_byte / 1e9
    return {"group": tm.group_label(m.group), "points": [o.key for o in m.observed], "left_out": dict(m.excluded),
            "fixed_seconds": c.fixed_seconds, "per_sample_seconds": c.per_sample_seconds,
            "per_step_seconds": c.per_step_seconds, "contention_seconds_per_sample": c.contention_seconds_per_sample,
            "latency_seconds": c.latency_seconds, "bandwidth_gbps": bandwidth,
            "bandwidth": "given (cluster.interconnect_gbps)" if m.bandwidth_given else (
                "fitted" if c.seconds_per_byte is not None else "unknown: no point with more than one worker"),
            "parameter_bytes": _num(m.parameter_bytes), "largest_measured_workers": m.largest_workers,
            "loo_errors": {k: float(v) for k, v in m.loo_errors.items()},
            "loo_max_error": _num(m.within_error), "loo_median_error": _num(m.within_median),
            "beyond_error": _num(m.beyond_error)}


def _prediction_block(x: tm.Prediction) -> Dict[str, Any]:
    return {"key": x.layout.key, "micro_batch_size": x.layout.micro_batch_size,
            "accumulation_steps": x.layout.accumulation_steps, "num_workers": x.layout.num_workers,
            "global_batch_size": x.layout.global_batch_size,
            "predicted_samples_per_second": float(x.samples_per_second),
            "error": _num(x.error), "error_rule": x.rule, "measured_samples_per_second": _num(x.measured)}


def _goodput_block(p: Projection) -> Dict[str, Any]:
    return {"prediction": True, "noise_scale": p.noise.value, "noise_scale_from": p.noise.source,
            "caveat": goodput.UNDERSTATES,
            "anchor": None if p.anchor is None else {"point": p.anchor.key, "global_batch_size": p.anchor.global_batch,
                                                    "samples_to_target": p.anchor.samples},
            "rank_correlation_with_measured": _num(p.agreement),
            "ranked": [{"point": r.candidate.key, "global_batch_size": r.candidate.global_batch,
                        "samples_per_second": r.candidate.samples_per_second,
                        "throughput": r.candidate.throughput_from, "efficiency": r.efficiency, "goodput": r.goodput,
                        "predicted_samples_to_target": _num(r.predicted_samples),
                        "predicted_seconds_to_target": _num(r.predicted_seconds),
                        "measured_seconds_to_target": _num(r.candidate.measured_seconds)} for r in p.ranked]}


# ---------------------------------------------------------------------------------------------------
# The page


def sections(p: Projection, recommended: Optional[str]) -> List[Section]:
    """The page's sections of the projection (each left out when empty)."""
    model = p.models.get(p.best_group) if p.best_group else None
    return [
        ("The run at full length", run_text(p)),
        ("Time to the target at full length (measured samples to target)", _target_rows(p)),
        ("Throughput model (predictions)", model_text(p, model)),
        ("Predicted layouts of the recommended parallelism and recipe", _prediction_rows(p)),
        ("Goodput: layouts by predicted time to the target (predictions)", goodput_text(p, recommended)),
        ("Goodput ranking", _goodput_rows(p)),
        (f"At {p.target['num_workers']} workers (report.target_workers, predictions)" if p.target else "",
         target_text(p)),
        ("Options at the target worker count", (p.target or {}).get("options") or []),
    ]


def run_text(p: Projection) -> str:
    """The run and the sweep's cost in words ('' without a run or a sweep cost)."""
    parts = []
    run = p.run
    if run is not None:
        price = "" if run.price is None else (
            f", price {figure(run.price)} at {run.price_per_device_hour:g} per device-hour")
        parts.append(
            f"The run: {figure(run.samples)} samples at {run.key}'s measured {run.samples_per_second:,.1f} "
            f"samples/s on {run.workers} workers: {hours_text(run.train_seconds)} training, {run.evaluations} "
            f"evaluations ({hours_text(run.eval_seconds)}), {run.checkpoints} checkpoints "
            f"({hours_text(run.checkpoint_seconds)}): {hours_text(run.wall_seconds)} wall, "
            f"{figure(run.device_hours)} device-hours{price}. The LR schedule is stretched over the run: the override "
            f"line sets train.samples={int(round(run.samples))}."
            + "".join(f" {n[0].upper()}{n[1:]}." for n in run.notes))
    elif p.run_note:
        parts.append(f"No run figures: {p.run_note}.")
    if p.sweep_device_hours is not None:
        share = "" if p.share_of_run is None else (
            f": {p.share_of_run:.1%} of the run's" + (" (under a quarter: the answer cost less than a quarter of one "
                                                       "run)" if p.share_of_run < 0.25 else ""))
        parts.append(f"This sweep used {figure(p.sweep_device_hours)} device-hours (every run that trained or probed: "
                     f"its workers x its wall time, worker-group start-up included){share}.")
    return " ".join(parts)


def _target_rows(p: Projection) -> List[Dict[str, str]]:
    return [{"global batch": str(r.global_batch), "point": r.key or "-",
             "samples to target": "unknown" if r.samples is None else f"{r.samples:,.0f}",
             "time to target": "unknown" if r.seconds is None else hours_text(r.seconds),
             "device-hours": "-" if r.device_hours is None else figure(r.device_hours)} for r in p.to_target]


def model_text(p: Projection, model: Optional[tm.GroupModel]) -> str:
    if not p.models:
        return ""
    lines = [f"Predictions, not measurements: {MODEL_RULE}. Points whose steps waited on data for over "
             f"{tm.DATA_BOUND:.0%} of their time, or whose timed windows spread over {tm.NOISY_CV:.0%}, are left out "
             "of the fit."]
    for m in p.models.values():
        c = m.coefficients
        within = "unbounded" if m.within_error is None else (
            f"worst {m.within_error:.0%}, median {m.within_median:.0%} over {len(m.loo_errors)} points")
        beyond = "unbounded" if m.beyond_error is None else f"{m.beyond_error:.0%}"
        comm = "no communication term (no point with more than one worker)" if c.seconds_per_byte is None else (
            f"{c.seconds_per_byte * 1e9:.3g} s per GB moved" + (
                " (cluster.interconnect_gbps)" if m.bandwidth_given else "")
            + ("" if m.parameter_bytes else " (in units of the model's parameter bytes: its size was not recorded)")
            + (f", {c.latency_seconds * 1e3:.3g} ms per step" if c.latency_seconds else "")
            + (f", {c.contention_seconds_per_sample * 1e6:.3g} \u00b5s more per sample with workers sharing a node"
               if c.contention_seconds_per_sample else ""))
        left = f"; left out: {', '.join(f'{k} ({v})' for k, v in m.excluded.items())}" if m.excluded else ""
        lines.append(f"{tm.group_label(m.group)}: {c.fixed_seconds * 1e3:.3g} ms per micro-step + "
                     f"{c.per_sample_seconds * 1e6:.3g} \u00b5s per sample + {c.per_step_seconds * 1e3:.3g} ms per "
                     f"optimizer step; {comm}. Leave-one-out error {within}; "
                     f"beyond {m.largest_workers} workers {beyond}{left}.")
    return "\n".join(lines)


def _prediction_rows(p: Projection) -> List[Dict[str, str]]:
    return [{"layout": x.layout.key, "global batch": str(x.layout.global_batch_size),
             "predicted samples/s": f"{x.samples_per_second:,.1f}",
             "error": "unbounded" if x.error is None else f"\u00b1{x.error:.0%}",
             "measured samples/s": "-" if x.measured is None else f"{x.measured:,.1f}"} for x in p.predictions]


def goodput_text(p: Projection, recommended: Optional[str]) -> str:
    if p.noise is None:
        return ""
    anchor = ("no point reached a target, so layouts are ranked by goodput (throughput x efficiency) without "
              "seconds" if p.anchor is None else
              f"samples to the target anchored at {p.anchor.key}'s measured {p.anchor.samples:,.0f} (global batch "
              f"{p.anchor.global_batch})")
    agreement = "" if p.agreement is None else (
        f" Against the measured times to the target, the predicted ranking's Spearman correlation is "
        f"{p.agreement:+.2f}.")
    return (f"Statistical efficiency (B_noise + B0) / (B_noise + B) with B_noise = {p.noise.value:,.0f}, "
            f"{p.noise.source}; {anchor}.{agreement} The recommendation stays {recommended or 'none'}, the one the "
            f"data certify: goodput is shown beside it. Note: {goodput.UNDERSTATES}.")


def _goodput_rows(p: Projection) -> List[Dict[str, str]]:
    def cell(value: Optional[float], fmt: str) -> str:
        return "-" if value is None else fmt.format(value)

    return [{"point": r.candidate.key, "global batch": str(r.candidate.global_batch),
             "samples/s": f"{r.candidate.samples_per_second:,.1f} ({r.candidate.throughput_from})",
             "efficiency": f"{r.efficiency:.2f}", "goodput": f"{r.goodput:,.1f}",
             "predicted samples to target": cell(r.predicted_samples, "{:,.0f}"),
             "predicted time to target": "-" if r.predicted_seconds is None else hours_text(r.predicted_seconds),
             "measured time to target": "-" if r.candidate.measured_seconds is None else hours_text(
                 r.candidate.measured_seconds)} for r in p.ranked]


def target_text(p: Projection) -> str:
    t = p.target
    if t is None:
        return ""
    if "why" in t:
        return f"No layout at {t['num_workers']} workers: {t['why']}."
    error = "unbounded" if t.get("throughput_error") is None else f"\u00b1{t['throughput_error']:.0%}"
    memory = "memory unknown" if t.get("peak_memory_bytes") is None else (
        f"{t['peak_memory_bytes'] / 2 ** 20:,.0f} MiB per worker (\u00b1"
        + ("unbounded" if t.get("memory_error") is None else f"{t['memory_error']:.0%}") + ")")
    words = (f"Predicted: micro-batch {t['micro_batch_size']} x accumulation {t['accumulation_steps']} keeps global "
             f"batch {t['global_batch_size']} at {t['num_workers']} workers: {t['samples_per_second']:,.1f} samples/s "
             f"({error}: {t['throughput_error_rule']}), {memory}.")
    if p.target_run is not None:
        words += (f" The run there: {hours_text(p.target_run.wall_seconds)} wall, "
                  f"{figure(p.target_run.device_hours)} device-hours (predicted).")
    return words
