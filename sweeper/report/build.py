"""The sweep's answer: plots, a self-contained HTML page and a recommendation, built from MLflow alone.

Run at the end of every sweep, or on demand: `python -m sweeper.report <sweep run id | experiment>`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from sweeper import tracking
from sweeper.config import ReportConfig
from sweeper.errors import first_line
from sweeper.report import analysis, branched, classes, folding, headline, plots, reasons, sections, snippets
from sweeper.report.plots import by_parallelism
from sweeper.report import html as html_report
from sweeper.report.analysis import Recommendation, Trial
from sweeper.report.critical_batch import CriticalBatch
from sweeper.report.quality import QUALITIES
from sweeper.plan import GridPoint, frontier_label
from sweeper.schema import FrontierResult, PointResult
from sweeper.units import MiB, format_bytes



@dataclass(frozen=True)
class Report:
    folder: str
    html_path: str
    recommendation: Recommendation
    override_line: Optional[str]
    yaml_path: str
    text: str  # the recommendation in words, as printed and tagged
    critical_batch: Optional[CriticalBatch] = None  # fitted to the points' steps to target, if it could be


def settings_params(cfg: ReportConfig) -> Dict[str, Any]:
    """The report's settings as the sweep's parent params (`report_<key>`), so a rebuild from
    MLflow alone answers the same question the sweep did."""
    return {f"report_{f.name}": getattr(cfg, f.name) for f in fields(ReportConfig)}


def recorded_settings(params: Dict[str, str]) -> ReportConfig:
    """The report settings a sweep recorded (its parent params); the defaults for any it did not."""
    values: Dict[str, Any] = {}
    for f in fields(ReportConfig):
        text = params.get(f"report_{f.name}")
        if text is not None:
            values[f.name] = text if f.name in ("objective", "quality") else _number(text)
    return replace(ReportConfig(), **values)


def variant(cfg: ReportConfig, params: Dict[str, str]) -> Optional[str]:
    """None when `cfg` asks what the sweep itself asked; else a name for the other question, e.g.
    `objective=accuracy,min_accuracy=0.9`, under which its report is kept beside the sweep's own."""
    own = recorded_settings(params)
    changed = [f"{f.name}={getattr(cfg, f.name)}" for f in fields(ReportConfig)
               if getattr(cfg, f.name) != getattr(own, f.name)]
    return ",".join(changed) or None


