"""The frontier search on memory curves with a known answer: pure, no processes."""

import math

import pytest

from sweeper.measure import frontier
from sweeper.measure.frontier import FrontierSearch


def run(search: FrontierSearch, peak):
    sizes = []
    while (size := search.next_size()) is not None:
        sizes.append(size)
        search.record(size, peak(size))
    return search.result(), sizes


def true_max(peak, budget, upper=100_000):
    """Exhaustive: every size from 1 up, as a user with unlimited time would."""
    best = 0
    for m in range(1, upper + 1):
        p = peak(m)
        if p is not None and p <= budget:
            best = m
    return best


def linear(fixed, per_sample, budget=None):
    def peak(m):
        value = fixed + per_sample * m
        return None if budget is not None and value > budget else value
    return peak


def test_fit_recovers_a_line_and_reports_residuals():
    model = frontier.fit([(8, 1000 + 8 * 10), (32, 1000 + 32 * 10), (64, 1000 + 64 * 10 + 50)])
    assert model.per_sample_bytes == pytest.approx(10, rel=0.1)
    assert model.r_squared < 1.0 and model.max_relative_residual > 0
    assert frontier.fit([(2, 10), (4, 20)]).largest_fitting(41) == 8
    with pytest.raises(ValueError, match="two different"):
        frontier.fit([(8, 1.0), (8, 2.0)])


@pytest.mark.parametrize("fixed,per_sample,budget", [
    (130e6, 0.4e6, 250e6),      # resnet18-like: large fixed part
    (1e6, 3e6, 8e9),            # activation-dominated, frontier in the thousands
    (50e6, 1e6, 60e6),          # frontier just above the first probe
    (10e6, 1e6, 14e6),          # frontier below the first probe
])
def test_linear_memory_is_found_exactly_in_three_probes_and_one_verification(fixed, per_sample, budget):
    peak = linear(fixed, per_sample, budget)
    result, sizes = run(FrontierSearch(budget_bytes=budget), peak)
    truth = math.floor((budget - fixed) / per_sample)
    assert result.micro_batch_size == truth
    assert result.num_fit_probes <= 3 and result.num_verifications <= 1, sizes


def test_convex_memory_is_within_ten_percent_of_the_exhaustive_maximum():
    # Activations plus a workspace that grows faster than linearly: the line underestimates near
    # the frontier, so verification fails and steps down.
    def peak(m):
        value = 100e6 + 1e6 * m + 2e3 * m * m
        return None if value > 1e9 else value

    truth = true_max(peak, 1e9, upper=2000)
    result, sizes = run(FrontierSearch(budget_bytes=1e9), peak)
    assert result.micro_batch_size <= truth
    assert result.micro_batch_size >= 0.9 * truth, (sizes, truth)
    assert peak(result.micro_batch_size) is not None  # the answer ran and fit


def test_the_answer_is_capped_by_the_data_and_rounded_to_a_multiple():
    result, sizes = run(FrontierSearch(budget_bytes=1e12, upper=300), linear(1e6, 1e3))
    assert result.micro_batch_size == 300 and max(sizes) == 300 and "capped" in result.reason
    result, _ = run(FrontierSearch(budget_bytes=250e6, multiple_of=8), linear(130e6, 0.4e6, 250e6))
    assert result.micro_batch_size == 296


def test_nothing_fits():
    result, sizes = run(FrontierSearch(budget_bytes=1e6), linear(2e6, 1e3, 1e6))
    assert result.micro_batch_size == 0 and sizes == [8, 4, 2, 1]


def test_a_peak_over_the_budget_counts_as_out_of_memory():
    # A GPU's allocator can report a peak over a fraction it enforces loosely: never an answer.
    result, _ = run(FrontierSearch(budget_bytes=1000), linear(100, 10))  # never raises itself
    assert result.micro_batch_size == 90


def test_accumulation_reaches_each_global_batch_with_the_largest_micro_batch_that_fits():
    assert frontier.accumulation_for(256, 1, 100) == (64, 4)
    assert frontier.accumulation_for(256, 1, 100, 50) == (32, 8)  # accumulating leaves less room
    assert frontier.accumulation_for(64, 1, 100, 10) == (64, 1)  # no accumulation needed
    assert frontier.accumulation_for(256, 2, 128) == (128, 1)
    assert frontier.accumulation_for(96, 1, 40) == (32, 3)
    assert frontier.accumulation_for(100, 3, 1000) is None  # does not split over 3 workers
    assert frontier.accumulation_for(64, 1, 0, 0) is None
    assert frontier.needs_accumulating(100, 1, [1], [64, 256]) and not frontier.needs_accumulating(100, 2, [1], [200])
    assert frontier.needs_accumulating(100, 1, [1, 2], None) and not frontier.needs_accumulating(100, 1, [1], None)
    assert frontier.frontier_grid(300) == [75, 150, 300]
    assert frontier.frontier_grid(1) == [1]


def test_the_auto_grid_reaches_each_global_batch_with_the_fewest_accumulation_steps():
    points, skipped = frontier.grid_from_frontiers({1: (100, 60), 2: (100, None), 3: (0, None)}, [1, 2], [256, 64])
    assert [p.key for p in points] == ["mb32-acc8-w1", "mb64-acc1-w1", "mb64-acc2-w2", "mb32-acc1-w2"]
    assert all(p.global_batch_size in (256, 64) for p in points)
    assert skipped == ["3 worker(s): not even a micro-batch of 1 fits the budget"]
    points, _ = frontier.grid_from_frontiers({1: (300, 200)}, [1, 2])
    assert [p.key for p in points] == [
        "mb75-acc1-w1", "mb150-acc1-w1", "mb300-acc1-w1", "mb50-acc2-w1", "mb100-acc2-w1", "mb200-acc2-w1"
    ]


def test_slightly_convex_memory_measured_on_resnet18_needs_one_verification():
    # The probes of resnet18 on 3x32x32 under a 0.2 GiB budget (CPU, tracked peak): per-sample memory
    # grows from 0.387 to 0.395 MiB between 8 and 190 samples.
    MiB = 2**20
    def peak(m):
        value = (126.6 + 0.3855 * m + 0.0000497 * m * m) * MiB
        return None if value > 0.2 * 2**30 else value
    truth = true_max(peak, 0.2 * 2**30, upper=1000)
    result, sizes = run(FrontierSearch(budget_bytes=0.2 * 2**30), peak)
    assert 0.9 * truth <= result.micro_batch_size <= truth
    assert result.num_fit_probes <= 3 and result.num_verifications == 1, sizes


def test_the_grid_trains_the_margin_below_the_largest_micro_batch_that_fit():
    from sweeper.measure.frontier import with_margin

    assert with_margin(197, 0.05) == 187  # floor(197 x 0.95)
    assert with_margin(197, 0.05, multiple_of=8) == 184  # then down to a multiple of 8
    assert with_margin(100, 0.0) == 100  # no margin: the frontier itself
    assert with_margin(1, 0.05) == 1  # never below one sample
    assert with_margin(10, 0.5, multiple_of=8) == 1  # a multiple that rounds to 0 still trains one sample
