"""The memory frontier: the largest micro-batch whose training step fits a memory budget, from a linear
memory model (peak = fixed + per-sample x micro-batch) fitted to a few probes, then one verification.

Pure arithmetic (standard library, sweeper.plan and frontier.* from sweeper.config): which size to probe
next, the fit, and how a global batch is reached with the largest micro-batch that fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from sweeper.config import FrontierConfig, check_frontier
from sweeper.plan import DEFAULT_CHECKPOINTING, DEFAULT_PARALLELISM, DEFAULT_PRECISION, GridPoint

_KNOBS = FrontierConfig()


@dataclass(frozen=True)
class Probe:
    """A few training steps at one micro-batch size: their peak memory, or None if out of memory."""

    micro_batch_size: int
    peak_bytes: Optional[float]
    role: str  # "fit" (to fit the model) | "verify" (the predicted frontier, checked)

    @property
    def fits(self) -> bool:
        return self.peak_bytes is not None


@dataclass(frozen=True)
class MemoryModel:
    """peak_bytes = fixed_bytes + per_sample_bytes x micro_batch_size (seed 001: activations are linear
    in the batch; parameters, gradients and optimizer state are not). Least squares over the probes
    that fit; `r_squared` and `max_relative_residual` say how well the line explains them (with two
    probes the line is exact and both are trivially perfect)."""

    fixed_bytes: float
    per_sample_bytes: float
    num_points: int
    r_squared: float
    max_relative_residual: float

    def predict(self, micro_batch_size: float) -> float:
        return self.fixed_bytes + self.per_sample_bytes * micro_batch_size

    def largest_fitting(self, budget_bytes: float) -> int:
        """The largest micro-batch the line puts at or under the budget (0: not even one sample)."""
        if self.per_sample_bytes <= 0:
            return math.inf  # type: ignore[return-value]  # memory does not grow: no frontier
        return max(0, math.floor((budget_bytes - self.fixed_bytes) / self.per_sample_bytes))


def fit(points: Sequence[Tuple[float, float]]) -> MemoryModel:
    """The least-squares line through (micro_batch_size, peak_bytes) points, two distinct sizes at least."""
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    if len(set(xs)) < 2:
        raise ValueError(f"fit needs peaks at two different micro-batch sizes at least, got sizes {sorted(set(xs))}")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys)]
    total = sum((y - my) ** 2 for y in ys)
    r_squared = 1.0 - sum(r * r for r in residuals) / total if total > 0 else 1.0
    worst = max(abs(r) / y for r, y in zip(residuals, ys)) if all(y > 0 for y in ys) else 0.0
    return MemoryModel(intercept, slope, n, r_squared, worst)


@dataclass
class Frontier:
    """What the search found: `micro_batch_size` is the largest size verified to fit (0: none fits)."""

    micro_batch_size: int
    budget_bytes: float
    probes: List[Probe]
    model: Optional[MemoryModel]
    predicted_micro_batch_size: Optional[int]  # the line's answer before verification
    # Why the search stopped where it did, for the record ("verified", "capped by the data", ...).
    reason: str

    @property
    def num_fit_probes(self) -> int:
        return sum(p.role == "fit" for p in self.probes)

    @property
    def num_verifications(self) -> int:
        return sum(p.role == "verify" for p in self.probes)


@dataclass
class FrontierSearch:
    """Which micro-batch to run next: `next_size()`, then `record(size, peak_bytes or None)`, until
    `next_size()` is None and `result()` holds the frontier.

    1. Fit probes: `first_probe`, then `first_probe x growth` (halving after an out-of-memory), then
       a third at half the predicted frontier when the line would otherwise extrapolate more than 2x
       past its largest probe. Predictions follow the secant of the two largest probes that fit, or,
       when three show memory bending upward, the parabola through them.
    2. Verification: the predicted frontier (rounded down to `multiple_of`, capped at `upper`). If it
       runs out of memory, step down by `step_down` of the size and verify again; if it fits with
       room the refitted line says a larger size fits, verify that. At most `max_verifications`.

    The answer is always a size that ran and fit, never an extrapolation.
    """

    budget_bytes: float
    # frontier.* (config/sweep.py holds their defaults and rules, once)
    first_probe: int = _KNOBS.first_probe
    growth: int = _KNOBS.growth
    max_fit_probes: int = _KNOBS.max_fit_probes
    max_verifications: int = _KNOBS.max_verifications
    multiple_of: int = _KNOBS.multiple_of
    step_down: float = 0.05
    # The largest micro-batch that can be run at all (the data a worker gets per step): no probe exceeds it.
    upper: Optional[int] = None
    probes: List[Probe] = field(default_factory=list)
    _pending: Optional[Tuple[int, str]] = None
    _result: Optional[Frontier] = None
    _predicted: Optional[int] = None

    def __post_init__(self) -> None:
        knobs = FrontierConfig(first_probe=self.first_probe, growth=self.growth, max_fit_probes=self.max_fit_probes,
                               max_verifications=self.max_verifications, multiple_of=self.multiple_of)
        problems = check_frontier(knobs)
        if problems:
            raise ValueError("; ".join(problems))
        if self.budget_bytes <= 0:
            raise ValueError(f"budget_bytes={self.budget_bytes}: must be positive")

    # -- the protocol --------------------------------------------------------------------------
    def next_size(self) -> Optional[int]:
        if self._result is not None:
            return None
        if self._pending is None:
            self._pending = self._decide()
        return None if self._pending is None else self._pending[0]

    @property
    def pending_role(self) -> Optional[str]:
        """The role of the size `next_size()` asked for: "fit" or "verify"."""
        return None if self._pending is None else self._pending[1]

    def record(self, micro_batch_size: int, peak_bytes: Optional[float]) -> None:
        if self._pending is None or self._pending[0] != micro_batch_size:
            raise ValueError(f"recorded micro-batch {micro_batch_size}, but the search asked for {self._pending}")
        # A peak over the budget is an out-of-memory, whoever measured it (a GPU allocator's
        # rounding, a budget enforced elsewhere): the answer must stay under the budget.
        if peak_bytes is not None and peak_bytes > self.budget_bytes:
            peak_bytes = None
        self.probes.append(Probe(micro_batch_size, peak_bytes, self._pending[1]))
        self._pending = None

    def result(self) -> Frontier:
        if self._result is None:
            raise RuntimeError("the search is not finished: call next_size() until it returns None")
        return self._result

    # -- the decisions -------------------------------------------------------------------------
    def _decide(self) -> Optional[Tuple[int, str]]:
        ok = sorted(p.micro_batch_size for p in self.probes if p.fits)
        oom = sorted(p.micro_batch_size for p in self.probes if not p.fits)
        lo = ok[-1] if ok else 0
        hi = min(oom) if oom else None  # the smallest size known not to fit
        fit_probes = [p for p in self.probes if p.role == "fit"]
        verifications = [p for p in self.probes if p.role == "verify"]
        cap = self.upper if self.upper is not None else math.inf

        if not verifications:
            if not self.probes:
                return self._probe(min(self.first_probe, cap), "fit")
            if len(ok) < 2:
                if len(fit_probes) >= self.max_fit_probes + 2:  # halving did not find two that fit
                    return self._finish("too few probes fit to fit a line", lo)
                if not ok:
                    if oom[0] == 1:
                        return self._finish("a micro-batch of 1 does not fit the budget", 0)
                    return self._probe(oom[0] // 2, "fit")
                if hi is not None:
                    # One size fits and a larger one does not: the line's second point comes from
                    # below, where it is sure to fit.
                    if lo == 1:
                        if hi > 2:
                            return self._probe((lo + hi) // 2, "fit")
                        return self._finish("verified (a micro-batch of 2 does not fit)", lo)
                    return self._probe(lo // 2, "fit")
                grown = min(lo * self.growth, cap)
                if grown <= lo:
                    return self._finish("capped: the largest micro-batch the data allows fits", lo)
                return self._probe(grown, "fit")
            model = self._model()
            predicted = self._predict(model, cap, hi)
            if len(fit_probes) < self.max_fit_probes and predicted > 2 * lo:
                # Far extrapolation: one more point near the frontier catches a bend in the line.
                return self._probe(max(lo + 1, predicted // 2), "fit")
            self._predicted = predicted
            if predicted <= lo:
                return self._finish("verified (a fit probe is already at the frontier)", lo)
            return self._probe(predicted, "verify")

        last = verifications[-1]
        if len(verifications) >= self.max_verifications:
            return self._finish("verified" if last.fits and last.micro_batch_size == lo else
                                "largest size that fit within the verification limit", lo)
        if not last.fits:
            down = self._round(min(last.micro_batch_size - 1, math.floor(last.micro_batch_size * (1 - self.step_down))))
            if down <= lo:
                return self._finish("verified (stepped down to a size that fit)", lo)
            return self._probe(down, "verify")
        # It fits: does the refitted line say a clearly larger size fits too?
        again = self._predict(self._model(), cap, hi)
        if again >= last.micro_batch_size * (1 + self.step_down) and again > lo:
            return self._probe(again, "verify")
        if last.micro_batch_size >= cap:
            return self._finish("capped: the largest micro-batch the data allows fits", lo)
        return self._finish("verified", lo)

    def _model(self) -> MemoryModel:
        return fit([(p.micro_batch_size, p.peak_bytes) for p in self.probes if p.fits])

    def _predict(self, model: MemoryModel, cap: float, hi: Optional[int]) -> int:
        # Extrapolate along the two largest sizes that fit: where memory bends upward (a workspace
        # that grows with the batch) their secant is the line's best guess near the frontier; the
        # least-squares line over all probes is what is reported, with its fit quality.
        fitting = sorted({p.micro_batch_size: p.peak_bytes for p in self.probes if p.fits}.items())
        predicted = _convex_frontier(fitting[-3:], self.budget_bytes) if len(fitting) >= 3 else None
        if predicted is None:
            if len(fitting) >= 2:
                model = fit(fitting[-2:])
            predicted = model.largest_fitting(self.budget_bytes)
        predicted = min(predicted, cap)
        if hi is not None:
            predicted = min(predicted, hi - 1)
        return self._round(int(predicted))

    def _round(self, size: int) -> int:
        if size >= self.multiple_of:
            return size // self.multiple_of * self.multiple_of
        return max(size, 0)

    def _probe(self, size: int, role: str) -> Tuple[int, str]:
        return (int(size), role)

    def _finish(self, reason: str, size: int) -> None:
        fitting = [p for p in self.probes if p.fits]
        model = self._model() if len({p.micro_batch_size for p in fitting}) >= 2 else None
        self._result = Frontier(size, self.budget_bytes, list(self.probes), model, self._predicted, reason)
        return None


def _convex_frontier(points: Sequence[Tuple[float, float]], budget_bytes: float) -> Optional[int]:
    """Where the parabola through three (size, peak) points reaches the budget, if it bends upward
    (per-sample memory growing with the batch); None if it does not (the secant is then safe)."""
    (x0, y0), (x1, y1), (x2, y2) = points
    slope01, slope12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    a = (slope12 - slope01) / (x2 - x0)
    if a <= 0:
        return None
    b = slope01 - a * (x0 + x1)
    c = y0 - a * x0 * x0 - b * x0
    disc = b * b - 4 * a * (c - budget_bytes)
    if disc < 0:
        return 0
    return max(0, math.floor((-b + math.sqrt(disc)) / (2 * a)))


def accumulation_for(
    global_batch_size: int,
    num_workers: int,
    largest: int,
    largest_accumulating: Optional[int] = None,
) -> Optional[Tuple[int, int]]:
    """(micro_batch_size, accumulation_steps) reaching `global_batch_size` on `num_workers` with the
    fewest accumulation steps whose micro-batch fits, so that micro x accumulation x workers is exactly
    the global batch. `largest` is the frontier without accumulation; `largest_accumulating` the one
    with it (accumulated gradients live beside the next micro-batch's activations, so it is lower;
    None: take `largest`). None if the global batch does not split evenly over the workers or not
    even a micro-batch of 1 fits."""
    if global_batch_size % num_workers:
        return None
    share = global_batch_size // num_workers
    if 1 <= share <= largest:
        return share, 1
    limit = largest if largest_accumulating is None else largest_accumulating
    if limit < 1:
        return None
    for steps in range(2, share + 1):
        if share % steps == 0 and share // steps <= limit:
            return share // steps, steps
    return None


def needs_accumulating(
    largest: int, num_workers: int, accumulation_steps: Sequence[int], global_batch_sizes: Optional[Sequence[int]]
) -> bool:
    """Whether the grid built from a frontier of `largest` has points with accumulation, whose own
    frontier must then be found."""
    if global_batch_sizes:
        return any(g % num_workers == 0 and g // num_workers > largest for g in global_batch_sizes)
    return any(a > 1 for a in accumulation_steps)


def frontier_grid(max_micro_batch_size: int, fractions: Sequence[int] = (4, 2, 1)) -> List[int]:
    """Micro-batch sizes to sweep below a frontier: the frontier and its halves (no duplicates, >= 1)."""
    if max_micro_batch_size < 1:
        return []
    return sorted({max(1, max_micro_batch_size // f) for f in fractions})


def with_margin(micro_batch_size: int, margin: float, multiple_of: int = 1) -> int:
    """`micro_batch_size` less `margin` (a share), rounded down to `multiple_of`, at least 1 when the
    frontier was at least 1: the size a grid trains with below the largest that fit."""
    if micro_batch_size < 1:
        return micro_batch_size
    safe = math.floor(micro_batch_size * (1 - margin))
    safe -= safe % multiple_of
    return max(1, safe)


def grid_from_frontiers(
    frontiers: Dict[int, Tuple[int, Optional[int]]],
    accumulation_steps: Sequence[int],
    global_batch_sizes: Optional[Sequence[int]] = None,
    recipe: Tuple[str, str] = (DEFAULT_PRECISION, DEFAULT_CHECKPOINTING),
    parallelism: str = DEFAULT_PARALLELISM,
) -> Tuple[List[GridPoint], List[str]]:
    """The grid `sweep.micro_batch_sizes=auto` measures, from each worker count's frontiers
    (without accumulation, with accumulation or None when not searched) in one recipe (precision,
    checkpointing: the points' own) and one `parallelism`.

    With global batch sizes: each (global batch, workers) with the fewest accumulation steps whose
    micro-batch fits (the list of accumulation steps is not used: it is derived). Without: each
    frontier and its halves, crossed with the accumulation steps. Returns the points and, for what
    cannot be reached, one line each saying why."""
    points: List[GridPoint] = []
    skipped: List[str] = []
    for workers, (largest, accumulating) in sorted(frontiers.items()):
        if largest < 1:
            skipped.append(f"{workers} worker(s): not even a micro-batch of 1 fits the budget")
            continue
        if global_batch_sizes:
            for global_batch in global_batch_sizes:
                split = accumulation_for(global_batch, workers, largest, accumulating)
                if split is None:
                    why = "does not split evenly over the workers" if global_batch % workers else \
                        "needs accumulation, and not even a micro-batch of 1 fits with it"
                    skipped.append(f"global batch {global_batch} on {workers} worker(s): it {why}")
                    continue
                points.append(GridPoint(split[0], split[1], workers, *recipe, parallelism=parallelism))
        else:
            for accum in accumulation_steps:
                limit = largest if accum == 1 or accumulating is None else accumulating
                for micro in frontier_grid(limit):
                    points.append(GridPoint(micro, int(accum), workers, *recipe, parallelism=parallelism))
    unique = list(dict.fromkeys(points))
    return unique, skipped
