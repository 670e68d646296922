"""The sweep's figures as PNG files, one mark per point (seeds folded): throughput and memory against
the micro-batch (also per recipe), accuracy, time and steps to target against the global batch (with
the critical batch size), and the throughput/memory Pareto front. matplotlib's object API only."""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

# Figure + the Agg canvas, never pyplot: pyplot keeps global state (a current figure, a backend chosen
# at first import) that a Ray driver, a worker or a test process may not want changed under it.
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter
from matplotlib.transforms import Bbox

from sweeper.report import points as folding
from sweeper.report.analysis import Trial, replicates, summarize
from sweeper.report.quality import ACCURACY, Quality
from sweeper.report.critical_batch import CriticalBatch
from sweeper.units import KiB, MiB, format_bytes

# Every function writes a FIGSIZE x DPI picture (840 x 540 pixels), whatever it contains.
FIGSIZE = (7.0, 4.5)
DPI = 120

OOM_COLOR = "#d62728"
RECOMMENDED_COLOR = "#f2b701"  # a gold star: the trial the report recommends
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

# (accumulation_steps, num_workers, what else sets the series apart: its recipe beyond fp32, its LR
# multiplier beyond 1; "" for neither)
Series = Tuple[int, int, str]
DIVERGED_NOTE = "diverged / oom / failed (red x)"


def throughput_vs_micro_batch(
    trials: Sequence[Trial],
    knees: Mapping[Series, Optional[int]],
    path: str | os.PathLike,
    min_gain: Optional[float] = None,
    unit: str = "samples/s",
) -> str:
    """samples/s (`unit`: tokens/s for a language model, whose trials carry it as samples_per_second) against
    the micro-batch, one line per (accumulation, workers), +- cv x value as error
    bars, each series' knee ringed; trials that ran out of memory or failed as red x on the floor.
    `min_gain`, the knee rule's threshold, is named in the legend (and when no series has a knee yet).

    Seed replicates and LR multipliers of a layout are one mark (their mean throughput); a recipe other
    than fp32 is its own series. With no ok trial that has a throughput, the PNG says so (the path is
    still returned)."""
    trials = folding.fold_layouts(trials)
    ok = [t for t in trials if t.status == "ok" and t.samples_per_second is not None]
    if not ok:
        return _placeholder(path, "Throughput vs micro-batch size", trials, "no ok points with a throughput")
    fig, ax = _figure()
    by_series = _by_series(trials)
    lines = _lines(by_series, ok)
    top, knee_marks = _draw_throughput(ax, lines, knees)
    ax.set_ylim(0, top * 1.15)
    _ring_knees(ax, knee_marks, top)
    extra = _knee_key(knee_marks, lines, min_gain)
    extra.append(Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=10,
                        label="error bar: \u00b1 cv of the windows behind the figure"))
    if _mark_not_ok_on_floor(ax, trials, by_series):
        extra.append(Line2D([], [], linestyle="none", marker="x", color=OOM_COLOR, markersize=8,
                            markeredgewidth=2, label="oom / diverged / failed"))
    _size_axis(ax, [t.micro_batch_size for t in trials])
    _titles(ax, "Throughput vs micro-batch size", "micro-batch size (samples per worker per step, log2)",
            f"throughput ({unit})")
    _legend(ax, extra)
    return _save(fig, path)


