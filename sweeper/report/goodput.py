"""Goodput: how fast a layout makes progress towards the target, not only how many samples per second it trains
(Pollux, Qiao et al. OSDI'21; COPUS 2026 ranks layouts by it). Pure (stdlib).

A global batch B needs E(B) = E_min (1 + B / B_noise) samples (and S(B) = S_min (1 + B_noise / B) steps) to
reach a target (McCandlish et al. 2018: (S/S_min - 1)(E/E_min - 1) = 1, with the critical batch size ~ the
gradient noise scale B_noise). Relative to a base batch B0 its statistical efficiency is Pollux's

    efficiency(B) = E(B0) / E(B) = (B_noise + B0) / (B_noise + B),

goodput = throughput x efficiency, and the predicted time to the target is E(B) / throughput (plus the
evaluations on the way, at their measured cost per sample trained). E(B0) is the anchor: the samples to the
target the sweep measured at one global batch; without one, layouts are still ranked (by goodput) but no
samples or seconds are predicted.

B_noise is the branches' critical batch size where it flattens when sweep.strategy=branch ran (measured late in
training), else the mean gradient noise scale B_simple the points measured. A noise scale measured early in a
short sweep understates the critical batch size later in training (UNDERSTATES): a prediction from it favours
small global batches, and never replaces the recommendation the data certify.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

UNDERSTATES = ("the gradient noise scale measured early in a short sweep understates the critical batch size later "
               "in training (it grows as the loss falls: McCandlish et al. 2018, 4.1; Merrill et al. 2025), so these "
               "predictions tend to favour small global batches; they never replace the recommendation the data "
               "certify")


@dataclass(frozen=True)
class NoiseScale:
    """The B_noise the efficiencies use, and where it comes from, in words."""

    value: float
    source: str


def noise_scale(b_simple_mean: Optional[float], branch_critical: Optional[float] = None) -> Optional[NoiseScale]:
    """The branches' flat critical batch size when there is one, else the points' mean B_simple; None without
    either (or with a value that is not positive)."""
    if branch_critical is not None and branch_critical > 0:
        return NoiseScale(float(branch_critical), "the branches' critical batch size where it flattens "
                                                  "(sweep.strategy=branch)")
    if b_simple_mean is not None and b_simple_mean > 0:
        return NoiseScale(float(b_simple_mean), "the points' mean gradient noise scale B_simple")
    return None


def efficiency(global_batch: float, b_noise: float, base_batch: float) -> float:
    """Pollux's statistical efficiency of `global_batch` relative to `base_batch`: the samples the base needs
    to the target over the samples this batch needs (1 at the base, below 1 above it)."""
    return (b_noise + base_batch) / (b_noise + global_batch)


@dataclass(frozen=True)
class Anchor:
    """The samples to the target measured at one global batch: what turns efficiencies into samples."""

    global_batch: int
    samples: float
    key: str


def samples_to_target(global_batch: float, b_noise: float, anchor: Anchor) -> float:
    """E(B) = E(B0) / efficiency(B) with B0 the anchor's global batch."""
    return anchor.samples / efficiency(global_batch, b_noise, anchor.global_batch)


@dataclass(frozen=True)
class Candidate:
    """A layout to rank: its throughput (measured or predicted, said in `throughput_from`), and what the sweep
    measured of its way to the target (None where it did not reach it in every seed)."""

    key: str
    global_batch: int
    samples_per_second: float
    throughput_from: str = "measured"
    eval_seconds_per_sample: float = 0.0  # the evaluations' cost spread over the samples trained
    measured_seconds: Optional[float] = None
    measured_samples: Optional[float] = None


@dataclass(frozen=True)
class Ranked:
    candidate: Candidate
    efficiency: float
    goodput: float  # samples/s x efficiency: base-batch samples of progress per second
    predicted_samples: Optional[float]
    predicted_seconds: Optional[float]


def rank(candidates: Sequence[Candidate], noise: NoiseScale, anchor: Optional[Anchor] = None,
         base_batch: Optional[int] = None) -> List[Ranked]:
    """Every candidate, the highest goodput (the shortest predicted time to the target) first. The efficiencies
    are relative to `base_batch` (default: the anchor's global batch, else the smallest candidate's)."""
    if not candidates:
        return []
    base = base_batch or (anchor.global_batch if anchor else min(c.global_batch for c in candidates))
    out = []
    for c in candidates:
        eff = efficiency(c.global_batch, noise.value, base)
        samples = None if anchor is None else samples_to_target(c.global_batch, noise.value, anchor)
        seconds = None if samples is None else samples * (1 / c.samples_per_second + c.eval_seconds_per_sample)
        out.append(Ranked(c, eff, c.samples_per_second * eff, samples, seconds))
    return sorted(out, key=lambda r: (-r.goodput if r.predicted_seconds is None else r.predicted_seconds,
                                      r.candidate.key))


def spearman(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation of two equally long sequences (ties get their mean rank); None with fewer
    than three pairs or a sequence whose values are all equal."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def measured_agreement(ranked: Sequence[Ranked]) -> Optional[float]:
    """The rank correlation of the predicted and the measured times to the target over the candidates that
    reached it (None: fewer than three, or no prediction in seconds)."""
    both = [(r.predicted_seconds, r.candidate.measured_seconds) for r in ranked
            if r.predicted_seconds is not None and r.candidate.measured_seconds is not None]
    return spearman([p for p, _ in both], [m for _, m in both]) if both else None
