"""The report's figures as PNG files, by name: throughput and memory against the micro-batch, accuracy,
time and steps to target against the global batch, the throughput/memory Pareto front, and each
parallelism's own when a sweep measured several. What each plot shows is sweeper/report/plots/'s."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from sweeper.config import ReportConfig
from sweeper.report import analysis, folding, plots
from sweeper.report.analysis import Recommendation, Trial
from sweeper.report.critical_batch import CriticalBatch
from sweeper.report.plots import by_parallelism
from sweeper.report.quality import judged_by


def draw(
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
    per layout on the throughput and memory views (LR multipliers folded too); with several parallelisms
    measured, their own figures after these (plots/by_parallelism.py)."""
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
            trials, p, lr_label, cfg.confidence, judged_by(rec))),
        ("time_to_target_vs_global_batch", lambda p: plots.time_to_target_vs_global_batch(trials, p)),
        ("steps_to_target_vs_global_batch", lambda p: plots.steps_to_target_vs_global_batch(
            trials, p, found, lr_label)),
        ("pareto_throughput_memory", lambda p: plots.pareto_throughput_memory(
            rated, analysis.pareto(rated), p, rec.best, unit)),
    ):
        written = draw(os.path.join(folder, f"{name}.png"))
        if written:
            images[name] = written
    images.update(by_parallelism.draw(folder, trials, budget))  # only when it measured several parallelisms
    return images


def knees_per_recipe(layouts: List[Trial], min_gain: float) -> Dict[Tuple[int, int, str], Optional[int]]:
    """analysis.knees within each recipe and context (a series holds one recipe's sizes at one context),
    keyed as the plots' series: (accumulation, workers, the series' label beyond fp32, else "")."""
    out: Dict[Tuple[int, int, str], Optional[int]] = {}
    for label in sorted({plots.series_of(t)[2] for t in layouts}):
        own = [t for t in layouts if plots.series_of(t)[2] == label]
        out.update({(a, w, label): knee for (a, w), knee in analysis.knees(own, min_gain).items()})
    return out