def memory_vs_micro_batch(
    trials: Sequence[Trial],
    path: str | os.PathLike,
    budget_bytes: Optional[float] = None,
    fit: Optional[Tuple[float, float]] = None,
) -> str:
    """Peak memory (MiB, the largest worker's) against the micro-batch, one series per
    (accumulation, workers). `fit` = (fixed_bytes, per_sample_bytes) is drawn as one dashed line;
    without it, every series with two or more micro-batch sizes gets its own least-squares line.
    `budget_bytes` is a red horizontal line; oom trials are red x on it (or at the top without one).
    Failed trials are left out: their failure says nothing about memory.

    Seed replicates and LR multipliers of a layout are one mark (their mean peak). With no ok trial
    that has a peak memory, the PNG says so (the path is still returned)."""
    trials = folding.fold_layouts(trials)
    ok = [t for t in trials if t.status == "ok" and t.peak_memory_bytes is not None]
    if not ok:
        return _placeholder(path, "Peak memory vs micro-batch size", trials, "no ok points with a peak memory")
    fig, ax = _figure()
    micro = [t.micro_batch_size for t in trials]
    top = _draw_memory(ax, _lines(_by_series(trials), ok), fit, max(t.peak_memory_bytes for t in ok))
    if fit is not None:
        fixed, per_sample = fit
        label = f"fit: {_mib(fixed)} fixed\n  + {_kib(per_sample)}/sample x micro"
        top = max(top, _draw_fit(ax, fixed, per_sample, micro, color="0.25", linewidth=1.2, label=label))
    if budget_bytes is not None:
        ax.axhline(budget_bytes / MiB, color=OOM_COLOR, linewidth=1.2, label=f"budget ({budget_bytes / MiB:.0f} MiB)")
        top = max(top, budget_bytes)
    ax.set_ylim(0, top / MiB * 1.12)
    _mark_oom(ax, trials, budget_bytes)
    # Linear: memory grows linearly with the micro-batch (seeds 001/004), so the fit is a straight
    # line meeting the axis at the fixed memory; on a log axis it would bend like super-linear growth.
    _size_axis(ax, micro, log=False)
    extra = _mark_diverged(ax, trials, x_of=lambda t: t.micro_batch_size)
    _titles(ax, "Peak memory vs micro-batch size", "micro-batch size (samples per worker per step)",
            "peak memory, largest worker (MiB)")
    _legend(ax, extra)
    return _save(fig, path)


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
    fig, ax = _figure()
    by_series = _by_series(ok)
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
                    yerr=[low, high], linestyle="none", marker=_marker(i), markersize=7, color=_color(i),
                    alpha=0.9, capsize=3, elinewidth=1.1, label=_series_label(series), zorder=3)
    _mean_line(ax, ok, quality.metric)
    extra = [Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=10,
                    label=f"error bar: {kind}") for kind in kinds]
    if quality.is_accuracy:
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=1))
    _size_axis(ax, [t.global_batch_size for t in folded])
    extra += _mark_diverged(ax, trials)
    what = "accuracy" if quality.is_accuracy else f"loss ({quality.units}, lower is better)"
    _titles(ax, f"Validation {what.split(' (')[0]} vs global batch size",
            "global batch size (micro x accumulation x workers, log2)", f"validation {what} (mean over seeds)")
    _legend(ax, extra, title=lr_label)
    return _save(fig, path)


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


def _mean_line(ax: Axes, ok: Sequence[Trial], name: str) -> None:
    """A grey line through the mean of figure `name` per global batch (two global batches or more)."""
    per_global: Dict[int, List[float]] = defaultdict(list)
    for t in ok:
        if getattr(t, name) is not None:
            per_global[t.global_batch_size].append(getattr(t, name))
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


def _mark_diverged(ax: Axes, trials: Sequence[Trial], x_of=lambda t: t.global_batch_size) -> List[Line2D]:
    """A red x near the bottom at the x (the global batch, by default) of each point with a diverged
    replicate, with the reason, the step when one, and how many of its seeds diverged when not all;
    returns the legend's entry (none when nothing diverged). Call it once the x limits are set."""
    diverged: Dict[float, List[str]] = defaultdict(list)
    for members in replicates(trials).values():
        bad = [t for t in members if t.status == "diverged"]
        if not bad:
            continue
        steps = sorted({t.diverged_at_step for t in bad if t.diverged_at_step is not None})
        text = _not_ok_text(bad) + (f" @{steps[0]}" if len(steps) == 1 else "")
        some = "" if len(bad) == len(members) else f" ({len(bad)}/{len(members)} seeds)"
        diverged[x_of(bad[0])].append(text + some)
    if not diverged:
        return []
    floor = ax.get_xaxis_transform()
    for i, (x, texts) in enumerate(sorted(diverged.items())):
        ax.plot([x], [0.035], transform=floor, linestyle="none", marker="x", color=OOM_COLOR, markersize=9,
                markeredgewidth=2, zorder=5, clip_on=False)
        shown = sorted(set(texts))
        text = "\n".join(shown[:2]) + (f"\n+{len(shown) - 2} more" if len(shown) > 2 else "")
        # Centred over its x, but kept inside the axes near either edge (the y labels, the legend).
        where = ax.transAxes.inverted().transform(floor.transform((x, 0.0)))[0]
        ha = "left" if where < 0.15 else "right" if where > 0.85 else "center"
        # Neighbours alternate between two heights, so labels of adjacent batch sizes do not overlap.
        ax.text(x, 0.075 + 0.07 * (i % 2), _plain(text), transform=floor, ha=ha, va="bottom", fontsize=7,
                color=OOM_COLOR)
    return [Line2D([], [], linestyle="none", marker="x", color=OOM_COLOR, markersize=8, markeredgewidth=2,
                   label="diverged (reason @step; left out)")]


