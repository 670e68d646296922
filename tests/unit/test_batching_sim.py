"""Cross-request batching simulator: exact answers on hand-built arrivals, M/D/1 against
Pollaczek-Khinchine, Ray Serve's batching semantics, and the SLO recommendation. No processes."""

import numpy as np
import pytest

from sweeper.inference.batching_sim import (
    POLICIES,
    LatencyCurve,
    load_trace,
    poisson_arrivals,
    recommend,
    simulate,
    sweep_grid,
    trace_arrivals,
)


def constant(seconds: float) -> LatencyCurve:
    return LatencyCurve.from_points({1: seconds})


# --- the latency curve ---------------------------------------------------------------------------


def test_curve_interpolates_between_measured_sizes_and_extrapolates_from_the_last_two():
    curve = LatencyCurve.from_points({1: 1.0, 4: 2.0, 8: 4.0})
    assert curve.seconds(1) == 1.0
    assert curve.seconds(2) == pytest.approx(1 + 1 / 3)
    assert curve.seconds(6) == pytest.approx(3.0)
    assert curve.seconds(16) == pytest.approx(4.0 + 0.5 * 8)
    assert curve.capacity_rps(8) == pytest.approx(2.0)


def test_curve_holds_the_smallest_value_below_and_never_falls_beyond_the_largest():
    assert LatencyCurve.from_points({2: 1.0, 4: 2.0}).seconds(1) == 1.0
    # A noisy last point (64 faster than 32) must not make bigger batches cheaper.
    assert LatencyCurve.from_points({32: 2.0, 64: 1.5}).seconds(128) == 1.5


def test_curve_from_samples_uses_the_median_and_draws_the_measured_spread():
    curve = LatencyCurve.from_samples({1: [1.0, 1.0, 1.0, 3.0], 8: [2.0, 2.0, 2.0]})
    assert curve.seconds(1) == 1.0
    draws = np.array([curve.sample(1, np.random.default_rng(s)) for s in range(400)])
    assert set(np.unique(draws)) == {1.0, 3.0}
    assert 0.15 < np.mean(draws == 3.0) < 0.35
    # Size 2 takes the spread of its nearest measured size (1), scaled to its interpolated median.
    assert curve.sample(2, np.random.default_rng(0)) in {curve.seconds(2), 3 * curve.seconds(2)}


@pytest.mark.parametrize("kwargs, key", [
    (dict(batch_sizes=(), service_seconds=()), "batch_sizes"),
    (dict(batch_sizes=(1, 2), service_seconds=(1.0,)), "service_seconds"),
    (dict(batch_sizes=(4, 2), service_seconds=(1.0, 2.0)), "strictly increasing"),
    (dict(batch_sizes=(1,), service_seconds=(0.0,)), "service_seconds"),
])
def test_curve_rejects_bad_points_and_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LatencyCurve(**kwargs)


# --- arrivals ------------------------------------------------------------------------------------


def test_poisson_arrivals_are_seeded_and_have_the_requested_rate():
    a = poisson_arrivals(200.0, 50_000, 7)
    assert np.array_equal(a, poisson_arrivals(200.0, 50_000, 7))
    assert np.all(np.diff(a) >= 0)
    assert (len(a) - 1) / (a[-1] - a[0]) == pytest.approx(200.0, rel=0.02)


