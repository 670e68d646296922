"""The recipes a sweep compared (precision x activation checkpointing): per recipe, the largest micro-batch
that ran per worker count and its throughput, accuracy and memory against fp32 without checkpointing at the
same layout; in words, whether each recipe is certified not worse than fp32 in quality (the report's
non-inferiority rule on report.quality, analysis.judge_matched), what checkpointing saved and whether a
larger micro-batch with it beats accumulation at equal global batch. Pure (standard library), on points
folded over seeds."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from sweeper.report.noninferiority import Gap, gap_words, judge_matched
from sweeper.report.quality import ACCURACY, Quality
from sweeper.report.trials import Trial, summarize_all

BASELINE = ("fp32", "none")
# Checkpointing that lowers peak memory by less than this saved "~nothing": within the run-to-run
# spread of a peak (the plain MLP, whose layers' inputs are all it saves, lands near 0 %).
NOTHING_SAVED = 0.05

Recipe = Tuple[str, str]  # (precision, activation checkpointing)
Layout = Tuple[int, int, int, float, Optional[int]]  # (micro-batch, accumulation, workers, LR multiplier, context)


@dataclass(frozen=True)
class RecipeRow:
    """One recipe against the baseline (fp32, no checkpointing) at the layouts both ran ok."""

    precision: str
    checkpointing: str
    largest_micro_batch: Dict[int, int]  # workers -> the largest micro-batch that ended ok
    throughput_delta: Optional[float]  # mean relative change: 0.12 is 12 % more samples/s
    accuracy_delta: Optional[float]  # mean change of val_accuracy (a fraction: 0.01 is one point)
    memory_delta: Optional[float]  # mean relative change of peak memory: -0.4 is 40 % less
    layouts_compared: int  # layouts where both this recipe and the baseline ended ok
    # Its quality gap (report.quality: val_accuracy, or a loss) to the baseline, paired by seed over the
    # layouts both ran (layouts are never seeds), judged against the quality's tolerance
    # (analysis.judge_matched): outcome "eligible" | "unproven" | "excluded" | "untested";
    # None for the baseline, without a drop, or without a shared layout and seed.
    accuracy_gap: Optional[Gap] = None


@dataclass(frozen=True)
class RecipeComparison:
    rows: List[RecipeRow]  # the baseline first, then by precision and checkpointing
    sentences: List[str]  # what checkpointing saved; checkpointing vs accumulation at equal global batch
    # Per recipe other than the baseline, its accuracy against fp32 by the recommendation's rule.
    verdicts: List[str] = dataclasses.field(default_factory=list)


def recipe_of(trial: Trial) -> Recipe:
    """A record from before recipes trained fp32 without checkpointing."""
    return trial.precision or BASELINE[0], trial.activation_checkpointing or BASELINE[1]


def _layout(trial: Trial) -> Layout:
    multiplier = 1.0 if trial.lr_multiplier is None else float(trial.lr_multiplier)
    return trial.micro_batch_size, trial.accumulation_steps, trial.num_workers, multiplier, trial.context


def compare_recipes(trials: Iterable[Trial], max_accuracy_drop: Optional[float] = 0.02,
                    level: float = 0.95, quality: Quality = ACCURACY) -> RecipeComparison:
    """Every recipe of the sweep against the baseline, over points folded over seeds (mean figures);
    empty when the sweep ran one recipe only. With `max_accuracy_drop` (the tolerance in `quality`'s
    units: report.max_loss_rise for a loss), each recipe's quality is judged
    against the baseline's by the recommendation's rule (non-inferiority at `level`, paired over the
    layouts and seeds both ran, by seed: the layouts of one seed are one observation): a recipe is
    recommended over fp32 only when certified not worse."""
    trials = list(trials)
    points = [p.trial for p in summarize_all(trials).values()]
    by_recipe: Dict[Recipe, Dict[Layout, Trial]] = {}
    for point in points:
        by_recipe.setdefault(recipe_of(point), {})[_layout(point)] = point
    if len(by_recipe) < 2:
        return RecipeComparison([], [])
    order = sorted(by_recipe, key=lambda r: (r != BASELINE, r))
    base = by_recipe.get(BASELINE, {})
    rows = [_row(recipe, by_recipe[recipe], base) for recipe in order]
    if max_accuracy_drop is not None:
        rows = [_judged(row, trials, max_accuracy_drop, level, quality) for row in rows]
    verdicts = [_verdict(row, max_accuracy_drop, level, quality) for row in rows if row.accuracy_gap is not None]
    sentences = [s for precision in sorted({r[0] for r in by_recipe})
                  for s in [_memory_sentence(precision, by_recipe)] if s]
    sentences += _checkpointing_vs_accumulation(points)
    return RecipeComparison(rows, sentences, verdicts)


def _row(recipe: Recipe, runs: Dict[Layout, Trial], base: Dict[Layout, Trial]) -> RecipeRow:
    largest: Dict[int, int] = {}
    for point in runs.values():
        if point.status == "ok":
            largest[point.num_workers] = max(largest.get(point.num_workers, 0), point.micro_batch_size)
    pairs = [(p, base[layout]) for layout, p in runs.items()
             if layout in base and p.status == "ok" and base[layout].status == "ok"]
    return RecipeRow(
        recipe[0], recipe[1], dict(sorted(largest.items())),
        _mean_of(pairs, lambda p, b: _relative(p.samples_per_second, b.samples_per_second)),
        _mean_of(pairs, lambda p, b: None if p.val_accuracy is None or b.val_accuracy is None
                 else p.val_accuracy - b.val_accuracy),
        _mean_of(pairs, lambda p, b: _relative(p.peak_memory_bytes, b.peak_memory_bytes)),
        len(pairs),
    )


def _runs(trials: List[Trial], recipe: Recipe) -> Dict[Any, Trial]:
    """A recipe's runs by (layout, seed): what a run of another recipe is matched with."""
    return {(_layout(t), t.seed): t for t in trials if recipe_of(t) == recipe}


