"""Simulate cross-request (dynamic) batching in front of one model replica, from a measured latency(batch)
curve: per-request latency percentiles, throughput and batch sizes per (max_batch_size, max_wait) setting.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

POLICIES = ("serve", "serve_offloaded", "triton")

# A per-request delay: a constant in seconds, or measured samples to draw from.
Delay = Union[float, Sequence[float]]

# Settings whose slo_rate_rps (or capacity) lie within this fraction of the best count as tied: the
# bisection that finds slo_rate_rps stops at this relative precision.
TIE_TOLERANCE = 0.01


@dataclass(frozen=True)
class LatencyCurve:
    """Service seconds of one batch as a function of its size, from measurements.

    `seconds(b)` interpolates the per-size medians linearly between measured sizes (so a size between
    two powers of two gets a value between theirs), holds the smallest measured value below the
    smallest size, and extrapolates linearly from the last two points above the largest (never with a
    negative slope: a noisy last point must not make bigger batches cheaper). When `samples_seconds`
    are given, `sample(b, rng)` draws a measured sample of the nearest measured size and scales it by
    `seconds(b) / median`, so simulated tails follow the measured spread, not just the median.
    """

    batch_sizes: Tuple[int, ...]
    service_seconds: Tuple[float, ...]
    samples_seconds: Optional[Tuple[Tuple[float, ...], ...]] = None

    def __post_init__(self) -> None:
        sizes, secs = self.batch_sizes, self.service_seconds
        if len(sizes) == 0:
            raise ValueError("batch_sizes is empty: measure at least one batch size")
        if len(sizes) != len(secs):
            raise ValueError(f"batch_sizes has {len(sizes)} entries but service_seconds has {len(secs)}: "
                             "give one service time per batch size")
        if any(not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
            raise ValueError(f"batch_sizes={list(sizes)} must be integers >= 1")
        if any(b2 <= b1 for b1, b2 in zip(sizes, sizes[1:])):
            raise ValueError(f"batch_sizes={list(sizes)} must be strictly increasing (sort them, drop duplicates)")
        if any(not math.isfinite(s) or s <= 0 for s in secs):
            raise ValueError(f"service_seconds={list(secs)} must be finite and > 0")
        if self.samples_seconds is not None:
            if len(self.samples_seconds) != len(sizes):
                raise ValueError(f"samples_seconds has {len(self.samples_seconds)} groups for {len(sizes)} "
                                 "batch sizes: give one group of samples per batch size")
            for b, group in zip(sizes, self.samples_seconds):
                if len(group) == 0 or any(not math.isfinite(s) or s <= 0 for s in group):
                    raise ValueError(f"samples_seconds for batch size {b} must be non-empty, finite and > 0")

    @classmethod
    def from_points(cls, points: Union[Mapping[int, float], Iterable[Tuple[int, float]]]) -> "LatencyCurve":
        """From (batch_size, service_seconds) points, e.g. medians: `{1: 0.0017, 8: 0.0045}`."""
        items = sorted(dict(points).items())
        return cls(tuple(int(b) for b, _ in items), tuple(float(s) for _, s in items))

    @classmethod
    def from_samples(cls, samples: Mapping[int, Sequence[float]]) -> "LatencyCurve":
        """From every timed run per batch size; the median is the curve, the runs its spread."""
        items = sorted(samples.items())
        groups = tuple(tuple(float(s) for s in runs) for _, runs in items)
        if any(len(g) == 0 for g in groups):
            empty = [b for b, runs in items if len(runs) == 0]
            raise ValueError(f"samples for batch sizes {empty} are empty: time each size at least once")
        return cls(tuple(int(b) for b, _ in items), tuple(float(np.median(g)) for g in groups), groups)

    def seconds(self, batch_size: int) -> float:
        """Median service seconds of a batch of `batch_size` requests."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        sizes, secs = self.batch_sizes, self.service_seconds
        if batch_size <= sizes[0]:
            return secs[0]
        if batch_size >= sizes[-1]:
            if len(sizes) == 1:
                return secs[0]
            slope = max(0.0, (secs[-1] - secs[-2]) / (sizes[-1] - sizes[-2]))
            return secs[-1] + slope * (batch_size - sizes[-1])
        return float(np.interp(batch_size, sizes, secs))

    def _relative_spread(self, batch_size: int) -> Optional[np.ndarray]:
        """Measured samples / median at the measured size nearest `batch_size` (None without samples)."""
        if self.samples_seconds is None:
            return None
        nearest = min(range(len(self.batch_sizes)), key=lambda j: (abs(self.batch_sizes[j] - batch_size), j))
        return np.asarray(self.samples_seconds[nearest]) / self.service_seconds[nearest]

    def sample(self, batch_size: int, rng: np.random.Generator) -> float:
        """One service time for a batch of `batch_size`: the median, scaled by a measured relative spread."""
        spread = self._relative_spread(batch_size)
        base = self.seconds(batch_size)
        return base if spread is None else base * float(spread[rng.integers(len(spread))])

    def capacity_rps(self, max_batch_size: int) -> float:
        """Requests per second the device completes when every batch is full: B / service(B)."""
        return max_batch_size / self.seconds(max_batch_size)