def pareto_throughput_memory(
    trials: Sequence[Trial],
    front: Sequence[Trial],
    path: str | os.PathLike,
    recommended: Optional[Trial] = None,
    unit: str = "samples/s",
) -> str:
    """Every ok trial as samples/s (`unit`: tokens/s for a language model, carried as samples_per_second)
    against peak memory; the Pareto front (no other trial is both faster
    and lighter) connected, highlighted and labelled with trial keys (only the front, to stay legible).
    The `recommended` trial is starred and labelled too: off the front when a constraint (accuracy,
    memory budget) ruled out the trials that beat it here (a seed replicate is matched to its layout).
    Diverged layouts with both figures are red x. Pass one trial per layout (points.fold_layouts).

    With no ok trial that has both figures, the PNG says so (the path is still returned)."""
    ok = [t for t in trials if t.status == "ok" and t.samples_per_second is not None
          and t.peak_memory_bytes is not None]
    if not ok:
        return _placeholder(path, "Throughput vs peak memory", trials, "no ok points with throughput and memory")
    fig, ax = _figure()
    ax.scatter([t.peak_memory_bytes / MiB for t in ok], [t.samples_per_second for t in ok], s=28, color="0.6",
               label="point", zorder=2)
    on_front = sorted((t for t in front if t.samples_per_second is not None and t.peak_memory_bytes is not None),
                      key=lambda t: t.peak_memory_bytes)
    if on_front:
        fx = [t.peak_memory_bytes / MiB for t in on_front]
        fy = [t.samples_per_second for t in on_front]
        ax.plot(fx, fy, color="#1f77b4", linewidth=1.8, marker="o", markersize=7, label="Pareto front", zorder=3)
    xs = [t.peak_memory_bytes / MiB for t in ok]
    ys = [t.samples_per_second for t in ok]
    _pad_limits(ax, xs, ys)
    _titles(ax, "Throughput vs peak memory (Pareto front)", "peak memory, largest worker (MiB)",
            f"throughput ({unit})")
    labelled = list(on_front)
    diverged = [t for t in trials if t.status == "diverged" and t.samples_per_second is not None
                and t.peak_memory_bytes is not None]
    if diverged:  # fast or light, but not a way to train: shown so the front's gaps are explained
        ax.plot([t.peak_memory_bytes / MiB for t in diverged], [t.samples_per_second for t in diverged],
                linestyle="none", marker="x", color=OOM_COLOR, markersize=8, markeredgewidth=2, zorder=3,
                label="diverged (left out)")
    # A recommendation may be one seed replicate of a point shown here folded: match its layout.
    if recommended is not None:
        recommended = next((t for t in ok if folding.layout_key(t) == folding.layout_key(recommended)), None)
    if recommended is not None:
        ax.plot([recommended.peak_memory_bytes / MiB], [recommended.samples_per_second], linestyle="none",
                marker="*", markersize=17, color=RECOMMENDED_COLOR, markeredgecolor="0.2", markeredgewidth=0.8,
                label=f"recommended: {recommended.key}", zorder=4)
        if recommended not in labelled:
            labelled.append(recommended)
    _legend(ax)
    _label_points(fig, ax, [(t.peak_memory_bytes / MiB, t.samples_per_second, t.key) for t in labelled])
    return _save(fig, path)


