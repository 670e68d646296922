"""Timing windows, the stability rule and the phase split, against cases with known answers."""

import pytest

from sweeper.measure.timing import phase_split, stable_run, summarize, window_bounds


def test_windows_skip_warmup_and_cover_every_later_step():
    assert window_bounds(total_steps=11, first_timed_step=2, windows=3) == [(2, 5), (5, 8), (8, 11)]
    # The remainder is spread over the first windows instead of being left untimed.
    assert window_bounds(total_steps=13, first_timed_step=2, windows=3) == [(2, 6), (6, 10), (10, 13)]
    assert window_bounds(total_steps=4, first_timed_step=2, windows=3) == [(2, 3), (3, 4)]
    assert window_bounds(total_steps=2, first_timed_step=2, windows=3) == []


def test_stability_rule_judges_the_last_windows():
    # A slow start (cache warming), then steady: the run is the last three windows.
    assert stable_run([50, 90, 100, 101, 99], run=3, tolerance=0.05) == (2, 5)
    # A slowdown at the end is not hidden behind an earlier steady stretch.
    assert stable_run([100, 101, 99, 60], run=3, tolerance=0.05) is None
    assert stable_run([100, 80, 100, 80, 100], run=3, tolerance=0.05) is None
    assert stable_run([100, 100], run=3, tolerance=0.05) is None  # too few windows


def test_summary_of_a_stable_run_is_the_median_of_that_run_with_its_own_spread():
    # Windows of 4, 4, 3, 3, 3 steps at 10 samples per step; the first window is slow (warming up).
    tp = summarize([2.0, 0.4, 0.3, 0.3125, 0.29], window_steps=[4, 4, 3, 3, 3], global_batch_size=10)
    assert tp.window_samples_per_second == pytest.approx([20.0, 100.0, 100.0, 96.0, 103.448], abs=1e-3)
    assert tp.stable and tp.stable_window_count == 3
    assert tp.samples_per_second == pytest.approx(100.0)  # median of 100, 96, 103.4 (their mean is 99.8)
    assert tp.step_time_seconds == pytest.approx(0.1)
    # The spread is that of the windows the figure comes from (sample stdev), not the slow start's.
    assert tp.samples_per_second_cv == pytest.approx(3.724 / 99.816, abs=1e-4)


def test_unstable_windows_report_the_median_of_all_and_their_spread():
    tp = summarize([1.0, 2.0, 1.0], window_steps=[4, 4, 4], global_batch_size=25)  # 100, 50, 100 samples/s
    assert not tp.stable and tp.stable_window_count == 0
    assert tp.samples_per_second == pytest.approx(100.0)
    assert tp.samples_per_second_cv == pytest.approx(28.868 / 83.333, abs=1e-4)  # sample stdev / mean
    assert summarize([2.0], [4], 25).samples_per_second_cv == 0.0  # one window: no spread to report


def test_phase_split_is_the_mean_per_step():
    split = phase_split([(0.1, 0.5, 0.2), (0.3, 0.7, 0.2)])
    assert split == pytest.approx(
        {"data_seconds_per_step": 0.2, "forward_backward_seconds_per_step": 0.6, "optimizer_seconds_per_step": 0.2}
    )
    assert phase_split([]) == {}