def poisson_arrivals(rate_rps: float, num_requests: int, rng: Union[np.random.Generator, int, None] = None,
                     start_seconds: float = 0.0) -> np.ndarray:
    """Arrival times (s) of a Poisson process at `rate_rps`: exponential gaps, first gap included."""
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise ValueError(f"rate_rps={rate_rps} must be a finite rate > 0 requests/s")
    if num_requests < 1:
        raise ValueError(f"num_requests={num_requests} must be >= 1")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return start_seconds + np.cumsum(gen.exponential(1.0 / rate_rps, int(num_requests)))


def trace_arrivals(timestamps_seconds: Sequence[float]) -> np.ndarray:
    """Recorded request timestamps (s) as arrivals: checked finite and sorted (logs merged from several
    clients are often slightly out of order)."""
    times = np.asarray(timestamps_seconds, dtype=float)
    if times.ndim != 1 or times.size == 0:
        raise ValueError(f"timestamps must be a non-empty 1-D sequence of seconds, got shape {times.shape}")
    if not np.all(np.isfinite(times)):
        raise ValueError(f"timestamps contain {int(np.sum(~np.isfinite(times)))} non-finite values")
    return np.sort(times)


def load_trace(path: Union[str, Path]) -> np.ndarray:
    """Arrivals from a text/CSV file: one timestamp in seconds per line (first column of a CSV).
    Blank lines, `#` comments and a non-numeric header on the first line are skipped."""
    values: List[float] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        first = text.split(",", 1)[0].strip()
        try:
            values.append(float(first))
        except ValueError:
            if number == 1:
                continue  # a CSV header such as "timestamp_s"
            raise ValueError(f"{path}:{number}: {first!r} is not a timestamp in seconds") from None
    if not values:
        raise ValueError(f"{path} holds no timestamps: write one time in seconds per line")
    return trace_arrivals(values)


@dataclass(frozen=True)
class SimResult:
    """One simulated setting. Latencies run from the client's send to its answer (path delays included);
    rates are requests per second; `mean_batch_size` is per batch, not per request."""

    policy: str
    max_batch_size: int
    max_wait_seconds: float
    num_requests: int
    offered_rate_rps: float
    throughput_rps: float
    capacity_rps: float
    latency_mean_seconds: float
    latency_p50_seconds: float
    latency_p95_seconds: float
    latency_p99_seconds: float
    busy_fraction: float
    # Device seconds needed per second of arrivals; >= 1 means the queue grows without bound.
    load_factor: float
    mean_batch_size: float
    batch_size_histogram: Dict[int, int]
    # Highest Poisson rate keeping p99 within the SLO (set by sweep_grid when given an SLO).
    slo_rate_rps: Optional[float] = None
    latencies_seconds: np.ndarray = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    batch_sizes: np.ndarray = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    @property
    def stable(self) -> bool:
        return self.load_factor < 1.0