def time_to_target_vs_global_batch(trials: Sequence[Trial], path: str | os.PathLike) -> Optional[str]:
    """Seconds to the target accuracy (or loss) against the global batch: one marker per point, the
    mean over the seeds that reached it with their lowest-highest spread as an error bar, hollow when
    some seed missed the target; diverged points as red x at the bottom.

    Returns None and writes nothing when no point reached a target (no eval target, or none met)."""
    _, folded, shown = _spread_per_point(trials, "time_to_target_seconds")
    if not shown:
        return None
    fig, ax = _figure()
    by_series = _by_series(t for t, _ in shown)
    spreads = {id(t): s for t, s in shown}
    for i, (series, members) in enumerate(by_series.items()):
        for t in members:
            mean, low, high = spreads[id(t)]
            every = t.reached_target is not False
            ax.errorbar([t.global_batch_size], [mean], yerr=[[mean - low], [high - mean]], linestyle="none",
                        marker=_marker(i), markersize=7, color=_color(i), capsize=3,
                        markerfacecolor=_color(i) if every else "none", zorder=3)
        ax.plot([], [], linestyle="none", marker=_marker(i), color=_color(i), label=_series_label(series))
    _mean_line(ax, [t for t, _ in shown], "time_to_target_seconds")
    extra = [Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=10,
                    label="error bar: lowest-highest over seeds"),
             Line2D([], [], color="0.3", marker="o", linestyle="none", markerfacecolor="none",
                    label="hollow: some seed missed the target\n  (mean of those that reached it)")]
    ax.set_ylim(0, max(s[2] for _, s in shown) * 1.15)
    _size_axis(ax, [t.global_batch_size for t in folded])
    extra += _mark_diverged(ax, trials)
    _titles(ax, "Time to target vs global batch size", "global batch size (log2)",
            "time to target (s, mean over seeds)")
    _legend(ax, extra)
    return _save(fig, path)


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
    fig, ax = _figure()
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
    _size_axis(ax, batches)
    lo, hi = ax.get_xlim()
    ax.set_xlim(min(lo, min(xs) / 1.4), max(hi, max(xs) * 1.4))
    extra = _mark_diverged(ax, trials)
    _titles(ax, "Steps and samples to target vs global batch", "global batch size (log2)",
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
               loc="outside right upper", fontsize=7, frameon=False, title=_plain(lr_label), title_fontsize=7,
               alignment="left")
    return _save(fig, path)


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


def memory_by_recipe(trials: Sequence[Trial], path: str | os.PathLike, budget_bytes: Optional[float] = None
                     ) -> Optional[str]:
    """Peak memory against the micro-batch, one line per recipe (precision x activation
    checkpointing) with its least-squares line and per-sample slope, over the layouts with the fewest
    workers and accumulation steps each recipe ran (peak memory is per worker); the largest micro-batch
    measured ok per recipe is ringed. Oom sizes are red x on the budget (or the top).

    Returns None and writes nothing with fewer than two recipes measured."""
    folded = folding.fold_layouts(trials)
    by_recipe: Dict[Tuple[str, str], List[Trial]] = defaultdict(list)
    for t in folded:
        by_recipe[folding.recipe(t)].append(t)
    measured = {r: ts for r, ts in by_recipe.items()
                if any(t.status == "ok" and t.peak_memory_bytes is not None for t in ts)}
    if len(measured) < 2:
        return None
    fig, ax = _figure()
    top = 0.0
    for i, (r, members) in enumerate(sorted(measured.items(), key=lambda kv: folding.recipe_order(kv[0]))):
        base = min((t.num_workers, t.accumulation_steps) for t in members)
        line = sorted((t for t in members if (t.num_workers, t.accumulation_steps) == base),
                      key=lambda t: t.micro_batch_size)
        top = max(top, _draw_recipe_line(ax, i, r, base, line))
    if budget_bytes is not None:
        ax.axhline(budget_bytes / MiB, color=OOM_COLOR, linewidth=1.2, label=f"budget ({budget_bytes / MiB:.0f} MiB)")
        top = max(top, budget_bytes)
    ax.set_ylim(0, top / MiB * 1.12)
    _mark_oom(ax, folded, budget_bytes)
    _size_axis(ax, [t.micro_batch_size for t in folded], log=False)
    _titles(ax, "Peak memory vs micro-batch size, per recipe", "micro-batch size (samples per worker per step)",
            "peak memory, largest worker (MiB)")
    _legend(ax, [Line2D([], [], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                        markeredgecolor="0.3", label="largest micro-batch measured ok")])
    return _save(fig, path)


def _draw_recipe_line(ax: Axes, i: int, r: Tuple[str, str], base: Tuple[int, int], line: Sequence[Trial]) -> float:
    """One recipe's ok points, its fitted line and its largest ok micro-batch ringed; returns the
    highest point drawn, in bytes."""
    ok = [t for t in line if t.status == "ok" and t.peak_memory_bytes is not None]
    if not ok:
        return 0.0
    color = _color(i)
    x = np.array([t.micro_batch_size for t in ok], dtype=float)
    y = np.array([t.peak_memory_bytes for t in ok], dtype=float)
    label = f"{folding.recipe_label(r)} (workers {base[0]}, accum {base[1]})"
    top = float(y.max())
    if len(set(x)) >= 2:
        slope, intercept = np.polyfit(x, y, 1)
        # Over the oom sizes too: the line shows what they would have needed.
        top = max(top, _draw_fit(ax, intercept, slope, [t.micro_batch_size for t in line
                                                         if t.status in ("ok", "oom")], color=color,
                                 linewidth=1, alpha=0.8))
        label += f"\n  {_mib(intercept)} + {_kib(slope)}/sample"
    ax.plot(x, y / MiB, color=color, linestyle="none", marker=_marker(i), markersize=6, label=label)
    ax.scatter([x[-1]], [y[-1] / MiB], s=200, facecolors="none", edgecolors=color, linewidths=1.6, zorder=4)
    return top