def build(
    tracker: "tracking.Tracker",
    parent_run_id: str,
    cfg: ReportConfig,
    folder: Optional[str] = None,
    log: bool = True,
    sweep: Optional["tracking.SweepRecord"] = None,
) -> Report:
    """Read the sweep from MLflow (unless given), write the report into `folder` and (with `log`)
    attach it to the sweep's parent run: as artifacts `report/` and the recommendation tags when
    `cfg` is the sweep's own report settings (rebuilding it replaces the same files), else under
    `report/variants/<settings>/` without touching the sweep's own answer. `folder` defaults to
    default_folder's, the variant's own for other settings, so files and artifacts agree."""
    sweep = sweep or tracker.load_sweep(parent_run_id)
    variant_name = variant(cfg, sweep.params)
    folder = folder or default_folder(tracker.uri, sweep.run_name, variant_name)
    trials = trials_of(sweep)
    os.makedirs(folder, exist_ok=True)
    # The report's own budget, else the one the sweep ran under (device.memory_budget_gb).
    budget_gb = cfg.memory_budget_gb or _number(sweep.params.get("device_memory_budget_gb"))
    budget = budget_gb * 2**30 if budget_gb else None
    found = folding.critical_batch(trials)
    # sweep.strategy=branch: the branches' answer, whose critical batch size is the quality rule
    is_branch = sweep.params.get("strategy") == "branch"
    answer = branched.read(tracker, parent_run_id) if is_branch else None

    rec = _recommend(trials, cfg, budget, found, branched.limit(answer) if is_branch else None, sweep.params)
    line = analysis.override_line(rec.best) if rec.best else None
    yaml_path = _write_text(os.path.join(folder, "recommendation.yaml"), analysis.recommendation_yaml(
        rec, cfg.objective, cfg.min_accuracy, budget, cfg.max_accuracy_drop, cfg.max_loss_rise))
    images = _draw_plots(folder, trials, cfg, sweep.params, budget, rec, found)
    images.update(by_parallelism.draw(folder, trials, budget))  # only when it measured several parallelisms
    limit = sweep.params.get("data_parallel_limit")  # driver.predicted.beyond_data_parallelism's line
    if limit:
        _append_limit(yaml_path, limit)
    why = recommendation_text(rec, line, found, folding.single_context(trials))
    glance = branched.glance(answer, rec.best, trials, line) if answer is not None and rec.best else None
    word = branched.chosen_word(answer, glance)  # the recommended point's verdict in the alternatives
    text = answer_text(rec, line, found, folding.single_context(trials), glance, word)
    extra: List[Any] = [("Alternatives", headline.alternatives(rec, word)), ("Why", why),
                        ("Accuracy classes", classes.words(rec.classes, coupled(sweep.params)))]
    if answer is not None:
        extra += _branch_sections(answer, folder, trials, found, images)
        text += "\n" + branched.headline(answer).strip()
    if limit:
        extra.insert(0, ("Beyond data parallelism", f"Data parallelism is not enough: {limit}."))
        text += f"\nData parallelism is not enough: {limit}."
    # The parent's own figures: the frontier searches' (sweep.micro_batch_sizes=auto) and the smart
    # strategy's compute ledger.
    sweep_figures = tracker.sweep_metrics(parent_run_id)
    html = html_report.render(sweep.run_name, [_row(t) for t in sorted(trials, key=_speed, reverse=True)], images,
                              "\n".join(headline.headline(rec, line, glance)),
                              _settings_shown(parent_run_id, cfg, budget_gb, rec.quality),
                              extra + sections.sections(trials, found, {**sweep.params, **settings_params(cfg)},
                                                        sweep_figures))
    html_path = _write_text(os.path.join(folder, "report.html"), html)
    pasteable = _write_snippets(yaml_path, folder, sweep.params, answer)
    report = Report(folder, html_path, rec, line, yaml_path, text, found)
    if log:
        # Only the files written here: the folder may hold others (the frontier's, logged on their own).
        _attach(tracker, parent_run_id, variant_name, report, [yaml_path, html_path, *images.values()], pasteable)
        if variant_name is None:
            _log_critical_batch(tracker, parent_run_id, trials, found, sweep.params)
    return report


def _append_limit(yaml_path: str, limit: str) -> None:
    """recommendation.yaml gets `beyond_data_parallelism`: why even ZeRO-3 at the most workers cannot hold the
    model (tensor or pipeline parallelism are outside sweeper's scope)."""
    import yaml

    with open(yaml_path, "a") as f:
        f.write(yaml.safe_dump({"beyond_data_parallelism": limit}, width=10_000))


def _recommend(trials: List[Trial], cfg: ReportConfig, budget: Optional[float], found: Optional[CriticalBatch],
               batch_limit: Optional[Tuple[int, Callable[[int], str]]], params: Dict[str, str]) -> Recommendation:
    """The recommendation under the report's settings, the critical batch size's quality rule and, for
    sweep.strategy=branch, the branches' batch limit."""
    return analysis.recommend(trials, cfg.objective, cfg.min_accuracy, budget, cfg.max_accuracy_drop,
                              level=cfg.confidence, critical_batch=found, quality=cfg.quality,
                              max_loss_rise=cfg.max_loss_rise, batch_limit=batch_limit, coupled=coupled(params))


def _attach(tracker: "tracking.Tracker", run_id: str, variant_name: Optional[str], report: Report,
            files: List[str], pasteable: List[str]) -> None:
    """The report's files as the sweep run's artifacts: under `report/` with the answer's tags for the
    sweep's own settings, else under `report/variants/<settings>/` without them; its snippets beside."""
    where = "report" if variant_name is None else f"report/variants/{variant_name}"
    if variant_name is None:
        tracker.log_report(run_id, files, where, report.text, report.override_line)
    else:
        tracker.log_report(run_id, files, where)
    if pasteable:
        tracker.log_report(run_id, pasteable, f"{where}/snippets")