def _check_setting(max_batch_size: int, max_wait_seconds: float, policy: str) -> None:
    if not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size!r} must be an integer >= 1")
    if not (max_wait_seconds >= 0 and math.isfinite(max_wait_seconds)):
        raise ValueError(f"max_wait_seconds={max_wait_seconds!r} must be a finite number >= 0")
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is invalid. Should be one of {POLICIES}.")


def _draw(delay: Delay, key: str, n: int, rng: np.random.Generator) -> Union[float, np.ndarray]:
    """`n` per-request delays: the constant itself, or draws from measured samples."""
    pool = np.atleast_1d(np.asarray(delay, dtype=float))
    if pool.ndim != 1 or pool.size == 0 or not np.all(np.isfinite(pool)) or np.any(pool < 0):
        raise ValueError(f"{key} must be a constant >= 0 or a non-empty sequence of measured seconds >= 0")
    return float(pool[0]) if pool.size == 1 else pool[rng.integers(pool.size, size=n)]


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q))


def simulate(arrivals: Sequence[float], curve: LatencyCurve, max_batch_size: int, max_wait_seconds: float, *,
             policy: str = "serve", inbound_seconds: Delay = 0.0, overhead_seconds: Delay = 0.0,
             sample_service: bool = True, seed: int = 0) -> SimResult:
    """Run the batcher `policy` over `arrivals` (sorted seconds); return latency, throughput, batch sizes.

    The batcher feeds ONE device that runs one batch at a time; `policy` picks the batcher (`_next_batch`
    says how each closes a batch: Ray Serve blocking or offloaded, Triton).

    Latency runs from the request's time in `arrivals` (the client's send) to its answer. The path
    outside the batcher is measured separately (e.g. at low load) and given as a constant or as samples
    drawn once per request:
    - ``inbound_seconds``: client to batcher (handle call, routing, event-loop hops). The path is FIFO: a
      request reaches the batcher no earlier than the one sent before it, so one stalled request (a
      paused router or event loop) holds back every request behind it, and the more so the higher the
      rate. That bunching changes batch sizes and the tail, which a delay added afterwards cannot.
    - ``overhead_seconds``: batch end to the client (response path), added as a pure delay.

    Service times are drawn from the curve's measured spread when it has samples and `sample_service`,
    else its medians.
    """
    times = _checked_arrivals(arrivals, max_batch_size, max_wait_seconds, policy)
    rng = np.random.default_rng(seed)
    n, cap, wait = int(times.size), int(max_batch_size), float(max_wait_seconds)
    # Arrival at the batcher: sent + path delay, never before the request sent ahead of it.
    at_batcher = np.maximum.accumulate(times + _draw(inbound_seconds, "inbound_seconds", n, rng))
    a: List[float] = at_batcher.tolist()

    # Service time per batch size, drawn cheaply: median[k] * spread[k][index].
    median = [0.0] + [curve.seconds(k) for k in range(1, cap + 1)]
    spreads = [None] + [curve._relative_spread(k) if sample_service else None for k in range(1, cap + 1)]
    draws = rng.random(n)

    finish_of = np.empty(n)
    sizes: List[int] = []
    busy = 0.0
    i = 0
    closed = -math.inf  # when the previous batch closed (Serve: the batcher went back to its queue)
    free = -math.inf  # when the device (and, for "serve", the event loop) became free
    while i < n:
        close, start, count = _next_batch(policy, a, i, cap, wait, closed, free)
        spread = spreads[count]
        service = median[count]
        if spread is not None:
            service *= float(spread[int(draws[len(sizes)] * len(spread))])
        free = start + service
        closed = close
        busy += service
        finish_of[i:i + count] = free
        sizes.append(count)
        i += count

    latencies = finish_of - times + _draw(overhead_seconds, "overhead_seconds", n, rng)
    return _result(policy, curve, cap, wait, times, finish_of, latencies, sizes, busy)