# -- the micro-batch plots' pieces ---------------------------------------------------------------


class _Line(NamedTuple):
    """One (accumulation, workers) series as drawn: its place among all series (its colour and
    marker), all its trials, and its ok ones by micro-batch size."""

    index: int
    series: Series
    members: List[Trial]
    points: List[Trial]


def _lines(by_series: Dict[Series, List[Trial]], ok: Sequence[Trial]) -> List[_Line]:
    """The series with an ok trial among `ok`. A series keeps its place among all of them, so its
    colour and marker do not depend on which other series ran."""
    ok_ids = {id(t) for t in ok}
    lines = []
    for i, (series, members) in enumerate(by_series.items()):
        points = sorted((t for t in members if id(t) in ok_ids), key=lambda t: t.micro_batch_size)
        if points:
            lines.append(_Line(i, series, members, points))
    return lines


def _draw_throughput(
    ax: Axes, lines: Sequence[_Line], knees: Mapping[Series, Optional[int]]
) -> Tuple[float, List[Tuple[int, float, str]]]:
    """Each series' samples/s with +- cv x value error bars. Returns the top of the highest bar (1.0
    with none) and, for each series whose knee it measured, where to ring the knee and in which colour."""
    top = 0.0
    knee_marks: List[Tuple[int, float, str]] = []
    for line in lines:
        color = _color(line.index)
        x = [t.micro_batch_size for t in line.points]
        y = [t.samples_per_second for t in line.points]
        err = [(t.samples_per_second_cv or 0.0) * t.samples_per_second for t in line.points]
        ax.errorbar(x, y, yerr=err, color=color, marker=_marker(line.index), markersize=5,
                    capsize=3, linewidth=1.5, label=_series_label(line.series))
        top = max(top, max(a + b for a, b in zip(y, err)))
        # Knees of the default recipe may be keyed by (accumulation, workers) alone (analysis.knees).
        knee = knees.get(line.series, None if line.series[2] else knees.get(line.series[:2]))
        knee_trial = next((t for t in line.points if t.micro_batch_size == knee), None)
        if knee_trial is not None:
            knee_marks.append((knee_trial.micro_batch_size, knee_trial.samples_per_second, color))
    return top or 1.0, knee_marks


def _ring_knees(ax: Axes, knee_marks: Sequence[Tuple[int, float, str]], top: float) -> None:
    """A ring round each knee, and the word "knee" above it."""
    annotated: List[Tuple[int, float]] = []
    for x0, y0, color in knee_marks:
        ax.scatter([x0], [y0], s=230, facecolors="none", edgecolors=color, linewidths=1.8, zorder=4)
        # One "knee" word per spot: series that bend at the same place would stack identical labels.
        if any(x0 == xa and abs(y0 - ya) < 0.06 * top for xa, ya in annotated):
            continue
        annotated.append((x0, y0))
        ax.annotate("knee", (x0, y0), xytext=(0, 11), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8, color=color, fontweight="bold")


def _knee_key(
    knee_marks: Sequence[Tuple[int, float, str]], lines: Sequence[_Line], min_gain: Optional[float]
) -> List[Line2D]:
    """The legend's entry on knees: the ring and the rule behind it; or, where no series has a knee
    though one measured a doubling, that none has bent yet; else nothing (no doubling was measured)."""
    if knee_marks:
        rule = "" if min_gain is None else f": next doubling gains < {min_gain:.0%}"
        return [Line2D([], [], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                       markeredgecolor="0.3", markeredgewidth=1.8, label=f"knee{rule}")]
    if any(len({t.micro_batch_size for t in line.points}) > 1 for line in lines):
        # Every doubling measured still paid: say so, rather than leave the reader looking for a ring.
        gained = "" if min_gain is None else f": every doubling gained >= {min_gain:.0%}"
        return [Line2D([], [], linestyle="none", label=f"no knee yet{gained};\n  try larger micro-batches")]
    return []


