"""The throughput/memory Pareto front: every ok point, the front connected and labelled, the
recommended point starred."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from sweeper.report import folding
from sweeper.report.analysis import Trial
from sweeper.report.plots import canvas
from sweeper.units import MiB


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
        return canvas.placeholder(path, "Throughput vs peak memory", trials, "no ok points with throughput and memory")
    fig, ax = canvas.figure()
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
    canvas.pad_limits(ax, xs, ys)
    canvas.titles(ax, "Throughput vs peak memory (Pareto front)", "peak memory, largest worker (MiB)",
                   f"throughput ({unit})")
    labelled = list(on_front)
    diverged = [t for t in trials if t.status == "diverged" and t.samples_per_second is not None
                and t.peak_memory_bytes is not None]
    if diverged:  # fast or light, but not a way to train: shown so the front's gaps are explained
        ax.plot([t.peak_memory_bytes / MiB for t in diverged], [t.samples_per_second for t in diverged],
                linestyle="none", marker="x", color=canvas.OOM_COLOR, markersize=8, markeredgewidth=2, zorder=3,
                label="diverged (left out)")
    # A recommendation may be one seed replicate of a point shown here folded: match its layout.
    if recommended is not None:
        recommended = next((t for t in ok if folding.layout_key(t) == folding.layout_key(recommended)), None)
    if recommended is not None:
        ax.plot([recommended.peak_memory_bytes / MiB], [recommended.samples_per_second], linestyle="none",
                marker="*", markersize=17, color=canvas.RECOMMENDED_COLOR, markeredgecolor="0.2", markeredgewidth=0.8,
                label=f"recommended: {recommended.key}", zorder=4)
        if recommended not in labelled:
            labelled.append(recommended)
    canvas.legend(ax)
    canvas.label_points(fig, ax, [(t.peak_memory_bytes / MiB, t.samples_per_second, t.key) for t in labelled])
    return canvas.save(fig, path)