def _checked_arrivals(arrivals: Sequence[float], max_batch_size: int, max_wait_seconds: float,
                      policy: str) -> np.ndarray:
    _check_setting(max_batch_size, max_wait_seconds, policy)
    times = np.asarray(arrivals, dtype=float)
    if times.ndim != 1 or times.size == 0:
        raise ValueError("arrivals must be a non-empty 1-D sequence of seconds")
    if not np.all(np.isfinite(times)):
        raise ValueError("arrivals contain non-finite values")
    if np.any(np.diff(times) < 0):
        raise ValueError("arrivals must be sorted: pass them through trace_arrivals() or np.sort first")
    return times


def _next_batch(policy: str, a: List[float], i: int, cap: int, wait: float, closed: float,
                free: float) -> Tuple[float, float, int]:
    """The next batch from request `i` on (arrivals at the batcher `a`): when it closes, when it starts on
    the device, and how many requests it holds. `closed`: when the previous batch closed; `free`: when the
    device became free.

    The batcher feeds ONE device that runs one batch at a time. `policy` picks the batcher:

    * ``"serve"`` -- Ray Serve ``@serve.batch(max_batch_size, batch_wait_timeout_s)`` (ray 2.60,
      ``ray/serve/batching.py``) with the documented handler shape: an ``async def`` that calls the model
      synchronously, so the replica's user-code event loop is blocked while a batch runs.
      - The wait timer starts when the batcher *takes* the first request of the next batch from its queue
        (``batch_start_time`` is set after ``queue.get()``), not when that request arrived. Requests that
        arrive while a batch runs reach the queue only when the loop is free again, so after a busy period
        Serve still waits up to ``max_wait`` for more requests (Triton would launch at once).
      - The batch closes as soon as it holds ``max_batch_size`` requests or the timer expires.
      - Quirk: if requests are left in the queue when a batch closes (it closed full), the batcher takes
        the next one at once and starts its timer *before* the closed batch runs. If the batch's service
        time >= ``max_wait``, that next batch therefore closes as soon as the loop is free again, holding
        only the left-over requests: those that arrived during the run are enqueued after it closed and
        wait one more batch. (Checked against Serve 2.60 with a sleeping handler, B=2, W=0.1 s.)
    * ``"serve_offloaded"`` -- the same decorator, but the handler awaits the model off the event loop
      (``await asyncio.to_thread(...)``), with ``max_concurrent_batches=1`` (the default). The batch loop
      never waits for the device: a batch closes at ``min(take + max_wait, max_batch_size-th request)``,
      then queues (FIFO, on Serve's semaphore) for the device, and the next batch starts forming at once.
      Batches do not grow to absorb a backlog, so under load they stay small and capacity can collapse.
      ``max_concurrent_batches > 1`` would time-share the one device; that is not modelled.
    * ``"triton"`` -- Triton's dynamic batcher with ``max_queue_delay``: when the device is free, launch
      as soon as ``max_batch_size`` requests are queued or the *oldest* queued request has waited
      ``max_wait`` since it arrived; the batch takes everything queued, up to ``max_batch_size``.
    """
    full_at = a[i + cap - 1] if i + cap - 1 < len(a) else math.inf  # arrival of the request that fills the batch
    if policy == "triton":
        close = max(free, min(full_at, a[i] + wait))
        return close, close, min(cap, bisect.bisect_right(a, close, i) - i)
    if policy == "serve_offloaded":
        take = max(closed, a[i])
        close = min(take + wait, max(take, full_at))
        return close, max(close, free), min(cap, bisect.bisect_right(a, close, i) - i)
    # serve, blocking handler
    if a[i] <= closed and closed + wait <= free:
        # Left-over requests, timer started when the previous batch closed and already expired:
        # the batch closes as soon as the loop is free, without what arrived during the run.
        return free, free, min(cap, bisect.bisect_right(a, closed, i) - i)
    take = closed if a[i] <= closed else max(free, a[i])
    close = min(take + wait, max(free, full_at))
    close = max(close, free)
    return close, close, min(cap, bisect.bisect_right(a, close, i) - i)