def _branch_sections(answer: Dict[str, Any], folder: str, trials: List[Trial], found: Optional[CriticalBatch],
                     images: Dict[str, str]) -> List[Any]:
    """sweep.strategy=branch: the critical batch size over training drawn into `images` (when there is
    something to draw) and the branches' two report sections."""
    drawn = branched.plot(answer, os.path.join(folder, "critical_batch_over_training.png"),
                          found.critical_batch_size if found else None, folding.b_simple_mean(trials))
    if drawn:
        images["critical_batch_over_training"] = drawn
    return [("Critical batch size over training (sweep.strategy=branch)", branched.words(answer)),
            ("Branches by checkpoint", branched.section_rows(answer))]


def _write_snippets(yaml_path: str, folder: str, params: Dict[str, str], answer: Optional[Dict[str, Any]]) -> List[str]:
    """The answer as settings for the trainer a team uses (Lightning, Hugging Face, DeepSpeed, Ray
    Train, torchrun), beside the sweeper's own override line; the branch strategy's schedule too."""
    with open(yaml_path) as f:
        pasteable = snippets.write_from_recommendation(f.read(), os.path.join(folder, "snippets"),
                                                       params.get("use_gpu") == "True")
    if answer is not None:
        pasteable += branched.snippets_for(answer, os.path.join(folder, "snippets"))
    return pasteable


def _log_critical_batch(tracker: "tracking.Tracker", run_id: str, trials: List[Trial],
                        found: Optional[CriticalBatch], params: Dict[str, str]) -> None:
    """The sweep-level prediction on the parent run: critical_batch_* and gns_b_simple_mean metrics,
    the LR rule it holds under as tag sweeper.critical_batch_lr_rule, or why there is none as tag
    sweeper.critical_batch."""
    metrics = folding.critical_batch_metrics(found, folding.b_simple_mean(trials))
    tags = {"sweeper.critical_batch_lr_rule": sections.lr_rule(params)} if found else {
        "sweeper.critical_batch": folding.no_fit_reason(trials)}
    tracker.log_sweep_metrics(run_id, metrics, tags)


def _draw_plots(
    folder: str,
    trials: List[Trial],
    cfg: ReportConfig,
    params: Dict[str, str],
    budget: Optional[float],
    rec: Recommendation,
    found: Optional[CriticalBatch] = None,
) -> Dict[str, str]:
    """The report's figures as `<folder>/<name>.png`, by name; a figure with nothing to show (no
    validation accuracy, no target, one recipe) is left out. One mark per point (seeds folded), one
    per layout on the throughput and memory views (LR multipliers folded too)."""
    lr_label = f"LR scaling: {params.get('lr_scaling', '?')} (base {params.get('base_batch_size', '?')})"
    layouts = folding.fold_layouts(trials)
    # A language model's throughput is tokens/s: drawn in the samples/s slot, the axis named for it.
    # Points that ran out of memory or failed have neither figure and stay as they are (the red x).
    rated, unit = layouts, "samples/s"
    if any(t.tokens_per_second is not None for t in layouts):
        rated = [replace(t, samples_per_second=t.tokens_per_second) if t.samples_per_second is not None else t
                 for t in layouts]
        unit = "tokens/s"
    images: Dict[str, str] = {}
    for name, draw in (
        ("throughput_vs_micro_batch", lambda p: plots.throughput_vs_micro_batch(
            rated, knees_per_recipe(rated, cfg.knee_min_gain), p, cfg.knee_min_gain, unit)),
        ("memory_vs_micro_batch", lambda p: plots.memory_vs_micro_batch(layouts, p, budget_bytes=budget)),
        ("memory_by_recipe", lambda p: plots.memory_by_recipe(layouts, p, budget_bytes=budget)),
        ("accuracy_vs_global_batch", lambda p: plots.accuracy_vs_global_batch(
            trials, p, lr_label, cfg.confidence, QUALITIES[rec.quality])),
        ("time_to_target_vs_global_batch", lambda p: plots.time_to_target_vs_global_batch(trials, p)),
        ("steps_to_target_vs_global_batch", lambda p: plots.steps_to_target_vs_global_batch(
            trials, p, found, lr_label)),
        ("pareto_throughput_memory", lambda p: plots.pareto_throughput_memory(
            rated, analysis.pareto(rated), p, rec.best, unit)),
    ):
        written = draw(os.path.join(folder, f"{name}.png"))
        if written:
            images[name] = written
    return images