def _draw_memory(ax: Axes, lines: Sequence[_Line], fit: Optional[Tuple[float, float]], top: float) -> float:
    """Each series' peak memory as hollow markers; without a given `fit`, each series with two sizes or
    more also gets its own least-squares line, its equation in the legend. Returns `top` raised to the
    highest point of those lines."""
    for line in lines:
        color = _color(line.index)
        x = np.array([t.micro_batch_size for t in line.points], dtype=float)
        y = np.array([t.peak_memory_bytes for t in line.points], dtype=float)
        label = _series_label(line.series)
        if fit is None and len(set(x)) >= 2:
            slope, intercept = np.polyfit(x, y, 1)
            # Drawn over the series' whole range, oom sizes included: it shows what they would have needed.
            highest = _draw_fit(ax, intercept, slope, [t.micro_batch_size for t in line.members], color=color,
                                linewidth=1, alpha=0.8)
            top = max(top, highest)
            label += f"\n  fit {_mib(intercept)} + {_kib(slope)}/sample"
        ax.plot(x, y / MiB, color=color, linestyle="none", marker=_marker(line.index), markersize=6,
                markerfacecolor="none", markeredgewidth=1.5, label=label)
    return top


def _draw_fit(ax: Axes, fixed: float, per_sample: float, micro_sizes: Iterable[int], **style) -> float:
    """The memory line fixed + per_sample x micro-batch, dashed over _fit_span(micro_sizes); returns
    its highest point in bytes."""
    span = _fit_span(micro_sizes)
    line = fixed + per_sample * span
    ax.plot(span, line / MiB, linestyle="--", **style)
    return float(line.max())


def _mark_oom(ax: Axes, trials: Sequence[Trial], budget_bytes: Optional[float]) -> None:
    """A red x at each micro-batch size that ran out of memory: on the budget line, or near the top of
    the axes without one."""
    oom_micro = sorted({t.micro_batch_size for t in trials if t.status == "oom"})
    if not oom_micro:
        return
    if budget_bytes is not None:
        y, where = budget_bytes / MiB, {}
    else:
        y, where = 0.96, {"transform": ax.get_xaxis_transform()}  # a fraction of the axes' height
    ax.plot(oom_micro, [y] * len(oom_micro), linestyle="none", marker="x", color=OOM_COLOR, markersize=9,
            markeredgewidth=2, label="oom", zorder=5, **where)


def _fit_span(micro_sizes: Iterable[int]) -> np.ndarray:
    """Where a fitted memory line is drawn: from 0, where it meets the fixed memory, to the largest size."""
    return np.array([0.0, float(max(micro_sizes))])


def _mark_not_ok_on_floor(ax: Axes, trials: Sequence[Trial], by_series: Dict[Series, List[Trial]]) -> bool:
    """A red x near the bottom at each micro-batch size where some series has no throughput, labelled
    with what happened, and with which series when others did run at that size."""
    not_ok: Dict[int, List[Trial]] = defaultdict(list)
    for t in trials:
        if t.status != "ok":
            not_ok[t.micro_batch_size].append(t)
    if not not_ok:
        return False
    floor = ax.get_xaxis_transform()  # x in data units, y as a fraction of the axes' height
    for micro, failed in sorted(not_ok.items()):
        ax.plot([micro], [0.035], transform=floor, linestyle="none", marker="x", color=OOM_COLOR, markersize=9,
                markeredgewidth=2, zorder=5, clip_on=False)
        text = _not_ok_text(failed)
        everyone = {s for s, members in by_series.items() if any(t.micro_batch_size == micro for t in members)}
        who = sorted({series_of(t) for t in failed})
        if set(who) != everyone:  # only some series failed here: say which, or how many
            names = [_series_label(s) for s in who] if len(who) <= 2 else [f"{len(who)} of {len(everyone)} series"]
            text += "\n" + "\n".join(names)
        ax.text(micro, 0.075, _plain(text), transform=floor, ha="center", va="bottom", fontsize=7,
                color=OOM_COLOR)
    return True


# -- helpers -------------------------------------------------------------------------------------