def _result(policy: str, curve: LatencyCurve, cap: int, wait: float, times: np.ndarray, finish_of: np.ndarray,
            latencies: np.ndarray, sizes: List[int], busy: float) -> SimResult:
    n = int(times.size)
    inf = math.inf
    span = float(finish_of.max() - times[0])
    arrival_span = float(times[-1] - times[0])
    batch_sizes = np.asarray(sizes, dtype=int)
    counts = np.bincount(batch_sizes)
    return SimResult(
        policy=policy,
        max_batch_size=cap,
        max_wait_seconds=wait,
        num_requests=n,
        offered_rate_rps=(n - 1) / arrival_span if arrival_span > 0 else inf,
        throughput_rps=n / span if span > 0 else inf,
        capacity_rps=curve.capacity_rps(cap),
        latency_mean_seconds=float(latencies.mean()),
        latency_p50_seconds=_percentile(latencies, 50),
        latency_p95_seconds=_percentile(latencies, 95),
        latency_p99_seconds=_percentile(latencies, 99),
        busy_fraction=busy / span if span > 0 else 1.0,
        load_factor=busy / arrival_span if arrival_span > 0 else inf,
        mean_batch_size=float(batch_sizes.mean()),
        batch_size_histogram={int(k): int(c) for k, c in enumerate(counts) if c},
        latencies_seconds=latencies,
        batch_sizes=batch_sizes,
    )


def slo_rate(curve: LatencyCurve, max_batch_size: int, max_wait_seconds: float, slo_p99_seconds: float, *,
             from_rate_rps: float, policy: str = "serve", inbound_seconds: Delay = 0.0,
             overhead_seconds: Delay = 0.0, num_requests: int = 4000, seed: int = 0) -> Optional[float]:
    """Highest Poisson rate >= `from_rate_rps` at which the simulated p99 stays within the SLO.

    Bisection between `from_rate_rps` and the capacity, on one seeded set of exponential gaps rescaled
    per rate (common random numbers, so p99 moves smoothly with the rate). It assumes p99 only grows with
    the rate above `from_rate_rps`; below it batching can make p99 *fall* with the rate (batches fill
    before the timer), which is why the search starts at the current load. None if the SLO is missed
    already at `from_rate_rps`.
    """
    gaps = np.random.default_rng(seed).exponential(1.0, num_requests)
    shape = np.cumsum(gaps)

    def meets(rate: float) -> bool:
        result = simulate(shape / rate, curve, max_batch_size, max_wait_seconds, policy=policy,
                          inbound_seconds=inbound_seconds, overhead_seconds=overhead_seconds, seed=seed)
        return result.stable and result.latency_p99_seconds <= slo_p99_seconds

    low = float(from_rate_rps)
    if not meets(low):
        return None
    high = curve.capacity_rps(max_batch_size)
    if high <= low:
        return low
    if meets(high):
        return high
    while high - low > TIE_TOLERANCE / 2 * low:
        mid = 0.5 * (low + high)
        if meets(mid):
            low = mid
        else:
            high = mid
    return low


def sweep_grid(arrivals: Sequence[float], curve: LatencyCurve, max_batch_sizes: Iterable[int],
               max_waits_seconds: Iterable[float], *, policy: str = "serve", inbound_seconds: Delay = 0.0,
               overhead_seconds: Delay = 0.0, slo_p99_seconds: Optional[float] = None,
               seed: int = 0) -> List[SimResult]:
    """`simulate` every (max_batch_size, max_wait) pair on the same arrivals and service draws.
    With `slo_p99_seconds`, each setting that meets it also gets `slo_rate_rps` (see `slo_rate`): the
    headroom is estimated for Poisson traffic above the arrivals' rate, whatever their own pattern."""
    waits = list(max_waits_seconds)
    results = []
    for size in max_batch_sizes:
        for wait in waits:
            result = simulate(arrivals, curve, size, wait, policy=policy, inbound_seconds=inbound_seconds,
                              overhead_seconds=overhead_seconds, seed=seed)
            if slo_p99_seconds is not None and result.stable and result.latency_p99_seconds <= slo_p99_seconds:
                rate = slo_rate(curve, size, wait, slo_p99_seconds, from_rate_rps=result.offered_rate_rps,
                                policy=policy, inbound_seconds=inbound_seconds,
                                overhead_seconds=overhead_seconds, seed=seed)
                # It met the SLO on these arrivals, so it sustains at least their rate even when a Poisson
                # stream of the same rate (slo_rate's own draws) happens to miss.
                result = replace(result, slo_rate_rps=rate if rate is not None else result.offered_rate_rps)
            results.append(result)
    return results


