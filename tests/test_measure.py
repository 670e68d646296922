"""Timing windows and their summary, against cases with known answers."""

import pytest

from sweeper.measure import summarize, window_ends


def test_windows_skip_warmup_and_split_the_rest_evenly():
    assert window_ends(total_steps=11, warmup_steps=2, windows=3) == [4, 7, 10]
    assert window_ends(total_steps=12, warmup_steps=2, windows=3) == [4, 7, 10]  # remainder untimed
    assert window_ends(total_steps=4, warmup_steps=2, windows=3) == [2, 3]  # fewer steps than windows
    assert window_ends(total_steps=2, warmup_steps=2, windows=3) == []


def test_summary_is_median_with_spread():
    tp = summarize([1.0, 2.0, 1.0], steps_per_window=4, global_batch_size=25)  # 100, 50, 100 samples/s
    assert tp.samples_per_second == pytest.approx(100.0)
    assert tp.step_time_seconds == pytest.approx(0.25)
    assert tp.samples_per_second_cv == pytest.approx(23.570 / 83.333, abs=1e-3)  # pstdev / mean
    assert tp.noisy


def test_steady_windows_are_not_noisy():
    tp = summarize([1.0, 1.01, 0.99], steps_per_window=1, global_batch_size=10)
    assert tp.samples_per_second_cv < 0.01 and not tp.noisy
