"""A point's series in the figures (accumulation, workers, and its recipe, LR multiplier or context when
not the default), the series' colour, marker and label, and the red marks of points that diverged or did
not finish."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Sequence, Tuple

from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from sweeper.report import folding, parallelism
from sweeper.report.analysis import Trial, replicates
from sweeper.report.plots import canvas

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

# (accumulation_steps, num_workers, what else sets the series apart: its recipe beyond fp32, its LR
# multiplier beyond 1; "" for neither)
Series = Tuple[int, int, str]
DIVERGED_NOTE = "diverged / oom / failed (red x)"


def mark_diverged(ax: Axes, trials: Sequence[Trial], x_of=lambda t: t.global_batch_size) -> List[Line2D]:
    """A red x near the bottom at the x (the global batch, by default) of each point with a diverged
    replicate, with the reason, the step when one, and how many of its seeds diverged when not all;
    returns the legend's entry (none when nothing diverged). Call it once the x limits are set."""
    diverged: Dict[float, List[str]] = defaultdict(list)
    for members in replicates(trials).values():
        bad = [t for t in members if t.status == "diverged"]
        if not bad:
            continue
        steps = sorted({t.diverged_at_step for t in bad if t.diverged_at_step is not None})
        text = not_ok_text(bad) + (f" @{steps[0]}" if len(steps) == 1 else "")
        some = "" if len(bad) == len(members) else f" ({len(bad)}/{len(members)} seeds)"
        diverged[x_of(bad[0])].append(text + some)
    if not diverged:
        return []
    floor = ax.get_xaxis_transform()
    for i, (x, texts) in enumerate(sorted(diverged.items())):
        ax.plot([x], [0.035], transform=floor, linestyle="none", marker="x", color=canvas.OOM_COLOR, markersize=9,
                markeredgewidth=2, zorder=5, clip_on=False)
        shown = sorted(set(texts))
        text = "\n".join(shown[:2]) + (f"\n+{len(shown) - 2} more" if len(shown) > 2 else "")
        # Centred over its x, but kept inside the axes near either edge (the y labels, the legend).
        where = ax.transAxes.inverted().transform(floor.transform((x, 0.0)))[0]
        ha = "left" if where < 0.15 else "right" if where > 0.85 else "center"
        # Neighbours alternate between two heights, so labels of adjacent batch sizes do not overlap.
        ax.text(x, 0.075 + 0.07 * (i % 2), canvas.plain(text), transform=floor, ha=ha, va="bottom", fontsize=7,
                color=canvas.OOM_COLOR)
    return [Line2D([], [], linestyle="none", marker="x", color=canvas.OOM_COLOR, markersize=8, markeredgewidth=2,
                   label="diverged (reason @step; left out)")]


def by_series(trials: Iterable[Trial]) -> Dict[Series, List[Trial]]:
    groups: Dict[Series, List[Trial]] = defaultdict(list)
    for t in trials:
        groups[series_of(t)].append(t)
    return dict(sorted(groups.items()))


def series_of(t: Trial) -> Series:
    """A trial's series: its accumulation and workers, and its recipe, sharding, gradient sync and LR
    multiplier when they are not the defaults (a layout-folded trial carries no multiplier). The sharding
    and the sync are in it because each is a layout of its own at the same micro-batch (one series holds one
    throughput per size)."""
    extra = []
    if folding.recipe(t) != folding.DEFAULT_RECIPE:
        extra.append(folding.recipe_label(folding.recipe(t)))
    if parallelism.of(t) != parallelism.DEFAULT:
        extra.append(parallelism.of(t))
    if t.gradient_sync == "every":
        extra.append("sync every")
    if t.lr_multiplier is not None and t.lr_multiplier != 1.0:
        extra.append(f"LR x{t.lr_multiplier:g}")
    if t.context is not None and "-ctx" in t.point:  # a point of sweep.context_lengths
        extra.append(f"context {t.context}")
    return t.accumulation_steps, t.num_workers, ", ".join(extra)


def series_label(series: Series) -> str:
    return f"accum {series[0]}, workers {series[1]}" + (f", {series[2]}" if series[2] else "")


def not_ok_text(failed: Sequence[Trial]) -> str:
    """What happened, e.g. "oom / diverged (nonfinite)": a diverged point's reason with its status."""
    def one(t: Trial) -> str:
        return f"diverged ({t.diverged_reason})" if t.status == "diverged" and t.diverged_reason else t.status

    return " / ".join(sorted({one(t) for t in failed}))


def color(i: int) -> str:
    return f"C{i % 10}"


def marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]