@dataclass(frozen=True)
class Recommendation:
    """The chosen setting (None if no setting meets the SLO) and why."""

    result: Optional[SimResult]
    reason: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def recommend(results: Sequence[SimResult], slo_p99_seconds: float) -> Recommendation:
    """Among stable settings whose p99 meets the SLO at the simulated load, the one with the most
    headroom: highest `slo_rate_rps` when every candidate has one (from `sweep_grid` with the SLO),
    else highest `capacity_rps`. Within `TIE_TOLERANCE` of the best, the lower p99 wins.

    "Maximise throughput under a p99 SLO" needs care: with an open-loop arrival process every stable
    setting completes requests at the arrival rate, so throughput at a given load does not separate
    settings. What separates them is headroom: `sweep_grid(..., slo_p99_seconds=...)` also finds, per
    setting, the highest Poisson rate at which the p99 still meets the SLO (``slo_rate_rps``, what Triton's
    Model Analyzer reports as throughput under a latency constraint), and `recommend` picks the setting
    that meets the SLO at the given load with the highest such rate (ties: lower p99). Without it,
    `recommend` ranks by ``capacity_rps = max_batch_size / service(max_batch_size)``, the most the device
    can complete with full batches.
    """
    if not (slo_p99_seconds > 0):
        raise ValueError(f"slo_p99_seconds={slo_p99_seconds!r} must be > 0")
    if not results:
        return Recommendation(None, "no results to choose from: run sweep_grid first")
    candidates = [r for r in results if r.stable and r.latency_p99_seconds <= slo_p99_seconds]
    if not candidates:
        stable = [r for r in results if r.stable]
        if not stable:
            best = min(results, key=lambda r: r.load_factor)
            return Recommendation(None, f"every setting is overloaded at {best.offered_rate_rps:.0f} req/s (best "
                                        f"capacity {max(r.capacity_rps for r in results):.0f} req/s): add replicas "
                                        "or allow larger batches")
        best = min(stable, key=lambda r: r.latency_p99_seconds)
        return Recommendation(None, f"no setting meets p99 <= {_ms(slo_p99_seconds)}: the best is "
                                    f"max_batch_size={best.max_batch_size}, max_wait={_ms(best.max_wait_seconds)} "
                                    f"with p99 {_ms(best.latency_p99_seconds)}")
    by_slo_rate = all(r.slo_rate_rps is not None for r in candidates)

    def headroom(r: SimResult) -> float:
        return r.slo_rate_rps if by_slo_rate else r.capacity_rps  # type: ignore[return-value]

    top = max(headroom(r) for r in candidates)
    tied = [r for r in candidates if headroom(r) >= top * (1 - TIE_TOLERANCE)]
    best = min(tied, key=lambda r: (r.latency_p99_seconds, r.max_batch_size, r.max_wait_seconds))
    measure = (f"keeps the SLO up to {best.slo_rate_rps:.0f} req/s" if by_slo_rate
               else f"capacity {best.capacity_rps:.0f} req/s with full batches")
    return Recommendation(best, f"max_batch_size={best.max_batch_size}, max_wait={_ms(best.max_wait_seconds)}: "
                                f"p99 {_ms(best.latency_p99_seconds)} <= SLO {_ms(slo_p99_seconds)} at "
                                f"{best.offered_rate_rps:.0f} req/s; {measure} "
                                f"({len(candidates)} of {len(results)} settings meet the SLO)")
