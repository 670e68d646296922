"""The global-batch figures: validation quality (with its interval), time to target, and steps and
samples to target with the critical batch size's fit. One mark per point, seeds folded."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, PercentFormatter

from sweeper.report import folding
from sweeper.report.analysis import Trial, replicates, summarize
from sweeper.report.critical_batch import CriticalBatch
from sweeper.report.plots import canvas, marks
from sweeper.report.quality import ACCURACY, Quality


def accuracy_vs_global_batch(trials: Sequence[Trial], path: str | os.PathLike, lr_label: str,
                             level: float = 0.95, quality: Quality = ACCURACY) -> Optional[str]:
    """The validation quality (report.quality: accuracy, or a language model's loss) against the global
    batch: one marker per point (the mean over its seeds) with its confidence interval as an error bar
    (t over seeds, or the one seed's interval: the legend names which), nudged sideways per series so
    points with the same global batch stay visible side by side; a grey line through the mean per global
    batch; diverged points as red x at the bottom with their reason. `lr_label` (e.g. "LR scaling: sqrt
    (base 32)") titles the legend.

    Returns None and writes nothing when no ok trial measured the quality (e.g. synthetic data)."""
    groups = replicates(trials)
    folded = folding.fold(trials)
    ok = [t for t in folded if t.status == "ok" and quality.value(t) is not None]
    if not ok:
        return None
    fig, ax = canvas.figure()
    by_series = marks.by_series(ok)
    n = len(by_series)
    step = min(0.06, 0.3 / max(n - 1, 1))  # in octaves: visible, yet well inside one factor of 2
    kinds: Dict[str, None] = {}
    for i, (series, members) in enumerate(by_series.items()):
        shift = 2 ** ((i - (n - 1) / 2) * step)
        values = [quality.value(t) for t in members]
        intervals = [quality.interval(summarize(groups.get(t.key, [t]), level), level) for t in members]
        low = [0.0 if iv is None else max(0.0, v - iv.low) for v, iv in zip(values, intervals)]
        high = [0.0 if iv is None else max(0.0, iv.high - v) for v, iv in zip(values, intervals)]
        kinds.update(dict.fromkeys(_interval_kind(iv.how) for iv in intervals if iv is not None))
        ax.errorbar([t.global_batch_size * shift for t in members], values,
                    yerr=[low, high], linestyle="none", marker=marks.marker(i), markersize=7, color=marks.color(i),
                    alpha=0.9, capsize=3, elinewidth=1.1, label=marks.series_label(series), zorder=3)
    _mean_line(ax, ok, quality.value)
    extra = [Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=10,
                    label=f"error bar: {kind}") for kind in kinds]
    if quality.is_accuracy:
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=1))
    canvas.size_axis(ax, [t.global_batch_size for t in folded])
    extra += marks.mark_diverged(ax, trials)
    what = "accuracy" if quality.is_accuracy else f"loss ({quality.units}, lower is better)" if not quality.user \
        else f"{quality.metric} ({'higher' if quality.higher_is_better else 'lower'} is better)"
    canvas.titles(ax, f"Validation {what.split(' (')[0]} vs global batch size",
                   "global batch size (micro x accumulation x workers, log2)", f"validation {what} (mean over seeds)")
    canvas.legend(ax, extra, title=lr_label)
    return canvas.save(fig, path)


def _interval_kind(how: str) -> str:
    """An interval's kind for the legend, its sample count left out (it varies per point):
    "t interval over 3 seeds, 95 %" -> "95 % t interval over seeds"."""
    level = re.search(r"(\d+(?:\.\d+)? %)", how)
    prefix = f"{level.group(1)} " if level else ""
    if how.startswith("t interval"):
        return f"{prefix}t interval over seeds"
    if how.startswith("Wilson"):
        return f"{prefix}Wilson interval of the\n  validation set (one seed)"
    if how.startswith("mean +/- z"):
        return f"{prefix}normal interval of the\n  validation loss's SE (one seed)"
    return how


def _mean_line(ax: Axes, ok: Sequence[Trial], figure: Callable[[Trial], Optional[float]]) -> None:
    """A grey line through the mean of `figure` per global batch (two global batches or more)."""
    per_global: Dict[int, List[float]] = defaultdict(list)
    for t in ok:
        if figure(t) is not None:
            per_global[t.global_batch_size].append(figure(t))
    sizes = sorted(per_global)
    if len(sizes) >= 2:
        ax.plot(sizes, [float(np.mean(per_global[g])) for g in sizes], color="0.6", linewidth=1.2, zorder=2,
                label="mean per global batch")


def _spread_per_point(trials: Sequence[Trial], name: str):
    """The points' seed replicates by key, the points (seeds folded), and each point that recorded
    `name` with its spread over seeds."""
    groups = replicates(trials)
    folded = folding.fold(trials)
    shown = [(t, folding.spread(groups.get(t.key, [t]), name)) for t in folded]
    return groups, folded, [(t, spread) for t, spread in shown if spread is not None]


def time_to_target_vs_global_batch(trials: Sequence[Trial], path: str | os.PathLike) -> Optional[str]:
    """Seconds to the target accuracy (or loss) against the global batch: one marker per point, the
    mean over the seeds that reached it with their lowest-highest spread as an error bar, hollow when
    some seed missed the target; diverged points as red x at the bottom.

    Returns None and writes nothing when no point reached a target (no eval target, or none met)."""
    _, folded, shown = _spread_per_point(trials, "time_to_target_seconds")
    if not shown:
        return None
    fig, ax = canvas.figure()
    by_series = marks.by_series(t for t, _ in shown)
    spreads = {id(t): s for t, s in shown}
    for i, (series, members) in enumerate(by_series.items()):
        for t in members:
            mean, low, high = spreads[id(t)]
            every = t.reached_target is not False
            ax.errorbar([t.global_batch_size], [mean], yerr=[[mean - low], [high - mean]], linestyle="none",
                        marker=marks.marker(i), markersize=7, color=marks.color(i), capsize=3,
                        markerfacecolor=marks.color(i) if every else "none", zorder=3)
        ax.plot([], [], linestyle="none", marker=marks.marker(i), color=marks.color(i),
                label=marks.series_label(series))
    _mean_line(ax, [t for t, _ in shown], lambda t: t.time_to_target_seconds)
    extra = [Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=10,
                    label="error bar: lowest-highest over seeds"),
             Line2D([], [], color="0.3", marker="o", linestyle="none", markerfacecolor="none",
                    label="hollow: some seed missed the target\n  (mean of those that reached it)")]
    ax.set_ylim(0, max(s[2] for _, s in shown) * 1.15)
    canvas.size_axis(ax, [t.global_batch_size for t in folded])
    extra += marks.mark_diverged(ax, trials)
    canvas.titles(ax, "Time to target vs global batch size", "global batch size (log2)",
                   "time to target (s, mean over seeds)")
    canvas.legend(ax, extra)
    return canvas.save(fig, path)


def steps_to_target_vs_global_batch(
    trials: Sequence[Trial], path: str | os.PathLike, found: Optional[CriticalBatch], lr_label: str,
) -> Optional[str]:
    """Steps (left axis) and samples (right axis) to the target against the global batch, both log:
    one marker per point (mean over seeds, lowest-highest as error bars; hollow when it missed the
    target in some seed, so the fit left it out), the fit S = S_min (1 + B_crit / B) and
    E = S_min (B + B_crit) as lines, B_crit as a dashed line in its shaded bootstrap interval, and each
    point's measured B_simple as a triangle on the floor of the same axis (their mean dotted).

    Returns None and writes nothing when no point recorded its steps to a target."""
    groups, folded, shown = _spread_per_point(trials, "steps_to_target")
    if not shown:
        return None
    fig, ax = canvas.figure()
    right = ax.twinx()
    for axis in (ax, right):  # log, with plain numbers (not 6x10^2) on its ticks
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    batches = [t.global_batch_size for t in folded]
    fitted = set(folding.fitted_points(trials))  # the points the fit used: drawn full, the rest faded
    xs = _draw_steps_and_samples(ax, right, shown, groups, fitted if found else None)
    if found is not None:
        xs += _draw_critical_batch(ax, right, found, batches)
    b_simple = [b for t in folded if t.status == "ok" and (b := folding.b_simple(t)) is not None]
    if b_simple:
        ax.plot(b_simple, [0.03] * len(b_simple), transform=ax.get_xaxis_transform(), linestyle="none",
                marker="^", markersize=8, color="#ff7f0e", clip_on=False, zorder=5,
                label="B_simple of a point (gradient noise scale)")
        ax.axvline(float(np.mean(b_simple)), color="#ff7f0e", linestyle=":", linewidth=1.2,
                   label=f"mean B_simple {np.mean(b_simple):.0f}")
        xs += b_simple
    canvas.size_axis(ax, batches)
    lo, hi = ax.get_xlim()
    ax.set_xlim(min(lo, min(xs) / 1.4), max(hi, max(xs) * 1.4))
    extra = marks.mark_diverged(ax, trials)
    canvas.titles(ax, "Steps and samples to target vs global batch", "global batch size (log2)",
                   "optimizer steps to target (mean over seeds)")
    right.set_ylabel("samples to target (squares)")
    if found is not None and any(t.key not in fitted for t, _ in shown):
        why = "faded: left out of the fit (a better LR\n  multiplier at its batch, or a seed missed)"
        extra.append(Line2D([], [], linestyle="none", marker="o", color="#1f77b4", alpha=0.35, label=why))
    if any(t.reached_target is False for t, _ in shown):
        extra.append(Line2D([], [], linestyle="none", marker="o", color="#1f77b4", markerfacecolor="none",
                            label="hollow: some seed missed the target"))
    handles, labels = ax.get_legend_handles_labels()
    more, _ = right.get_legend_handles_labels()
    # A figure legend outside the axes: beside the axes it would cover the right axis' labels.
    fig.legend([*handles, *more, *extra], [h.get_label() for h in [*handles, *more, *extra]],
               loc="outside right upper", fontsize=7, frameon=False, title=canvas.plain(lr_label), title_fontsize=7,
               alignment="left")
    return canvas.save(fig, path)


def _draw_steps_and_samples(ax: Axes, right: Axes, shown, groups, fitted: Optional[set]) -> List[float]:
    """Each point's mean steps (circles, left) and samples (squares, right) to the target with their
    spread over seeds, faded when the fit (if any) left it out; returns the x values drawn."""
    for axis, name, marker, color, label in ((ax, "steps_to_target", "o", "#1f77b4", "steps to target"),
                                             (right, "samples_to_target", "s", "#2ca02c", "samples to target")):
        for i, (t, steps) in enumerate(shown):
            figure = steps if name == "steps_to_target" else folding.spread(groups.get(t.key, [t]), name)
            if figure is None:
                continue
            mean, low, high = figure
            every = t.reached_target is not False
            axis.errorbar([t.global_batch_size], [mean], yerr=[[mean - low], [high - mean]], linestyle="none",
                          marker=marker, markersize=6, color=color, capsize=3, zorder=3,
                          alpha=1.0 if fitted is None or t.key in fitted else 0.35,
                          markerfacecolor=color if every else "none", label=label if i == 0 else None)
    return [float(t.global_batch_size) for t, _ in shown]


def _draw_critical_batch(ax: Axes, right: Axes, found: CriticalBatch, batches: Sequence[int]) -> List[float]:
    """The fit's steps and samples curves over the swept range, B_crit and its interval; returns the
    x values drawn."""
    # Over the whole x range the plot shows: the swept batches and B_crit's interval.
    edges = [*batches, found.critical_batch_size, *(b for b in (found.low, found.high) if b is not None)]
    span = np.geomspace(min(edges) / 1.4, max(edges) * 1.4, 80)
    ax.plot(span, found.s_min * (1 + found.critical_batch_size / span), color="#1f77b4", linewidth=1.3,
            label=f"fit: S = {found.s_min:.0f} (1 + {found.critical_batch_size:.0f} / B), "
                  f"R\u00b2 {found.r_squared:.2f}")
    right.plot(span, found.s_min * (span + found.critical_batch_size), color="#2ca02c", linewidth=1.1,
               linestyle="--", label="fit: E = S_min (B + B_crit)")
    ax.axvline(found.critical_batch_size, color="0.2", linestyle="--", linewidth=1.2,
               label=f"B_crit {found.critical_batch_size:.0f}")
    xs = [found.critical_batch_size]
    if found.low is not None and found.high is not None:
        ax.axvspan(found.low, found.high, color="0.5", alpha=0.15, linewidth=0,
                   label=f"B_crit 95 % interval {found.low:.0f}-{found.high:.0f}")
        xs += [found.low, found.high]
    return xs
