"""The inference sweep's figure: throughput and latency against the batch size, one colour per model,
the measured knee and the roofline's prediction marked."""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Sequence, Tuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sweeper.report.plots import canvas, marks


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
        color = marks.color(i)
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
        return canvas.placeholder(path, "Inference: throughput and latency vs batch size", [], "no ok measurements")
    for ax in (left, right):
        canvas.size_axis(ax, sizes)
        ax.set_xlabel("batch size (log2)")
        ax.grid(True, alpha=0.3)
    left.set_yscale("log")
    right.set_yscale("log")
    left.set_title("Throughput (star: measured knee, dotted: roofline)")
    left.set_ylabel("samples / s")
    right.set_title("Latency per batch")
    right.set_ylabel("ms (solid p50, dashed p99)")
    left.legend(fontsize=8, loc="lower right")
    return canvas.save(fig, path)