def knees_per_recipe(layouts: List[Trial], min_gain: float) -> Dict[Tuple[int, int, str], Optional[int]]:
    """analysis.knees within each recipe and context (a series holds one recipe's sizes at one context),
    keyed as the plots' series: (accumulation, workers, the series' label beyond fp32, else "")."""
    out: Dict[Tuple[int, int, str], Optional[int]] = {}
    for label in sorted({plots.series_of(t)[2] for t in layouts}):
        own = [t for t in layouts if plots.series_of(t)[2] == label]
        out.update({(a, w, label): knee for (a, w), knee in analysis.knees(own, min_gain).items()})
    return out


def _limit(value: Optional[float]) -> str:
    return "none" if value is None else f"{value:g}"


def _settings_shown(parent_run_id: str, cfg: ReportConfig, budget_gb: Optional[float], quality: str
                    ) -> Dict[str, str]:
    """What the page says it answered: the sweep's run and the settings the recommendation applied."""
    return {
        "MLflow run": parent_run_id,
        "objective": cfg.objective,
        "min accuracy": "none" if cfg.min_accuracy is None else f"{cfg.min_accuracy:g}",
        "quality": cfg.quality if cfg.quality != "auto" else f"auto ({quality})",
        "max accuracy drop" if quality == "val_accuracy" else "max loss rise": _limit(
            cfg.max_accuracy_drop if quality == "val_accuracy" else cfg.max_loss_rise),
        "memory budget": f"{budget_gb:g} GiB" if budget_gb else "none",
        "knee": f"first micro-batch after which doubling gains < {cfg.knee_min_gain:.0%}",
    }