def _figure() -> Tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, which="major", color="0.9", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _save(fig: Figure, path: str | os.PathLike) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    # No bbox_inches="tight": it would change the pixel size from picture to picture.
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _placeholder(path: str | os.PathLike, title: str, trials: Sequence[Trial], message: str) -> str:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    counts: Dict[str, int] = defaultdict(int)
    for t in trials:
        counts[t.status] += 1
    detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no points"
    fig.text(0.5, 0.62, title, ha="center", va="center", fontsize=13)
    fig.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="0.3")
    fig.text(0.5, 0.41, f"({_plain(detail)})", ha="center", va="center", fontsize=10, color="0.45")
    return _save(fig, path)


def _by_series(trials: Iterable[Trial]) -> Dict[Series, List[Trial]]:
    groups: Dict[Series, List[Trial]] = defaultdict(list)
    for t in trials:
        groups[series_of(t)].append(t)
    return dict(sorted(groups.items()))


def series_of(t: Trial) -> Series:
    """A trial's series: its accumulation and workers, and its recipe and LR multiplier when they are
    not the defaults (a layout-folded trial carries no multiplier)."""
    extra = []
    if folding.recipe(t) != folding.DEFAULT_RECIPE:
        extra.append(folding.recipe_label(folding.recipe(t)))
    if t.lr_multiplier is not None and t.lr_multiplier != 1.0:
        extra.append(f"LR x{t.lr_multiplier:g}")
    if t.context is not None and "-ctx" in t.point:  # a point of sweep.context_lengths
        extra.append(f"context {t.context}")
    return t.accumulation_steps, t.num_workers, ", ".join(extra)


def _series_label(series: Series) -> str:
    return f"accum {series[0]}, workers {series[1]}" + (f", {series[2]}" if series[2] else "")


def _not_ok_text(failed: Sequence[Trial]) -> str:
    """What happened, e.g. "oom / diverged (nonfinite)": a diverged point's reason with its status."""
    def one(t: Trial) -> str:
        return f"diverged ({t.diverged_reason})" if t.status == "diverged" and t.diverged_reason else t.status

    return " / ".join(sorted({one(t) for t in failed}))


def _color(i: int) -> str:
    return f"C{i % 10}"


def _marker(i: int) -> str:
    return _MARKERS[i % len(_MARKERS)]


def _plain(text: str) -> str:
    # A pair of "$" in a trial key or label would otherwise be typeset as mathtext.
    return str(text).replace("$", r"\$")


def _mib(n: float) -> str:
    return format_bytes(n, 0 if abs(n) >= 10 * MiB else 1, unit="MiB")


def _kib(n: float) -> str:
    # Two decimals under 1 KiB, so a small per-sample slope never reads as 0.0.
    return format_bytes(n, 0 if abs(n) >= 10 * KiB else 1 if abs(n) >= KiB else 2, unit="KiB")


