"""The LR multiplier table: per global batch, the best multiplier, the largest that did not diverge
and (by the report's quality) which others are certified within the tolerance of the best. Pure (stdlib)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Tuple

from sweeper.report import parallelism
from sweeper.report.noninferiority import Gap, judge_matched
from sweeper.report.quality import ACCURACY, QUALITIES, Quality
from sweeper.report.trials import Trial, _finite, _mean


@dataclass(frozen=True)
class LrRow:
    """One global batch's LR multipliers (sweep.lr_multipliers): which trained best and how far the LR
    could go up without diverging."""

    global_batch_size: int
    multipliers: Tuple[float, ...]  # tried, ascending
    # What "best" means: the quality (val_accuracy higher; val_loss, val_bits_per_byte lower), or train_loss.
    metric: str
    best_multiplier: Optional[float]  # the best mean `metric` over the ok replicates at this global batch
    best_value: Optional[float]
    largest_stable: Optional[float]  # the largest multiplier with an ok replicate and none diverged
    diverged: Tuple[float, ...]  # multipliers with a diverged replicate
    # With a tolerance (the metric a quality): each other multiplier's quality gap to the best one,
    # paired by seed (each seed's figure the mean over the layouts and recipes both ran: layouts are never
    # seeds), judged by the recommendation's rule (judge_matched): (multiplier, Gap) ascending; outcome
    # "eligible" | "unproven" | "excluded" | "untested".
    judged: Tuple[Tuple[float, "Gap"], ...] = ()

    def outcome(self, name: str) -> Tuple[float, ...]:
        """The multipliers whose gap to the best came out `name` (the best itself is "eligible")."""
        best = () if name != "eligible" or self.best_multiplier is None else (self.best_multiplier,)
        return tuple(sorted(best + tuple(m for m, gap in self.judged if gap.outcome == name)))


def lr_table(trials: Iterable[Trial], metric: Optional[str] = None, max_drop: Optional[float] = None,
             level: float = 0.95, quality: Optional[Quality] = None) -> Dict[int, LrRow]:
    """Per global batch (ascending), the best LR multiplier and the largest that did not diverge,
    over every layout and recipe at that global batch and every seed (a run without a multiplier
    trained at 1). `metric` None: `quality`'s when given, else val_accuracy when any ok run measured
    it, else val_loss, else train_loss (final); any Trial figure may be named (val_accuracy is the only
    one where higher is better, e.g. time_to_target_seconds or steps_to_target rank lower first). With
    `max_drop` (in the quality's units) and a quality metric, every other multiplier is judged against
    the best by non-inferiority at `level` (`LrRow.judged`): one within it is certified, not merely
    inseparable. Layouts are never counted as seeds: one seed over three layouts is one observation."""
    trials = list(trials)
    ok = [t for t in trials if t.status == "ok"]
    if metric is None:
        metric = quality.metric if quality is not None else next(
            (m for m in ("val_accuracy", "val_loss", "train_loss") if any(_finite(getattr(t, m)) for t in ok)),
            "val_accuracy")
    judged_by = quality if quality is not None and quality.user and metric == quality.metric else QUALITIES.get(metric)
    higher = (judged_by or ACCURACY).higher_is_better if judged_by is not None else False
    figure = judged_by.value if judged_by is not None else (lambda t: getattr(t, metric))
    table: Dict[int, LrRow] = {}
    for batch in sorted({t.global_batch_size for t in trials}):
        at_batch = [t for t in trials if t.global_batch_size == batch]
        tried = sorted({_multiplier(t) for t in at_batch})
        diverged = tuple(m for m in tried if any(t.status == "diverged" and _multiplier(t) == m for t in at_batch))
        means = {m: _mean([figure(t) for t in at_batch if t.status == "ok" and _multiplier(t) == m])
                 for m in tried}
        scored = {m: v for m, v in means.items() if v is not None}
        # Equal figures: the smaller multiplier, the safer LR.
        best = max(scored, key=lambda m: (scored[m] if higher else -scored[m], -m)) if scored else None
        stable = [m for m in tried if m not in diverged and any(t.status == "ok" and _multiplier(t) == m
                                                                 for t in at_batch)]
        judged: Tuple[Tuple[float, Gap], ...] = ()
        if judged_by is not None and best is not None and max_drop is not None:
            def runs(m: float) -> Dict[Any, Trial]:
                return {(t.micro_batch_size, t.accumulation_steps, t.num_workers, parallelism.of(t), t.precision,
                         t.activation_checkpointing, t.context, t.seed): t for t in at_batch if _multiplier(t) == m}
            judged = tuple((m, gap) for m in tried if m != best
                           for gap in [judge_matched(runs(m), runs(best), max_drop, level, judged_by)] if gap)
        table[batch] = LrRow(batch, tuple(tried), metric, best, None if best is None else scored[best],
                             max(stable) if stable else None, diverged, judged)
    return table


def _multiplier(trial: Trial) -> float:
    return 1.0 if trial.lr_multiplier is None else float(trial.lr_multiplier)
