"""The figures' canvas: a fixed-size Agg figure saved as PNG (or a placeholder that says why there is
nothing to draw), log2 axes ticked at the swept sizes, limits, titles, the legend beside the axes and
point labels that avoid each other. matplotlib's object API only."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Dict, Iterable, Optional, Sequence, Tuple

# Figure + the Agg canvas, never pyplot: pyplot keeps global state (a current figure, a backend chosen
# at first import) that a Ray driver, a worker or a test process may not want changed under it.
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator
from matplotlib.transforms import Bbox

from sweeper.report.analysis import Trial
from sweeper.units import KiB, MiB, format_bytes

# Every figure function writes a FIGSIZE x DPI picture (840 x 540 pixels), whatever it contains.
FIGSIZE = (7.0, 4.5)
DPI = 120

OOM_COLOR = "#d62728"
RECOMMENDED_COLOR = "#f2b701"  # a gold star: the trial the report recommends


def figure() -> Tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, which="major", color="0.9", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def save(fig: Figure, path: str | os.PathLike) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    # No bbox_inches="tight": it would change the pixel size from picture to picture.
    fig.savefig(path, dpi=DPI, format="png")
    return path


def placeholder(path: str | os.PathLike, title: str, trials: Sequence[Trial], message: str) -> str:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    counts: Dict[str, int] = defaultdict(int)
    for t in trials:
        counts[t.status] += 1
    detail = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no points"
    fig.text(0.5, 0.62, title, ha="center", va="center", fontsize=13)
    fig.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="0.3")
    fig.text(0.5, 0.41, f"({plain(detail)})", ha="center", va="center", fontsize=10, color="0.45")
    return save(fig, path)



def plain(text: str) -> str:
    # A pair of "$" in a trial key or label would otherwise be typeset as mathtext.
    return str(text).replace("$", r"\$")


def mib(n: float) -> str:
    return format_bytes(n, 0 if abs(n) >= 10 * MiB else 1, unit="MiB")


def kib(n: float) -> str:
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


def label_points(fig: Figure, ax: Axes, points: Sequence[Tuple[float, float, str]]) -> None:
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
            label = ax.annotate(plain(text), (x, y), xytext=(dx, dy), textcoords="offset pixels", ha=ha, va=va,
                                fontsize=7, color="#1f4e79", zorder=4, bbox=_LABEL_BOX)
            box = label.get_window_extent(renderer)
            fits = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if fits and not any(box.overlaps(other) for other in taken):
                taken.append(box.padded(1))
                break
            label.remove()


def size_axis(ax: Axes, sizes: Iterable[Optional[int]], log: bool = True) -> None:
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


def pad_limits(ax: Axes, xs: Sequence[float], ys: Sequence[float]) -> None:
    def around(lo: float, hi: float, pad: float) -> Tuple[float, float]:
        if hi <= lo:  # one point, or all equal: a window around it
            half = abs(lo) * 0.1 or 1.0
            return lo - half, hi + half
        return lo - pad * (hi - lo), hi + pad * (hi - lo)

    ax.set_xlim(*around(min(xs), max(xs), 0.12))
    ylo, yhi = around(min(ys), max(ys), 0.12)
    ax.set_ylim(max(0.0, ylo) if min(ys) >= 0 else ylo, yhi)


def titles(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def legend(ax: Axes, extra: Sequence[Line2D] = (), title: Optional[str] = None) -> None:
    handles, labels = ax.get_legend_handles_labels()
    handles += list(extra)
    labels += [h.get_label() for h in extra]
    if not handles:
        return
    # Beside the axes, never over the data; constrained layout shrinks the axes to make room.
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8,
              frameon=False, title=plain(title) if title else None, title_fontsize=8, alignment="left")
