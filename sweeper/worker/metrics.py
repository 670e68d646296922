"""eval.metrics_fn: metrics of the user's own over the whole validation split. Its object turns each batch
into per-sample counts (`update`), which are gathered from every rank and summed over the split before its
`compute` makes the metrics of the totals: an F1 is the split's, never a mean of per-batch F1s. Each
metric's standard error is a bootstrap over the validation samples. Knows torch and numpy only.

What a user writes (docs/configuration.md, `eval.metrics_fn`):

    class F1:
        higher_is_better = {"f1": True}

        def update(self, outputs, batch):  # one entry per sample of the batch
            predicted, labels = outputs.argmax(-1), batch[1]
            return {"tp": (predicted == 1) & (labels == 1), "fp": (predicted == 1) & (labels == 0),
                    "fn": (predicted == 0) & (labels == 1)}

        def compute(self, totals):  # each total summed over every sample, batch and rank
            tp, fp, fn = (float(totals[k]) for k in ("tp", "fp", "fn"))
            return {"f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0}
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from sweeper.worker import collectives as comm
from sweeper.worker.spec import WorkerContext

# Resamples behind each metric's bootstrap standard error: the SE itself then wobbles by about
# 1 / sqrt(2 x 200) = 5 % from one seed of the resampling to another (Efron & Tibshirani 1993, ch. 6:
# 200 is plenty for a standard error, unlike a percentile interval's tails).
RESAMPLES = 200
# The resampling's seed: fixed, so a point's SE does not depend on which rank or run computed it.
BOOTSTRAP_SEED = 0
INTERVAL_METHOD = (f"mean +/- z x its bootstrap standard error over the validation samples ({RESAMPLES} "
                   "resamples)")


def make(path: str) -> Any:
    """The metrics object eval.metrics_fn names (its class, or factory, called with no arguments)."""
    from hydra.utils import get_method

    return get_method(path)()


class Counts:
    """One rank's per-sample counts of its share, one row per sample, in the order scored."""

    def __init__(self, metrics: Any):
        self.metrics = metrics
        self.names: Optional[List[str]] = None
        self.rows: List[np.ndarray] = []

    def add(self, outputs: Any, batch: Any, samples: int) -> None:
        counts = self.metrics.update(outputs, batch)
        if not isinstance(counts, Mapping) or not counts:
            raise TypeError(f"eval.metrics_fn's update returned {type(counts).__name__}: return a non-empty "
                            "{count name: tensor with one entry per sample of the batch}")
        if self.names is None:
            self.names = sorted(counts)
        if sorted(counts) != self.names:
            raise ValueError(f"eval.metrics_fn's update returned counts {sorted(counts)} after {self.names}: "
                             "return the same counts for every batch")
        columns = []
        for name in self.names:
            value = torch.as_tensor(counts[name])
            if value.numel() != samples:
                raise ValueError(f"eval.metrics_fn's count {name!r} has {value.numel()} entries for a batch of "
                                 f"{samples} samples: give one per sample (sum a sample's positions first), so the "
                                 "interval can resample samples")
            columns.append(value.detach().reshape(samples).to("cpu", torch.float64).numpy())
        self.rows.append(np.stack(columns, axis=1))

    def finish(self, ctx: WorkerContext) -> Dict[str, Tuple[float, Optional[float]]]:
        """{metric: (value over the whole split, its bootstrap standard error)}, the same on every rank
        (a collective: every rank calls it)."""
        mine = np.concatenate(self.rows) if self.rows else np.zeros((0, len(self.names or [])))
        gathered = comm.gather_objects((self.names, mine), ctx)
        names = next((n for n, rows in gathered if n is not None), None)
        if names is None:
            return {}
        table = np.concatenate([rows for n, rows in gathered if n is not None])
        values = _compute(self.metrics, names, table.sum(axis=0))
        spread = bootstrap_se(self.metrics, names, table)
        return {name: (value, spread.get(name)) for name, value in values.items()}


def bootstrap_se(metrics: Any, names: List[str], table: np.ndarray, resamples: int = RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> Dict[str, Optional[float]]:
    """Each metric's standard error: the spread of `compute` over `resamples` resamples of the samples
    (rows of `table`) with replacement. Why a bootstrap: a metric of totals (F1, exact match, a WER)
    is a ratio of sums with no standard error in closed form in general, and the samples are what the
    validation set drew; the per-sample counts are all a resample needs. None with fewer than 2 samples."""
    n = len(table)
    if n < 2:
        return {}
    rng = np.random.default_rng(seed)
    draws: Dict[str, List[float]] = {}
    for _ in range(resamples):
        weights = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        for name, value in _compute(metrics, names, weights @ table).items():
            if math.isfinite(value):
                draws.setdefault(name, []).append(value)
    return {name: float(np.std(values, ddof=1)) if len(values) > 1 else None for name, values in draws.items()}


def _compute(metrics: Any, names: List[str], totals: np.ndarray) -> Dict[str, float]:
    out = metrics.compute({name: torch.tensor(total, dtype=torch.float64) for name, total in zip(names, totals)})
    return {str(name): float(value) for name, value in dict(out).items()}