# Where a point's label may go, in pixels from the point, best first: beside it, then above/below,
# then further out.
_LABEL_SPOTS = (
    (7, 3, "left", "bottom"), (7, -3, "left", "top"), (-7, 3, "right", "bottom"), (-7, -3, "right", "top"),
    (0, 8, "center", "bottom"), (0, -8, "center", "top"),
    (12, 13, "left", "bottom"), (12, -13, "left", "top"), (-12, 13, "right", "bottom"), (-12, -13, "right", "top"),
)
_LABEL_BOX = {"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.75}


def _label_points(fig: Figure, ax: Axes, points: Sequence[Tuple[float, float, str]]) -> None:
    """Label points, highest first, each at the first spot where its text stays inside the axes and
    clear of the points and of labels already placed; a point with no such spot stays unlabelled
    (the report's table names every trial)."""
    if not points:
        return
    fig.draw_without_rendering()  # constrained layout places the axes: pixel positions are final after it
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    pixels = [ax.transData.transform((x, y)) for x, y, _ in points]
    taken = [Bbox.from_bounds(px - 5, py - 5, 10, 10) for px, py in pixels]
    for x, y, text in sorted(points, key=lambda p: -p[1]):
        for dx, dy, ha, va in _LABEL_SPOTS:
            label = ax.annotate(_plain(text), (x, y), xytext=(dx, dy), textcoords="offset pixels", ha=ha, va=va,
                                fontsize=7, color="#1f4e79", zorder=4, bbox=_LABEL_BOX)
            box = label.get_window_extent(renderer)
            fits = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if fits and not any(box.overlaps(other) for other in taken):
                taken.append(box.padded(1))
                break
            label.remove()


def _size_axis(ax: Axes, sizes: Iterable[Optional[int]], log: bool = True) -> None:
    """Log2 x axis (or, with `log=False`, a linear one from 0) whose ticks are the sizes actually
    swept, labelled with their values; labels that would touch a neighbour are left off (the tick stays)."""
    ticks = sorted({int(s) for s in sizes if s is not None and s > 0})
    if not ticks:
        return
    if log:
        ax.set_xscale("log", base=2)
        lo, hi = ticks[0] / 2**0.45, ticks[-1] * 2**0.45
    else:
        lo, hi = 0.0, ticks[-1] * 1.08
    ax.set_xlim(lo, hi)

    def position(s: int) -> float:  # 0..1 across the axes
        return math.log2(s / lo) / math.log2(hi / lo) if log else (s - lo) / (hi - lo)

    labels, last = [], None
    for s in ticks:
        where = position(s)
        # About 1.3 % of the axes' width per character at this figure size and font.
        if last is not None and where - last[0] < 0.013 * (len(str(s)) + len(last[1])) / 2 + 0.015:
            labels.append("")
            continue
        labels.append(str(s))
        last = (where, str(s))
    ax.set_xticks(ticks, labels=labels)
    ax.xaxis.set_minor_locator(NullLocator())


def _pad_limits(ax: Axes, xs: Sequence[float], ys: Sequence[float]) -> None:
    def around(lo: float, hi: float, pad: float) -> Tuple[float, float]:
        if hi <= lo:  # one point, or all equal: a window around it
            half = abs(lo) * 0.1 or 1.0
            return lo - half, hi + half
        return lo - pad * (hi - lo), hi + pad * (hi - lo)

    ax.set_xlim(*around(min(xs), max(xs), 0.12))
    ylo, yhi = around(min(ys), max(ys), 0.12)
    ax.set_ylim(max(0.0, ylo) if min(ys) >= 0 else ylo, yhi)


def _titles(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _legend(ax: Axes, extra: Sequence[Line2D] = (), title: Optional[str] = None) -> None:
    handles, labels = ax.get_legend_handles_labels()
    handles += list(extra)
    labels += [h.get_label() for h in extra]
    if not handles:
        return
    # Beside the axes, never over the data; constrained layout shrinks the axes to make room.
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8,
              frameon=False, title=_plain(title) if title else None, title_fontsize=8, alignment="left")


def inference_curves(
    series: Mapping[str, Sequence[Tuple[int, float, float, float]]],
    knees: Mapping[str, Tuple[Optional[int], Optional[int]]],
    path: str | os.PathLike,
) -> str:
    """Inference batching: throughput (left) and latency p50/p99 (right) against the batch size, one
    colour per model. `series[model]` = [(batch, samples/s, p50 s, p99 s)] of ok points; `knees[model]`
    = (measured, predicted) batch sizes, drawn as a filled and a hollow marker on the throughput line."""
    fig = Figure(figsize=(11, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    sizes: List[int] = []
    for i, (name, rows) in enumerate(series.items()):
        if not rows:
            continue
        rows = sorted(rows)
        color = _color(i)
        b = [r[0] for r in rows]
        sizes += b
        left.plot(b, [r[1] for r in rows], color=color, marker="o", markersize=4, label=name)
        right.plot(b, [r[2] * 1e3 for r in rows], color=color, marker="o", markersize=4, label=f"{name} p50")
        right.plot(b, [r[3] * 1e3 for r in rows], color=color, linestyle="--", linewidth=1, label=f"{name} p99")
        measured, predicted = knees.get(name, (None, None))
        rate = dict((r[0], r[1]) for r in rows)
        if measured in rate:
            left.plot([measured], [rate[measured]], marker="*", markersize=14, color=color, linestyle="none")
        if predicted is not None:
            left.axvline(predicted, color=color, linestyle=":", linewidth=1)
    if not sizes:
        return _placeholder(path, "Inference: throughput and latency vs batch size", [], "no ok measurements")
    for ax in (left, right):
        _size_axis(ax, sizes)
        ax.set_xlabel("batch size (log2)")
        ax.grid(True, alpha=0.3)
    left.set_yscale("log")
    right.set_yscale("log")
    left.set_title("Throughput (star: measured knee, dotted: roofline)")
    left.set_ylabel("samples / s")
    right.set_title("Latency per batch")
    right.set_ylabel("ms (solid p50, dashed p99)")
    left.legend(fontsize=8, loc="lower right")
    return _save(fig, path)
