"""The sweep's answer: plots, a self-contained HTML page and a recommendation, built from MLflow alone,
and attached to the sweep's run. This module orders the steps; each has its own module: the record read
as Trials (recorded.py), the recommendation (analysis.py), the figures (figures.py), the words (text.py),
the page (html.py), where the files go (folders.py).

Run at the end of every sweep, or on demand: `python -m sweeper.report` (cli.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from sweeper import tracking
from sweeper.config import ReportConfig
from sweeper.report import (analysis, branched, classes, figures, folding, headline, html, projection,
                            projection_sections, sections, snippets)
from sweeper.report.analysis import Recommendation, Trial
from sweeper.report.critical_batch import CriticalBatch
from sweeper.report.folders import default_folder
from sweeper.report.recorded import coupled, number, settings_params, trials_of, variant
from sweeper.report.text import answer_text, recommendation_text, table_rows


@dataclass(frozen=True)
class Report:
    folder: str
    html_path: str
    recommendation: Recommendation
    override_line: Optional[str]
    yaml_path: str
    text: str  # the recommendation in words, as printed and tagged
    critical_batch: Optional[CriticalBatch] = None  # fitted to the points' steps to target, if it could be
    # the run at full length, the sweep's cost, the throughput model, goodput, report.target_workers
    projected: Optional[projection.Projection] = None


def build(
    store: tracking.Store,
    parent_run_id: str,
    cfg: ReportConfig,
    folder: Optional[str] = None,
    log: bool = True,
    sweep: Optional[tracking.SweepRecord] = None,
) -> Report:
    """Read the sweep from MLflow (unless given), write the report into `folder` and (with `log`)
    attach it to the sweep's parent run: as artifacts `report/` and the recommendation tags when
    `cfg` is the sweep's own report settings (rebuilding it replaces the same files), else under
    `report/variants/<settings>/` without touching the sweep's own answer. `folder` defaults to
    default_folder's, the variant's own for other settings, so files and artifacts agree."""
    reader = tracking.SweepReader(store, parent_run_id)
    sweep = sweep or reader.load()
    variant_name = variant(cfg, sweep.params)
    folder = folder or default_folder(store.uri, sweep.run_name, variant_name)
    trials = trials_of(sweep)
    os.makedirs(folder, exist_ok=True)
    # The report's own budget, else the one the sweep ran under (device.memory_budget_gb).
    budget_gb = cfg.memory_budget_gb or number(sweep.params.get("device_memory_budget_gb"))
    budget = budget_gb * 2**30 if budget_gb else None
    found = folding.critical_batch(trials)
    is_branch = sweep.params.get("strategy") == "branch"  # the branches' answer: its critical batch rules quality
    answer = branched.read(reader) if is_branch else None

    rec = _recommend(trials, cfg, budget, found, branched.limit(answer) if is_branch else None, sweep.params)
    projected = projection.project(rec, trials, cfg, sweep.params, reader.spent(), budget,
                                   branched.flat(answer)[0] if answer else None)
    line = analysis.override_line(rec.best) if rec.best else None
    yaml_path = _write_yaml(folder, rec, cfg, budget, projected, line)
    run_line, run = _run_words(projected, line)
    images = figures.draw(folder, trials, cfg, sweep.params, budget, rec, found)
    limit = _append_limit(yaml_path, sweep.params)
    why = recommendation_text(rec, run_line, found, folding.single_context(trials))
    glance = branched.glance(answer, rec.best, trials, line) if answer is not None and rec.best else None
    word = branched.chosen_word(answer, glance)  # the recommended point's verdict in the alternatives
    text = answer_text(rec, line, found, folding.single_context(trials), glance, word, run)
    extra: List[Any] = [("Alternatives", headline.alternatives(rec, word)), ("Why", why),
                        ("Accuracy classes", classes.words(rec.classes, coupled(sweep.params)))]
    if answer is not None:
        extra += _branch_sections(answer, folder, trials, found, images)
        text += "\n" + branched.headline(answer).strip()
    text = _say_limit(limit, extra, text)
    # The parent's own figures: the frontier searches' (sweep.micro_batch_sizes=auto) and the smart
    # strategy's compute ledger.
    extra += sections.sections(trials, found, {**sweep.params, **settings_params(cfg)}, reader.metrics())
    extra += projection_sections.sections(projected, rec.best.key if rec.best else None)
    page = html.render(sweep.run_name, table_rows(trials), images, "\n".join(headline.headline(rec, line, glance, run)),
                       _settings_shown(parent_run_id, cfg, budget_gb, rec.quality), extra)
    html_path = _write_text(os.path.join(folder, "report.html"), page)
    pasteable = _write_snippets(yaml_path, folder, sweep.params, answer, _record_of(sweep, rec.best))
    report = Report(folder, html_path, rec, run_line, yaml_path, text, found, projected)
    if log:
        # Only the files written here: the folder may hold others (the frontier's, logged on their own).
        _attach(store, parent_run_id, variant_name, report, [yaml_path, html_path, *images.values()], pasteable)
        if variant_name is None:
            _log_critical_batch(store, parent_run_id, trials, found, sweep.params)
            tracking.log_sweep_metrics(store, parent_run_id, projection.metrics(projected))
    return report


def _say_limit(limit: Optional[str], extra: List[Any], text: str) -> str:
    """The answer's text with the data-parallel limit said last, and its section put first (nothing without one)."""
    if not limit:
        return text
    extra.insert(0, ("Beyond data parallelism", f"Data parallelism is not enough: {limit}."))
    return text + f"\nData parallelism is not enough: {limit}."