def _write_text(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def frontier_files(sweep_folder: str, search: GridPoint, probes: List[PointResult], result: FrontierResult) -> str:
    """A frontier search (a worker count in one recipe) as files in `<sweep folder>/frontier`: its
    probes and fitted line against the budget (PNG) and every probe's numbers (JSON), named by the
    search's label (w2, w2-bf16-ckpt). Returns the folder."""
    num_workers, label = search.num_workers, frontier_label(search)
    folder = os.path.join(sweep_folder, "frontier")
    os.makedirs(folder, exist_ok=True)
    trials = [
        Trial(
            key=p.trial_key,
            micro_batch_size=int(p.micro_batch_size),
            accumulation_steps=int(p.accumulation_steps or 1),
            num_workers=num_workers,
            global_batch_size=int(p.micro_batch_size) * int(p.accumulation_steps or 1) * num_workers,
            status=p.status or "failed",
            peak_memory_bytes=p.memory.peak_memory_bytes,
        )
        for p in probes
    ]
    # One line per (accumulation) series, fitted by the plot itself over that series' probes.
    plots.memory_vs_micro_batch(
        trials, os.path.join(folder, f"memory_frontier_{label}.png"), budget_bytes=result.memory_budget_bytes,
    )
    keep = ("trial_key", "probe_role", "micro_batch_size", "accumulation_steps", "status", "error", "peak_memory_bytes",
            "memory_tracked_peak_bytes", "memory_activations_bytes", "memory_forward_activations_bytes")
    flat = [p.to_flat() for p in probes]
    record = {"frontier": result.to_flat(), "probes": [{k: p[k] for k in keep if k in p} for p in flat]}
    with open(os.path.join(folder, f"frontier_{label}.json"), "w") as f:
        json.dump(record, f, indent=2, default=str)
    return folder


def default_folder(uri: str, run_name: str, variant_name: Optional[str] = None) -> str:
    """Next to the MLflow store: `<store folder>/reports/<sweep run name>` for a SQLite or file
    store, `./reports/<name>` for a tracking server; a report with other settings than the
    sweep's in `variants/<settings>` below it, as in MLflow. Names come from the store (a run name
    anyone with write access can set): each becomes one safe path component, so a report is always
    written under `reports/`."""
    folder = os.path.join(tracking.store_folder(uri), "reports", safe_name(run_name))
    return os.path.join(folder, "variants", safe_name(variant_name)) if variant_name else folder


def safe_name(name: str) -> str:
    """One path component: letters, digits and `._=,-` kept, anything else (a separator, `..`) made
    `_`, and never empty or hidden."""
    cleaned = re.sub(r"[^A-Za-z0-9._=,-]", "_", name).lstrip(".")
    return cleaned or "_"


def _number(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text not in (None, "None") else None
    except ValueError:
        return None


# Labels of the bundled datasets whose labels are real (data=synthetic's are random: its accuracy sits
# at chance by design, so no chance check applies). A child run's own `num_classes` (param or metric)
# wins; a dataset not named here leaves the pooled chance check off.
KNOWN_CLASSES = {"digits": 10, "cifar10": 10}


def num_classes(row: Dict[str, Any], sweep_params: Dict[str, str]) -> Optional[int]:
    """The class count behind a child run's accuracy: its own record when it has one, else the
    sweep's dataset when it is a bundled one with real labels (KNOWN_CLASSES); None: unknown."""
    own = _number(None if row.get("num_classes") is None else str(row.get("num_classes")))
    if own is not None and own >= 2:
        return int(own)
    return KNOWN_CLASSES.get(str(sweep_params.get("dataset")))


def coupled(params: Dict[str, str]) -> Optional[bool]:
    """Whether the sweep's model has batch-coupled layers (param batch_coupled_layers: "none" or their
    names); None for a record from before the param: the report then judges every point on its own."""
    layers = params.get("batch_coupled_layers")
    return None if layers is None else layers.strip() != "none"


def trials_of(sweep: "tracking.SweepRecord") -> List[Trial]:
    """The sweep's child runs as Trials, each with the class count the report's pooled chance check
    needs (`num_classes`)."""
    return [replace(_trial(row), num_classes=num_classes(row, sweep.params)) for row in sweep.children]


def _trial(row: Dict[str, Any]) -> Trial:
    """One child run's row (params and metrics by name, sweeper.* tags) as a Trial. Params come back
    as text ("None" for an unset one); a record from before seeds or recipes leaves those fields None."""
    def number(name: str) -> Optional[float]:
        value = row.get(name)
        return None if value in (None, "None", "") else float(value)

    def whole(name: str) -> Optional[int]:
        value = number(name)
        return None if value is None else int(value)

    def text(name: str) -> Optional[str]:
        value = row.get(name)
        return None if value in (None, "None", "") else str(value)

    stable, compiled, reached = row.get("sweeper.throughput_stable"), text("compiled"), number("reached_target")
    return Trial(
        key=row["key"],
        micro_batch_size=int(row["micro_batch_size"]),
        accumulation_steps=int(row["accumulation_steps"]),
        num_workers=int(row["num_workers"]),
        global_batch_size=int(row["global_batch_size"]),
        status=row.get("status") or "failed",
        lr=number("lr"),
        samples_per_second=number("samples_per_second"),
        samples_per_second_cv=number("samples_per_second_cv"),
        throughput_stable=None if stable is None else stable == "true",
        peak_memory_bytes=number("peak_memory_bytes"),
        val_accuracy=number("val_accuracy"),
        train_seconds=number("train_seconds"),
        samples_seen=number("samples_seen"),
        # The point's replicates share param `point` (tag sweeper.point in older records).
        point_key=text("point") or text("sweeper.point"),
        seed=whole("seed"),
        lr_multiplier=number("lr_multiplier"),
        precision=text("precision"),
        parallelism=text("parallelism"),
        gradient_sync=text("gradient_sync"),
        memory_predicted_bytes=number("memory_predicted_bytes"),
        communication_bytes_per_step=number("communication_bytes_per_step"),
        activation_checkpointing=text("activation_checkpointing"),
        optimizer=text("optimizer"),
        compiled=None if compiled is None else compiled.lower() == "true",
        error=text("sweeper.error"),
        diverged_reason=text("sweeper.divergence"),
        diverged_at_step=whole("diverged_at_step"),
        val_loss=number("val_loss"),
        val_samples=whole("val_samples"),
        train_loss=number("train_loss"),  # the series' last step: MLflow's latest value
        steps_to_target=number("steps_to_target"),
        samples_to_target=number("samples_to_target"),
        time_to_target_seconds=number("time_to_target_seconds"),
        reached_target=None if reached is None else reached > 0,
        gns_b_simple=number("gns_b_simple"),
        gns_b_simple_train_avg=number("gns_b_simple_train_avg"),
        tokens_per_second=number("tokens_per_second"),
        val_loss_se=number("val_loss_se"),
        val_bits_per_byte=number("val_bits_per_byte"),
        train_unigram_entropy_bits=number("train_unigram_entropy_bits"),
        context=whole("context"),
        memory_activations_bytes=number("memory_activations_bytes"),
    )


def _speed(t: Trial) -> float:
    return t.tokens_per_second or t.samples_per_second or -1.0


def _row(t: Trial) -> Dict[str, str]:
    """One run of the report's table of points; a language model's lead with tokens/s and the judged loss."""
    def fmt(value: Optional[float], pattern: str) -> str:
        return "-" if value is None else pattern.format(value)

    row = {
        "point": t.key,
        "micro": str(t.micro_batch_size),
        "accum": str(t.accumulation_steps),
        "workers": str(t.num_workers),
        "global": str(t.global_batch_size),
        "status": t.status + (f" ({t.diverged_reason})" if t.status == "diverged" and t.diverged_reason else ""),
        "samples/s": fmt(t.samples_per_second, "{:.1f}") + ("" if t.throughput_stable is not False else " (unstable)"),
        "cv": fmt(t.samples_per_second_cv, "{:.1%}"),
        "comm MiB/step": fmt(None if t.communication_bytes_per_step is None
                             else t.communication_bytes_per_step / MiB, "{:.1f}"),
        "peak MiB": fmt(None if t.peak_memory_bytes is None else t.peak_memory_bytes / MiB, "{:.0f}"),
        "val acc": fmt(t.val_accuracy, "{:.3f}"),
        "lr": fmt(t.lr, "{:.4g}"),
        "B_simple": fmt(t.gns_b_simple, "{:.1f}"),
    }
    if t.tokens_per_second is None:
        return row
    # A language model: throughput in tokens, quality as the judged loss (bits per byte, else nats per token).
    lead = {"point": t.key, "tokens/s": fmt(t.tokens_per_second, "{:.0f}")}
    if t.val_bits_per_byte is not None:
        lead["bits/byte"] = fmt(t.val_bits_per_byte, "{:.3f}")
    elif t.val_loss is not None:
        lead["val loss"] = fmt(t.val_loss, "{:.3f}")
    if t.activation_bytes_per_token is not None:
        row["act. KiB/token"] = fmt(t.activation_bytes_per_token / 1024, "{:.1f}")
    return {**lead, **{k: v for k, v in row.items() if k not in lead}}


def answer_text(rec: Recommendation, line: Optional[str], found: Optional[CriticalBatch] = None,
                context: Optional[int] = None, glance: Optional[Tuple[List[str], Optional[str]]] = None,
                chosen_word: str = "recommended") -> str:
    """What the console prints and the parent run's tag holds: the headline (at most 3 lines of 120
    characters; a branch sweep's `glance` says whether to train the schedule or the constant layout), the
    table of alternatives, and the critical batch size in one line."""
    text = "\n".join(headline.headline(rec, line, glance))
    rows = headline.alternatives(rec, chosen_word)
    if rows:
        text += "\n" + headline.table_text(rows)
    if found is not None:
        text += f"\nCritical batch: {found.in_words(context)}."
    return text


def recommendation_text(rec: Recommendation, line: Optional[str], found: Optional[CriticalBatch] = None,
                        context: Optional[int] = None) -> str:
    """The full reasoning: the report's "Why"."""
    if rec.best is None:
        text = f"No recommendation: {rec.reason}"
    else:
        best = rec.best
        tokens = "" if best.context is None else f" sequences, {best.global_batch_size * best.context} tokens"
        text = f"Train with {rec.best.key} (global batch {rec.best.global_batch_size}{tokens}). {rec.reason}"
        if line:
            text += f"\nOverrides: {line}"
        if rec.runners_up:
            text += "\nRunners-up: " + "; ".join(_figures_text(t, rec.quality) for t in rec.runners_up)
    if found is not None:
        text += f"\nCritical batch: {found.in_words(context)}."
    return text


def _figures_text(t: Trial, quality: str = "val_accuracy") -> str:
    figures = [reasons.rate_text(t) if t.samples_per_second is not None else "no throughput"]
    if t.peak_memory_bytes is not None:
        figures.append(format_bytes(t.peak_memory_bytes, 0, unit="MiB"))
    value = getattr(t, quality)
    if value is not None:
        figures.append(f"{quality} {value:.3f}")
    return f"{t.key} ({', '.join(figures)})"


def _optional_float(text: str) -> Optional[float]:
    return None if text.lower() in ("none", "null") else float(text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from sweeper.config import report as report_settings

    parser = argparse.ArgumentParser(
        prog="python -m sweeper.report",
        description="Rebuild a sweep's report (plots, HTML, recommendation) from MLflow alone. Every setting "
        "defaults to the one the sweep ran with; a report with other settings is kept beside the sweep's own "
        "(artifacts report/variants/<settings>/), never over it.",
    )
    parser.add_argument("sweep", help="the sweep's parent run id, or an experiment name (its latest sweep)")
    parser.add_argument("--tracking-uri", default=None, help="default: sqlite:///<cwd>/mlflow.db")
    # SUPPRESS: an option not given is absent, so the sweep's own setting applies ("none" clears one).
    keep = argparse.SUPPRESS
    parser.add_argument("--objective", default=keep, choices=report_settings.OBJECTIVES)
    parser.add_argument("--min-accuracy", type=_optional_float, default=keep, help="a fraction, or none")
    parser.add_argument("--memory-budget-gb", type=_optional_float, default=keep,
                        help="GiB per worker; none: the device budget the sweep ran under, if any")
    parser.add_argument("--max-accuracy-drop", type=_optional_float, default=keep, help="a fraction, or none")
    parser.add_argument("--quality", default=keep, choices=report_settings.QUALITY_CHOICES,
                        help="what 'better' means; auto: bits per byte or the loss for a language model")
    parser.add_argument("--max-loss-rise", type=_optional_float, default=keep,
                        help="the tolerance when the quality is a loss, in its units, or none")
    parser.add_argument("--knee-min-gain", type=float, default=keep)
    parser.add_argument("--out", default=None, help="default: <MLflow store folder>/reports/<sweep run name>")
    parser.add_argument("--no-log", action="store_true", help="write files only; do not attach them to the run")
    args = parser.parse_args(argv)

    from sweeper.config import TrackingConfig, tracking_uri

    uri = args.tracking_uri or tracking_uri(TrackingConfig())
    problems = tracking.check(uri, must_exist=True)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        tracker, parent = tracking.Tracker.for_sweep(uri, args.sweep)
        sweep = tracker.load_sweep(parent)
        given = {f.name: getattr(args, f.name) for f in fields(ReportConfig) if hasattr(args, f.name)}
        cfg = replace(recorded_settings(sweep.params), **given)
        problems = report_settings.check(cfg, key=lambda name: "--" + name.replace("_", "-"))
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 2
        report = build(tracker, parent, cfg, args.out, log=not args.no_log, sweep=sweep)
    except (LookupError, ValueError, OSError, *tracking.store_errors()) as exc:
        print(f"error: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        return 2
    print(report.text)
    print(f"report: {report.html_path}")
    print(f"as YAML: {report.yaml_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
