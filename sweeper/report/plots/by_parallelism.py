"""The report's figures across parallelisms (plan.PARALLELISMS), drawn only when a sweep measured more than one:
peak memory per worker against the worker count, and throughput against the micro-batch, one line per
parallelism. A DDP-only sweep's report is unchanged. matplotlib's object API only (Figure + Agg, no pyplot).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sweeper.plan import PARALLELISMS
from sweeper.report import folding, parallelism
from sweeper.report.trials import Trial

ORDER = PARALLELISMS
STYLE = {"ddp": ("C0", "o"), "zero1": ("C3", "D"), "zero2": ("C1", "s"), "zero3": ("C2", "^"), "hsdp": ("C4", "v")}
MIB = 2 ** 20


def draw(folder: str, trials: Sequence[Trial], budget_bytes: Optional[float] = None) -> Dict[str, str]:
    """name -> PNG path of the figures across parallelisms; {} when the sweep measured one parallelism."""
    ok = [t for t in folding.fold_layouts(trials) if t.status == "ok"]
    if len({parallelism.of(t) for t in trials}) < 2 or not ok:
        return {}
    recipe = Counter(folding.recipe(t) for t in ok).most_common(1)[0][0]
    ok = [t for t in ok if folding.recipe(t) == recipe]
    shown = "" if recipe == folding.DEFAULT_RECIPE else f", {folding.recipe_label(recipe)}"
    images = {}
    for name, figure in (("memory_per_worker_by_parallelism", lambda p: memory_vs_workers(ok, p, budget_bytes, shown)),
                         ("throughput_by_parallelism", lambda p: throughput_vs_micro_batch(ok, p, shown))):
        written = figure(os.path.join(folder, f"{name}.png"))
        if written:
            images[name] = written
    return images


def _lines(trials: Sequence[Trial], x: Callable[[Trial], int], y: Callable[[Trial], Optional[float]]
           ) -> Dict[str, List[Tuple[int, float]]]:
    """parallelism -> [(x, the largest y over the points at x)], x ascending (accumulation folded: its
    largest peak, its fastest rate)."""
    best: Dict[Tuple[str, int], float] = {}
    for t in trials:
        value = y(t)
        if value is not None:
            key = (parallelism.of(t), x(t))
            best[key] = max(best.get(key, value), value)
    lines: Dict[str, List[Tuple[int, float]]] = defaultdict(list)
    for (p, at), value in sorted(best.items(), key=lambda kv: (ORDER.index(kv[0][0]), kv[0][1])):
        lines[p].append((at, value))
    return dict(lines)


def memory_vs_workers(trials: Sequence[Trial], path: str, budget_bytes: Optional[float] = None, shown: str = ""
                      ) -> Optional[str]:
    """Peak memory per worker (the largest worker's) against workers, one line per parallelism, at the
    micro-batch measured at the most (parallelism, workers) pairs (the largest among equals)."""
    spread = Counter(m for m, _, _ in {(t.micro_batch_size, parallelism.of(t), t.num_workers) for t in trials
                                       if t.peak_memory_bytes is not None})
    if not spread:
        return None
    micro = max(spread, key=lambda m: (spread[m], m))
    lines = _lines([t for t in trials if t.micro_batch_size == micro], lambda t: t.num_workers,
                   lambda t: None if t.peak_memory_bytes is None else t.peak_memory_bytes / MIB)
    fig, ax = _axes()
    _plot(ax, lines)
    if budget_bytes is not None:
        ax.axhline(budget_bytes / MIB, color="#d62728", linewidth=1.2, label=f"budget ({budget_bytes / MIB:.0f} MiB)")
    ax.set_xticks(sorted({x for line in lines.values() for x, _ in line}))
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, path, f"Peak memory per worker vs workers (micro-batch {micro}{shown})",
                   "data-parallel workers", "peak memory, largest worker (MiB)")


def throughput_vs_micro_batch(trials: Sequence[Trial], path: str, shown: str = "") -> Optional[str]:
    """Throughput against the micro-batch, one line per parallelism, at the largest worker count every
    parallelism measured (else the largest measured)."""
    counts = [{t.num_workers for t in trials if parallelism.of(t) == p} for p in {parallelism.of(t) for t in trials}]
    common = set.intersection(*counts) if counts else set()
    workers = max(common or {t.num_workers for t in trials})
    tokens = any(t.tokens_per_second is not None for t in trials)
    lines = _lines([t for t in trials if t.num_workers == workers], lambda t: t.micro_batch_size,
                   lambda t: t.tokens_per_second if tokens else t.samples_per_second)
    if not lines:
        return None
    fig, ax = _axes()
    _plot(ax, lines)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for line in lines.values() for x, _ in line}), minor=False)
    ax.xaxis.set_major_formatter("{x:g}")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, path, f"Throughput vs micro-batch at {workers} worker(s){shown}",
                   "micro-batch size (per worker per step, log2)", "tokens/s" if tokens else "samples/s")


def _plot(ax: Axes, lines: Dict[str, List[Tuple[int, float]]]) -> None:
    for p, line in lines.items():
        color, marker = STYLE.get(p, ("C3", "D"))
        ax.plot([x for x, _ in line], [y for _, y in line], color=color, marker=marker, label=p)


def _axes() -> Tuple[Figure, Axes]:
    fig = Figure(figsize=(7.0, 4.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, color="0.9", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _finish(fig: Figure, ax: Axes, path: str, title: str, xlabel: str, ylabel: str) -> str:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, title="parallelism")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path
