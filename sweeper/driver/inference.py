"""The inference sweep (task=inference), start to finish: check, connect, time every batch size of every
model as Ray Tune trials, set the measured knee beside the roofline's prediction, record, plot.

Takes typed config only; Hydra stays in `__main__`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from sweeper import tracking
from sweeper.cluster import runs
from sweeper.config import ModelConfig, SweeperConfig, budget_bytes, tracking_uri, validate
from sweeper.driver import console
from sweeper.driver import decode_answer, resume
from sweeper.driver.skeleton import Phases, Session, session
from sweeper.errors import EXIT_OK, EXIT_POINT_FAILED, ConfigError, first_line
from sweeper.inference import roofline
from sweeper.inference.latency import InferenceSpec, group_label, label
from sweeper.measure import flops
from sweeper.plan import GridPoint
from sweeper.report import plots
from sweeper.report.folders import default_folder
from sweeper.schema import InferenceResult, SweepSummary
from sweeper.workloads import models

Rows = List[Tuple[str, InferenceResult]]


def model_configs(cfg: SweeperConfig) -> List[ModelConfig]:
    """The models to time: the configured one, or one MLP per `inference.mlp_widths` entry."""
    if cfg.inference.mlp_widths:
        return [replace(cfg.model, width=int(w)) for w in cfg.inference.mlp_widths]
    return [cfg.model]


def decode_contexts(cfg: SweeperConfig) -> List[Optional[int]]:
    """model=gpt: the contexts decode is timed at (inference.contexts, else model.context); else [None]."""
    if not models.is_language_model(cfg.model):
        return [None]
    return [int(c) for c in (cfg.inference.contexts or [cfg.model.context])]


def run(cfg: SweeperConfig, resolved_yaml: str) -> int:
    """Run the inference sweep; the exit status is 0 when every point ended ok or oom, 1 if any failed."""
    phases = Phases()
    uri = tracking_uri(cfg.tracking)
    problems = validate(cfg) + models.check(cfg.model, cfg.data.num_classes) + tracking.check(uri)
    if problems:
        raise ConfigError(problems)
    num_classes = cfg.data.num_classes  # random inputs: no dataset is read
    chosen = model_configs(cfg)
    groups = specs(cfg, chosen, num_classes)
    phases("setup")
    with session(cfg, phases, [GridPoint(1, 1, 1)]) as s:
        name = resume.sweep_name("inference", cfg.model.name)
        parent = s.tracker.start_sweep(name, sweep_params(cfg, chosen, s.resources), resolved_yaml, task="inference")
        console.print_where(s.uri, s.cluster.dashboard_url, s.cluster.token_path, s.cluster.results_dir)
        console.print_start(sum(len(g) for g in groups), len(groups), groups="Ray Tune trial(s), one per model")
        rows, facts = measure(s, name, groups)
        if models.is_language_model(cfg.model):
            knees = decode_answer.record(cfg, s.tracker, [g[0] for g in groups], rows, facts)
        else:
            knees = record_knees(cfg, s.tracker, chosen, num_classes, rows, facts)
        png = plot(cfg, s, name, [group_label(g[0]) for g in groups], rows, knees)
        statuses = Counter(r.status for _, r in rows)
        s.end(SweepSummary().count(statuses),
              "FAILED" if statuses["failed"] else "FINISHED")
        console.print_inference_summary(rows, knees, facts, uri, parent, cfg.tracking.experiment_name, png)
        return EXIT_POINT_FAILED if statuses["failed"] else EXIT_OK


def specs(cfg: SweeperConfig, chosen: List[ModelConfig], num_classes: int) -> List[List[InferenceSpec]]:
    """One group of batch sizes per model (a decoder: per context), smallest first."""
    contexts = decode_contexts(cfg)
    counts = {(label(m), c): _count_flops(m, num_classes, c) for m in chosen for c in contexts}
    return [
        [
            InferenceSpec(
                model=m,
                num_classes=num_classes,
                batch_size=int(b),
                warmup_runs=cfg.inference.warmup_runs,
                timed_runs=cfg.inference.timed_runs,
                min_timed_seconds=cfg.inference.min_timed_seconds,
                flop_count=counts[(label(m), context)],
                memory_budget_bytes=budget_bytes(cfg.device),
                seed=cfg.train.seed,
                context=context,
            )
            for b in sorted(set(cfg.inference.batch_sizes))
        ]
        for m in chosen for context in contexts
    ]


def sweep_params(cfg: SweeperConfig, chosen: List[ModelConfig], resources) -> Dict[str, Any]:
    return {
        "task": "inference",
        "model": cfg.model.name,
        "models": [label(m) for m in chosen],
        "batch_sizes": sorted(set(cfg.inference.batch_sizes)),
        "contexts": None if decode_contexts(cfg) == [None] else decode_contexts(cfg),
        "timed_runs": cfg.inference.timed_runs,
        "min_timed_seconds": cfg.inference.min_timed_seconds,
        "use_gpu": resources.use_gpu,
        "cpus_per_worker": resources.cpus_per_worker,
        "threads": resources.threads_per_worker,
        "device_memory_budget_gb": cfg.device.memory_budget_gb,
    }


def measure(s: Session, name: str, groups: List[List[InferenceSpec]]) -> Tuple[Rows, Dict[str, Any]]:
    """Every batch size of every model timed on the cluster and recorded as it arrives; the device's
    facts (its memory bandwidth) measured after them."""
    by_key = {spec.key: (group_label(spec), spec) for group in groups for spec in group}
    rows: Rows = []
    facts: Dict[str, Any] = {}

    def on_result(result: InferenceResult) -> None:
        model_label, spec = by_key[result.trial_key]
        params = {
            "task": "inference",
            "model": spec.model.name,
            "model_label": model_label,
            "width": spec.model.width if spec.model.name == "mlp" else None,
            "batch_size": spec.batch_size,
            "input_shape": list(spec.model.input_shape),
            **({} if spec.context is None else {"context": spec.context, "measurement": "decode"}),
        }
        s.tracker.log_inference(params, result)
        rows.append((model_label, result))
        console.print_inference_point(model_label, spec.batch_size, result)

    runs.run_inference(name, groups, s.resources, s.cluster, on_result, facts.update)
    return rows, facts


def plot(cfg: SweeperConfig, s: Session, name: str, labels: List[str], rows: Rows, knees) -> str:
    folder = default_folder(s.uri, name)
    os.makedirs(folder, exist_ok=True)
    series = {
        model_label: [
            (int(r.batch_size), r["samples_per_second"], r["latency_p50_seconds"], r["latency_p99_seconds"])
            for lbl, r in rows
            if lbl == model_label and r.status == "ok"
        ]
        for model_label in labels
    }
    png = plots.inference_curves(series, knees, os.path.join(folder, "inference_curves.png"))
    s.tracker.log_artifacts(folder, "report")
    return png


def record_knees(
    cfg: SweeperConfig,
    tracker: tracking.Tracker,
    chosen: List[ModelConfig],
    num_classes: int,
    rows: Rows,
    facts: Dict[str, Any],
) -> Dict[str, Tuple[Optional[int], Optional[int]]]:
    """Per model, the measured knee (first batch after which doubling gains < report.knee_min_gain)
    and the roofline's predicted knee on the same grid, logged side by side on the parent run."""
    from sweeper.inference import bandwidth

    knees: Dict[str, Tuple[Optional[int], Optional[int]]] = {}
    metrics: Dict[str, float] = {}
    bandwidth_bps = facts.get("bandwidth_bytes_per_second")
    if bandwidth_bps:
        metrics["bandwidth_bytes_per_second"] = bandwidth_bps
        tracker.log_sweep_tags({"sweeper.bandwidth_source": str(facts.get("bandwidth_source"))})
    for model in chosen:
        name = label(model)
        ok = sorted((int(r.batch_size), r["samples_per_second"]) for lbl, r in rows
                    if lbl == name and r.status == "ok")
        measured = roofline.measured_knee([b for b, _ in ok], [t for _, t in ok], cfg.report.knee_min_gain)
        peaks = [r["peak_flops_per_second"] for lbl, r in rows if lbl == name and "peak_flops_per_second" in r]
        peak = peaks[0] if peaks else None
        predicted = None
        if peak and bandwidth_bps:
            try:
                device_peak = flops.PeakFlops(peak, "as measured by the trial")
                device_bandwidth = roofline.Bandwidth(bandwidth_bps, str(facts.get("bandwidth_source")))
                prediction, traffic = bandwidth.predict_model_knee(model, num_classes, device_peak, device_bandwidth)
                grid = sorted(set(cfg.inference.batch_sizes))
                predicted = prediction.knee_on_grid(grid, cfg.report.knee_min_gain)
                metrics.update({
                    f"knee_predicted_batch_size_{name}": predicted if predicted is not None else -1,
                    f"knee_predicted_exact_batch_size_{name}": prediction.knee_batch_size or -1,
                    f"ridge_flops_per_byte_{name}": prediction.ridge_flops_per_byte,
                    f"weight_bytes_{name}": traffic.weight_bytes,
                    f"activation_bytes_per_sample_{name}": traffic.activation_bytes_per_sample,
                    f"peak_flops_per_second_{name}": peak,
                })
            except Exception as exc:  # noqa: BLE001 - the prediction is extra; the measurement stands
                console.warn(f"no roofline prediction for {name}: {first_line(exc)}")
        metrics[f"knee_measured_batch_size_{name}"] = measured if measured is not None else -1
        knees[name] = (measured, predicted)
    tracker.log_parent_metrics(metrics)
    return knees


def _count_flops(model: ModelConfig, num_classes: int, context: Optional[int] = None) -> Optional[flops.FlopCount]:
    """FLOPs per sample of one forward; a decoder's per token of a decode step at `context` (its closed
    form, 2N + 4 L d T: the worker counts the step itself and records both)."""
    if context is not None:
        from sweeper.workloads import gpt

        per_token = gpt.decode_flops_per_token(num_classes, context, model.n_layer, model.d_model)
        return flops.FlopCount(forward_per_sample=per_token, train_per_sample=3 * per_token)
    try:
        return flops.count_flops(lambda: models.build(model, num_classes), models.samples(model, num_classes))
    except Exception as exc:  # noqa: BLE001 - timed without FLOPs and MFU
        console.warn(f"FLOPs not counted for model {model.name!r}: {first_line(exc)}")
        return None