def test_load_trace_reads_one_timestamp_per_line_with_header_comments_and_csv_columns(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("timestamp_s,client\n0.5,a\n\n# a comment\n0.25,b\n1.0  # late\n")
    assert load_trace(path).tolist() == [0.25, 0.5, 1.0]
    path.write_text("0.1\nfoo\n")
    with pytest.raises(ValueError, match=":2:"):
        load_trace(path)
    with pytest.raises(ValueError, match="non-finite"):
        trace_arrivals([0.0, float("nan")])


# --- known answers -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_periodic_arrivals_with_constant_service_give_exact_latencies(policy):
    # One request every second, service 0.25 s, B=4, W=0.5 s: each request waits the full 0.5 s
    # for company that never comes, then runs alone.
    arrivals = np.arange(20, dtype=float)
    result = simulate(arrivals, constant(0.25), 4, 0.5, policy=policy)
    assert np.allclose(result.latencies_seconds, 0.75)
    assert result.batch_size_histogram == {1: 20}
    assert result.busy_fraction == pytest.approx(20 * 0.25 / 19.75)


@pytest.mark.parametrize("policy", POLICIES)
def test_max_batch_size_1_with_poisson_arrivals_matches_the_md1_mean(policy):
    # M/D/1, Pollaczek-Khinchine: mean wait = rho * D / (2 (1 - rho)); latency = wait + D.
    service, rate = 1.0, 0.6
    rho = rate * service
    expected = service + rho * service / (2 * (1 - rho))
    result = simulate(poisson_arrivals(rate, 60_000, 3), constant(service), 1, 0.0, policy=policy)
    assert result.latency_mean_seconds == pytest.approx(expected, rel=0.03)
    assert result.mean_batch_size == 1.0
    assert result.throughput_rps == pytest.approx(rate, rel=0.02)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_partial_batch_launches_max_wait_after_its_first_request(policy):
    result = simulate([0.0, 0.1, 0.2], constant(0.1), 8, 0.5, policy=policy)
    assert np.allclose(result.latencies_seconds, [0.6, 0.5, 0.4])
    assert result.batch_size_histogram == {3: 1}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_full_batch_launches_when_its_last_request_arrives(policy):
    arrivals = [0.0, 0.01, 0.02, 0.03]
    result = simulate(arrivals, LatencyCurve.from_points({1: 0.1, 4: 0.2}), 4, 10.0, policy=policy)
    assert np.allclose(result.latencies_seconds, 0.03 + 0.2 - np.array(arrivals))
    assert result.batch_size_histogram == {4: 1}


@pytest.mark.parametrize("policy, expected", [
    # Triton: the two requests queued behind the busy device waited past W, so they go at once.
    ("triton", [1.05, 1.95, 1.85]),
    # Serve, blocking handler: they reach the batcher when the loop frees at 1.05, then wait W again.
    ("serve", [1.05, 2.0, 1.9]),
    # Serve, offloaded handler: batches keep closing W after their first request while the device
    # is busy, so the two queued requests run as two batches of one.
    ("serve_offloaded", [1.05, 1.95, 2.85]),
])
def test_requests_queued_behind_a_busy_device_follow_each_batchers_timer(policy, expected):
    result = simulate([0.0, 0.1, 0.2], constant(1.0), 4, 0.05, policy=policy)
    assert np.allclose(result.latencies_seconds, expected)


@pytest.mark.parametrize("policy, expected", [
    # Measured on Ray Serve 2.60 (sleeping handler; requests at 0, 0, 0, 0.1 s; B=2, W=0.1 s, 0.3 s per
    # batch): blocking -> batches [0,1] [2] [3]; awaited sleep -> [0,1] [2,3].
    ("serve", [0.3, 0.3, 0.6, 0.8]),
    ("serve_offloaded", [0.3, 0.3, 0.6, 0.5]),
    ("triton", [0.3, 0.3, 0.6, 0.5]),
])
def test_serve_blocking_batch_left_over_requests_run_without_those_that_arrived_during_the_run(policy, expected):
    result = simulate([0.0, 0.0, 0.0, 0.1], constant(0.3), 2, 0.1, policy=policy)
    assert np.allclose(result.latencies_seconds, expected)


@pytest.mark.parametrize("policy", POLICIES)
def test_an_overloaded_system_is_flagged_and_its_latency_grows(policy):
    curve = LatencyCurve.from_points({1: 0.002, 8: 0.008})  # capacity 1000 req/s at B=8
    result = simulate(poisson_arrivals(2000.0, 4000, 1), curve, 8, 0.001, policy=policy)
    assert not result.stable
    assert result.load_factor > 1.5
    lat = result.latencies_seconds
    assert lat[-400:].mean() > 10 * lat[:400].mean()
    assert result.throughput_rps < 1050


def test_a_stable_system_completes_requests_at_the_arrival_rate_with_every_request_in_one_batch():
    curve = LatencyCurve.from_points({1: 0.002, 8: 0.008})
    result = simulate(poisson_arrivals(400.0, 4000, 2), curve, 8, 0.002)
    assert result.stable
    assert result.throughput_rps == pytest.approx(result.offered_rate_rps, rel=0.02)
    assert sum(size * count for size, count in result.batch_size_histogram.items()) == 4000
    assert result.mean_batch_size == pytest.approx(4000 / len(result.batch_sizes))


def test_service_spread_reaches_the_tail_and_overhead_is_added_per_request():
    curve = LatencyCurve.from_samples({1: [1.0] * 95 + [3.0] * 5})
    arrivals = np.arange(2000) * 10.0  # no queueing: latency is the service time
    spread = simulate(arrivals, curve, 1, 0.0, seed=0)
    median_only = simulate(arrivals, curve, 1, 0.0, sample_service=False)
    assert spread.latency_p50_seconds == 1.0 and spread.latency_p99_seconds == 3.0
    assert median_only.latency_p99_seconds == 1.0
    assert simulate(arrivals, curve, 1, 0.0, sample_service=False, overhead_seconds=0.5).latency_p99_seconds == 1.5
    drawn = simulate(arrivals, curve, 1, 0.0, sample_service=False, overhead_seconds=[0.0, 2.0])
    assert set(np.unique(drawn.latencies_seconds)) == {1.0, 3.0}
    assert simulate(arrivals, curve, 1, 0.0, sample_service=False,
                    overhead_seconds=np.float32(0.5)).latency_p50_seconds == 1.5
    with pytest.raises(ValueError, match="inbound_seconds"):
        simulate(arrivals, curve, 1, 0.0, inbound_seconds=[])


def test_a_constant_inbound_delay_shifts_every_latency_and_changes_nothing_else():
    arrivals = poisson_arrivals(300.0, 2000, 6)
    curve = LatencyCurve.from_points({1: 0.002, 8: 0.006})
    base = simulate(arrivals, curve, 8, 0.003, sample_service=False)
    shifted = simulate(arrivals, curve, 8, 0.003, sample_service=False, inbound_seconds=0.004)
    assert np.allclose(shifted.latencies_seconds, base.latencies_seconds + 0.004)
    assert np.array_equal(shifted.batch_sizes, base.batch_sizes)


def test_a_stalled_inbound_request_holds_back_those_sent_after_it():
    # A request every 0.1 s, served alone in 0.01 s. One in ten stalls 1 s on the way in; the path is
    # FIFO, so the ~9 requests sent behind a stalled one queue up behind it and reach the batcher together.
    arrivals = np.arange(200) * 0.1
    stalled = simulate(arrivals, constant(0.01), 64, 0.0, policy="triton", inbound_seconds=[0.0] * 9 + [1.0],
                       seed=1)
    assert max(stalled.batch_size_histogram) >= 9
    answered = arrivals + stalled.latencies_seconds
    assert np.all(np.diff(answered) >= -1e-12)  # FIFO path + FIFO batcher: answers in send order
    smooth = simulate(arrivals, constant(0.01), 64, 0.0, policy="triton", inbound_seconds=0.5)
    assert smooth.mean_batch_size == 1.0


@pytest.mark.parametrize("args, key", [
    (([0.0], 0, 0.1), "max_batch_size"),
    (([0.0], 4, -1.0), "max_wait_seconds"),
    (([1.0, 0.0], 4, 0.1), "sorted"),
])
def test_simulate_rejects_bad_settings_and_names_them(args, key):
    arrivals, size, wait = args
    with pytest.raises(ValueError, match=key):
        simulate(arrivals, constant(0.1), size, wait)
    with pytest.raises(ValueError, match="Should be one of"):
        simulate([0.0], constant(0.1), 4, 0.1, policy="fifo")


# --- sweep and recommendation --------------------------------------------------------------------

CURVE = LatencyCurve.from_points({1: 0.002, 2: 0.0022, 4: 0.0026, 8: 0.0035, 16: 0.0055, 32: 0.0095})


def test_recommend_picks_the_setting_with_most_capacity_among_those_meeting_the_slo():
    arrivals = poisson_arrivals(1500.0, 3000, 4)
    results = sweep_grid(arrivals, CURVE, [1, 4, 16, 32], [0.0, 0.002, 0.02])
    slo = 0.012
    chosen = recommend(results, slo).result
    assert chosen is not None and chosen.latency_p99_seconds <= slo
    meeting = [r for r in results if r.stable and r.latency_p99_seconds <= slo]
    assert chosen.capacity_rps == max(r.capacity_rps for r in meeting)
    assert chosen.latency_p99_seconds == min(r.latency_p99_seconds for r in meeting
                                             if r.capacity_rps == chosen.capacity_rps)
    # B=1 cannot keep up with 1500 req/s at 2 ms per request; a 20 ms wait blows a 12 ms p99.
    assert not any(r.max_batch_size == 1 and r.stable for r in results)
    assert all(r.latency_p99_seconds > slo for r in results if r.max_wait_seconds == 0.02)


def test_recommend_with_an_slo_ranks_by_the_rate_each_setting_sustains_within_it():
    arrivals = poisson_arrivals(1500.0, 3000, 4)
    slo = 0.012
    results = sweep_grid(arrivals, CURVE, [4, 16, 32], [0.0, 0.002], slo_p99_seconds=slo)
    meeting = [r for r in results if r.stable and r.latency_p99_seconds <= slo]
    assert meeting and all(r.slo_rate_rps is not None and r.slo_rate_rps >= r.offered_rate_rps for r in meeting)
    assert all(r.slo_rate_rps <= r.capacity_rps for r in meeting)
    chosen = recommend(results, slo).result
    assert chosen.slo_rate_rps >= 0.99 * max(r.slo_rate_rps for r in meeting)
    # Just above its SLO rate the chosen setting misses the SLO (or is unstable).
    over = simulate(poisson_arrivals(1.3 * chosen.slo_rate_rps, 4000, 0), CURVE, chosen.max_batch_size,
                    chosen.max_wait_seconds)
    assert not over.stable or over.latency_p99_seconds > slo


def test_recommend_returns_none_with_a_reason_when_nothing_meets_the_slo():
    results = sweep_grid(poisson_arrivals(500.0, 2000, 5), CURVE, [4, 8], [0.001])
    impossible = recommend(results, 0.001)
    assert impossible.result is None and "no setting meets p99" in impossible.reason
    overloaded = recommend(sweep_grid(poisson_arrivals(20_000.0, 2000, 5), CURVE, [4], [0.001]), 1.0)
    assert overloaded.result is None and "overloaded" in overloaded.reason
    assert recommend([], 1.0).result is None