def _judged(row: RecipeRow, trials: List[Trial], max_drop: float, level: float, quality: Quality) -> RecipeRow:
    recipe = (row.precision, row.checkpointing)
    if recipe == BASELINE:
        return row
    gap = judge_matched(_runs(trials, recipe), _runs(trials, BASELINE), max_drop, level, quality)
    return dataclasses.replace(row, accuracy_gap=gap)


def _verdict(row: RecipeRow, max_drop: Optional[float], level: float, quality: Quality) -> str:
    what = f"{row.precision} with {'no' if row.checkpointing == 'none' else row.checkpointing} checkpointing"
    faster = row.throughput_delta is not None and row.throughput_delta > 0
    return gap_words(what, "fp32", row.accuracy_gap, max_drop, level, faster, quality)


def _relative(value: Optional[float], base: Optional[float]) -> Optional[float]:
    return None if value is None or not base else value / base - 1.0


def _mean_of(pairs: List[Tuple[Trial, Trial]], delta) -> Optional[float]:
    values = [d for d in (delta(p, b) for p, b in pairs) if d is not None]
    return statistics.fmean(values) if values else None


def _memory_sentence(precision: str, by_recipe: Dict[Recipe, Dict[Layout, Trial]]) -> Optional[str]:
    """What checkpointing saved of peak memory in `precision`, at which cost in throughput, and how
    far it moved the largest micro-batch that ran."""
    plain, checked = by_recipe.get((precision, "none"), {}), by_recipe.get((precision, "blocks"), {})
    row = _row((precision, "blocks"), checked, plain)
    if row.memory_delta is None:
        return None
    saved = -row.memory_delta
    n = f"mean over {row.layouts_compared} layout{'s' if row.layouts_compared > 1 else ''}"
    cost = "" if row.throughput_delta is None else (
        f" at {abs(row.throughput_delta):.0%} {'lower' if row.throughput_delta < 0 else 'higher'} throughput")
    if saved < NOTHING_SAVED:
        return (f"In {precision}, activation checkpointing saved ~nothing of peak memory ({saved:.1%}, {n}){cost}: "
                "this model's saved activations are not what fills memory, so checkpointing is no free memory here")
    before = _row((precision, "none"), plain, {}).largest_micro_batch
    moved = [f"{before[w]} to {mb} on {w} worker{'s' if w > 1 else ''}"
             for w, mb in row.largest_micro_batch.items() if w in before and mb != before[w]]
    largest = f"; the largest micro-batch that ran went from {', '.join(moved)}" if moved else ""
    return f"In {precision}, activation checkpointing saved {saved:.0%} of peak memory ({n}){cost}{largest}"


def _checkpointing_vs_accumulation(points: List[Trial]) -> List[str]:
    """At each global batch, worker count, precision and LR multiplier: the largest micro-batch run
    with checkpointing against the layout without it that accumulates more (the largest smaller
    micro-batch), both ok: which is faster and by how much."""
    groups: Dict[Tuple[int, int, str, float, int], List[Trial]] = {}
    for p in points:
        if p.status == "ok" and p.samples_per_second:
            key = (p.global_batch_size, p.num_workers, recipe_of(p)[0], _layout(p)[3], p.context or 0)
            groups.setdefault(key, []).append(p)
    out = []
    for (batch, workers, precision, _, _), members in sorted(groups.items()):
        checked = [p for p in members if recipe_of(p)[1] != "none"]
        if not checked:
            continue
        big = max(checked, key=lambda p: (p.micro_batch_size, p.key))
        smaller = [p for p in members if recipe_of(p)[1] == "none" and p.micro_batch_size < big.micro_batch_size]
        if smaller:
            out.append(_versus(big, max(smaller, key=lambda p: (p.micro_batch_size, p.key)), batch, workers, precision))
    return out


def _versus(checked: Trial, accumulating: Trial, batch: int, workers: int, precision: str) -> str:
    gap = checked.samples_per_second / accumulating.samples_per_second - 1.0
    spread = max([cv for cv in (checked.samples_per_second_cv, accumulating.samples_per_second_cv) if cv] or [0.0])
    if abs(gap) <= spread:
        verdict = f"about as fast as (a {abs(gap):.0%} gap, within the measured spread of {spread:.0%})"
    else:
        verdict = f"{abs(gap):.0%} {'faster' if gap > 0 else 'slower'} than"
    return (f"At global batch {batch} on {workers} worker{'s' if workers > 1 else ''} ({precision}), a larger "
            f"micro-batch with checkpointing ({checked.key}, {checked.samples_per_second:.1f} samples/s) is {verdict} "
            f"accumulation ({accumulating.key}, {accumulating.samples_per_second:.1f} samples/s)")


__all__ = ["BASELINE", "NOTHING_SAVED", "RecipeComparison", "RecipeRow", "compare_recipes", "recipe_of"]
