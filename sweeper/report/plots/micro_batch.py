"""The micro-batch figures: throughput (each series' knee ringed) and peak memory (with its fitted
line and the budget) against the micro-batch, and peak memory per recipe. Seeds folded: one mark per
layout."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from sweeper.report import folding
from sweeper.report.analysis import Trial
from sweeper.report.plots import canvas, marks
from sweeper.units import MiB


def throughput_vs_micro_batch(
    trials: Sequence[Trial],
    knees: Mapping[marks.Series, Optional[int]],
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
        return canvas.placeholder(path, "Throughput vs micro-batch size", trials, "no ok points with a throughput")
    fig, ax = canvas.figure()
    by_series = marks.by_series(trials)
    lines = _lines(by_series, ok)
    top, knee_marks = _draw_throughput(ax, lines, knees)
    ax.set_ylim(0, top * 1.15)
    _ring_knees(ax, knee_marks, top)
    extra = _knee_key(knee_marks, lines, min_gain)
    extra.append(Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=10,
                        label="error bar: \u00b1 cv of the windows behind the figure"))
    if _mark_not_ok_on_floor(ax, trials, by_series):
        extra.append(Line2D([], [], linestyle="none", marker="x", color=canvas.OOM_COLOR, markersize=8,
                            markeredgewidth=2, label="oom / diverged / failed"))
    canvas.size_axis(ax, [t.micro_batch_size for t in trials])
    canvas.titles(ax, "Throughput vs micro-batch size", "micro-batch size (samples per worker per step, log2)",
                   f"throughput ({unit})")
    canvas.legend(ax, extra)
    return canvas.save(fig, path)


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
        return canvas.placeholder(path, "Peak memory vs micro-batch size", trials, "no ok points with a peak memory")
    fig, ax = canvas.figure()
    micro = [t.micro_batch_size for t in trials]
    top = _draw_memory(ax, _lines(marks.by_series(trials), ok), fit, max(t.peak_memory_bytes for t in ok))
    if fit is not None:
        fixed, per_sample = fit
        label = f"fit: {canvas.mib(fixed)} fixed\n  + {canvas.kib(per_sample)}/sample x micro"
        top = max(top, _draw_fit(ax, fixed, per_sample, micro, color="0.25", linewidth=1.2, label=label))
    top = _draw_budget(ax, budget_bytes, top)
    ax.set_ylim(0, top / MiB * 1.12)
    _mark_oom(ax, trials, budget_bytes)
    # Linear: memory grows linearly with the micro-batch (seeds 001/004), so the fit is a straight
    # line meeting the axis at the fixed memory; on a log axis it would bend like super-linear growth.
    canvas.size_axis(ax, micro, log=False)
    extra = marks.mark_diverged(ax, trials, x_of=lambda t: t.micro_batch_size)
    canvas.titles(ax, "Peak memory vs micro-batch size", "micro-batch size (samples per worker per step)",
                   "peak memory, largest worker (MiB)")
    canvas.legend(ax, extra)
    return canvas.save(fig, path)


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
    fig, ax = canvas.figure()
    top = 0.0
    for i, (r, members) in enumerate(sorted(measured.items(), key=lambda kv: folding.recipe_order(kv[0]))):
        base = min((t.num_workers, t.accumulation_steps) for t in members)
        line = sorted((t for t in members if (t.num_workers, t.accumulation_steps) == base),
                      key=lambda t: t.micro_batch_size)
        top = max(top, _draw_recipe_line(ax, i, r, base, line))
    top = _draw_budget(ax, budget_bytes, top)
    ax.set_ylim(0, top / MiB * 1.12)
    _mark_oom(ax, folded, budget_bytes)
    canvas.size_axis(ax, [t.micro_batch_size for t in folded], log=False)
    canvas.titles(ax, "Peak memory vs micro-batch size, per recipe", "micro-batch size (samples per worker per step)",
                   "peak memory, largest worker (MiB)")
    canvas.legend(ax, [Line2D([], [], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                               markeredgecolor="0.3", label="largest micro-batch measured ok")])
    return canvas.save(fig, path)


def _draw_recipe_line(ax: Axes, i: int, r: Tuple[str, str], base: Tuple[int, int], line: Sequence[Trial]) -> float:
    """One recipe's ok points, its fitted line and its largest ok micro-batch ringed; returns the
    highest point drawn, in bytes."""
    ok = [t for t in line if t.status == "ok" and t.peak_memory_bytes is not None]
    if not ok:
        return 0.0
    color = marks.color(i)
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
        label += f"\n  {canvas.mib(intercept)} + {canvas.kib(slope)}/sample"
    ax.plot(x, y / MiB, color=color, linestyle="none", marker=marks.marker(i), markersize=6, label=label)
    ax.scatter([x[-1]], [y[-1] / MiB], s=200, facecolors="none", edgecolors=color, linewidths=1.6, zorder=4)
    return top


# -- the micro-batch plots' pieces ---------------------------------------------------------------


class _Line(NamedTuple):
    """One (accumulation, workers) series as drawn: its place among all series (its colour and
    marker), all its trials, and its ok ones by micro-batch size."""

    index: int
    series: marks.Series
    members: List[Trial]
    points: List[Trial]


def _lines(by_series: Dict[marks.Series, List[Trial]], ok: Sequence[Trial]) -> List[_Line]:
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
    ax: Axes, lines: Sequence[_Line], knees: Mapping[marks.Series, Optional[int]]
) -> Tuple[float, List[Tuple[int, float, str]]]:
    """Each series' samples/s with +- cv x value error bars. Returns the top of the highest bar (1.0
    with none) and, for each series whose knee it measured, where to ring the knee and in which colour."""
    top = 0.0
    knee_marks: List[Tuple[int, float, str]] = []
    for line in lines:
        color = marks.color(line.index)
        x = [t.micro_batch_size for t in line.points]
        y = [t.samples_per_second for t in line.points]
        err = [(t.samples_per_second_cv or 0.0) * t.samples_per_second for t in line.points]
        ax.errorbar(x, y, yerr=err, color=color, marker=marks.marker(line.index), markersize=5,
                    capsize=3, linewidth=1.5, label=marks.series_label(line.series))
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
        color = marks.color(line.index)
        x = np.array([t.micro_batch_size for t in line.points], dtype=float)
        y = np.array([t.peak_memory_bytes for t in line.points], dtype=float)
        label = marks.series_label(line.series)
        if fit is None and len(set(x)) >= 2:
            slope, intercept = np.polyfit(x, y, 1)
            # Drawn over the series' whole range, oom sizes included: it shows what they would have needed.
            highest = _draw_fit(ax, intercept, slope, [t.micro_batch_size for t in line.members], color=color,
                                linewidth=1, alpha=0.8)
            top = max(top, highest)
            label += f"\n  fit {canvas.mib(intercept)} + {canvas.kib(slope)}/sample"
        ax.plot(x, y / MiB, color=color, linestyle="none", marker=marks.marker(line.index), markersize=6,
                markerfacecolor="none", markeredgewidth=1.5, label=label)
    return top


def _draw_budget(ax: Axes, budget_bytes: Optional[float], top: float) -> float:
    """The memory budget as a red horizontal line (none without one); returns `top` raised to it."""
    if budget_bytes is None:
        return top
    ax.axhline(budget_bytes / MiB, color=canvas.OOM_COLOR, linewidth=1.2,
               label=f"budget ({budget_bytes / MiB:.0f} MiB)")
    return max(top, budget_bytes)


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
    ax.plot(oom_micro, [y] * len(oom_micro), linestyle="none", marker="x", color=canvas.OOM_COLOR, markersize=9,
            markeredgewidth=2, label="oom", zorder=5, **where)


def _fit_span(micro_sizes: Iterable[int]) -> np.ndarray:
    """Where a fitted memory line is drawn: from 0, where it meets the fixed memory, to the largest size."""
    return np.array([0.0, float(max(micro_sizes))])


def _mark_not_ok_on_floor(ax: Axes, trials: Sequence[Trial], by_series: Dict[marks.Series, List[Trial]]) -> bool:
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
        ax.plot([micro], [0.035], transform=floor, linestyle="none", marker="x", color=canvas.OOM_COLOR, markersize=9,
                markeredgewidth=2, zorder=5, clip_on=False)
        text = marks.not_ok_text(failed)
        everyone = {s for s, members in by_series.items() if any(t.micro_batch_size == micro for t in members)}
        who = sorted({marks.series_of(t) for t in failed})
        if set(who) != everyone:  # only some series failed here: say which, or how many
            names = [marks.series_label(s) for s in who] if len(who) <= 2 else [f"{len(who)} of {len(everyone)} series"]
            text += "\n" + "\n".join(names)
        ax.text(micro, 0.075, canvas.plain(text), transform=floor, ha="center", va="bottom", fontsize=7,
                color=canvas.OOM_COLOR)
    return True


# -- helpers -------------------------------------------------------------------------------------