def _append_limit(yaml_path: str, params: Dict[str, str]) -> Optional[str]:
    """recommendation.yaml gets `beyond_data_parallelism` when the sweep recorded it (param data_parallel_limit,
    driver.predicted.beyond_data_parallelism's line): why even ZeRO-3 at the most workers cannot hold the model
    (tensor or pipeline parallelism are outside sweeper's scope). Returns the line, or None."""
    import yaml

    limit = params.get("data_parallel_limit")
    if not limit:
        return None
    with open(yaml_path, "a") as f:
        f.write(yaml.safe_dump({"beyond_data_parallelism": limit}, width=10_000))
    return limit


def _recommend(trials: List[Trial], cfg: ReportConfig, budget: Optional[float], found: Optional[CriticalBatch],
               batch_limit: Optional[Tuple[int, Callable[[int], str]]], params: Dict[str, str]) -> Recommendation:
    """The recommendation under the report's settings, the critical batch size's quality rule and, for
    sweep.strategy=branch, the branches' batch limit."""
    return analysis.recommend(trials, cfg.objective, cfg.min_accuracy, budget, cfg.max_accuracy_drop,
                              level=cfg.confidence, critical_batch=found, quality=cfg.quality_metric or cfg.quality,
                              max_loss_rise=cfg.max_loss_rise, batch_limit=batch_limit, coupled=coupled(params))


def _attach(store: tracking.Store, run_id: str, variant_name: Optional[str], report: Report,
            files: List[str], pasteable: List[str]) -> None:
    """The report's files as the sweep run's artifacts: under `report/` with the answer's tags for the
    sweep's own settings, else under `report/variants/<settings>/` without them; its snippets beside."""
    where = "report" if variant_name is None else f"report/variants/{variant_name}"
    if variant_name is None:
        tracking.log_report(store, run_id, files, where, report.text, report.override_line)
    else:
        tracking.log_report(store, run_id, files, where)
    if pasteable:
        tracking.log_report(store, run_id, pasteable, f"{where}/snippets")


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


def _record_of(sweep: tracking.SweepRecord, best: Optional[Trial]) -> Optional[Dict[str, Any]]:
    """The recommended point's own record (its child run's params and metrics): its recipe for the snippets."""
    return next((row for row in sweep.children if best is not None and row.get("key") == best.key), None)


def _write_snippets(yaml_path: str, folder: str, params: Dict[str, str], answer: Optional[Dict[str, Any]],
                    record: Optional[Dict[str, Any]] = None) -> List[str]:
    """The answer as settings for the trainer a team uses (Lightning, Hugging Face, DeepSpeed, Ray
    Train, torchrun) with the recipe the point recorded, beside the sweeper's own override line; the branch
    strategy's schedule too."""
    with open(yaml_path) as f:
        pasteable = snippets.write_from_recommendation(f.read(), os.path.join(folder, "snippets"),
                                                       params.get("use_gpu") == "True", record)
    if answer is not None:
        pasteable += branched.snippets_for(answer, os.path.join(folder, "snippets"))
    return pasteable


def _write_yaml(folder: str, rec: Recommendation, cfg: ReportConfig, budget: Optional[float],
                projected: projection.Projection, line: Optional[str]) -> str:
    """recommendation.yaml: the recommendation, the projection's blocks and the elastic plan's predicted rows."""
    return _write_text(os.path.join(folder, "recommendation.yaml"), analysis.recommendation_yaml(
        rec, cfg.objective, cfg.min_accuracy, budget, cfg.max_accuracy_drop, cfg.max_loss_rise,
        projection_sections.yaml_blocks(projected, line), projected.elastic_predictor()))


def _run_words(projected: projection.Projection, line: Optional[str]
               ) -> Tuple[Optional[str], Optional[headline.RunWords]]:
    """With report.run_samples, the override line that trains the run (train.samples stretches the LR schedule
    over it, not the sweep's budget) and the headline's words of the run; else the sweep's line and None."""
    run_line = projection.run_override(line, projected)
    if projected.run is None or not line:
        return run_line, None
    return run_line, ((lambda detail: projection.run_words(projected, detail)), run_line)


def _log_critical_batch(store: tracking.Store, run_id: str, trials: List[Trial],
                        found: Optional[CriticalBatch], params: Dict[str, str]) -> None:
    """The sweep-level prediction on the parent run: critical_batch_* and gns_b_simple_mean metrics,
    the LR rule it holds under as tag sweeper.critical_batch_lr_rule, or why there is none as tag
    sweeper.critical_batch."""
    metrics = folding.critical_batch_metrics(found, folding.b_simple_mean(trials))
    tags = {"sweeper.critical_batch_lr_rule": sections.lr_rule(params)} if found else {
        "sweeper.critical_batch": folding.no_fit_reason(trials)}
    tracking.log_sweep_metrics(store, run_id, metrics, tags)


def _limit(value: Optional[float]) -> str:
    return "none" if value is None else f"{value:g}"


def _settings_shown(parent_run_id: str, cfg: ReportConfig, budget_gb: Optional[float], quality: str
                    ) -> Dict[str, str]:
    """What the page says it answered: the sweep's run and the settings the recommendation applied."""
    return {
        "MLflow run": parent_run_id,
        "objective": cfg.objective,
        "min accuracy": "none" if cfg.min_accuracy is None else f"{cfg.min_accuracy:g}",
        "quality": cfg.quality_metric or (cfg.quality if cfg.quality != "auto" else f"auto ({quality})"),
        "max accuracy drop" if quality == "val_accuracy" else "max loss rise": _limit(
            cfg.max_accuracy_drop if quality == "val_accuracy" else cfg.max_loss_rise),
        "memory budget": f"{budget_gb:g} GiB" if budget_gb else "none",
        "knee": f"first micro-batch after which doubling gains < {cfg.knee_min_gain:.0%}",
    }


def _write_text(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path
