"""The critical batch size fit (McCandlish et al. 2018): exact on noise-free data, within 15 % with 5 %
noise, its interval covering the truth, and its words."""

import random

import pytest

from sweeper.report.critical_batch import fit, fit_with_interval

BATCHES = [16, 32, 64, 128, 256, 512, 1024, 2048]


def steps(batch, s_min=100.0, b_crit=256.0):
    return s_min * (1 + b_crit / batch)


def test_noise_free_steps_give_back_the_critical_batch_exactly():
    found = fit([(b, steps(b)) for b in BATCHES])
    assert found.critical_batch_size == pytest.approx(256.0, rel=1e-6)
    assert found.s_min == pytest.approx(100.0, rel=1e-6) and found.e_min == pytest.approx(25600.0, rel=1e-6)
    assert found.r_squared == pytest.approx(1.0)
    assert found.saving_of_doubling(256) == pytest.approx(0.25)  # at B_crit doubling saves a quarter


def test_five_percent_noise_stays_within_fifteen_percent_and_the_interval_covers_it():
    rng = random.Random(7)
    noisy = [(b, steps(b) * (1 + rng.uniform(-0.05, 0.05))) for b in BATCHES for _ in range(3)]
    found = fit_with_interval(noisy)
    assert found.critical_batch_size == pytest.approx(256.0, rel=0.15)
    assert found.low <= 256.0 <= found.high and found.points == len(BATCHES)
    assert "critical batch size is ~" in found.in_words()


def test_no_diminishing_return_or_one_batch_is_no_fit():
    assert fit([(b, 1000.0 / b) for b in BATCHES]) is None  # perfect scaling: S_min would be 0
    assert fit([(64, 10.0), (64, 12.0)]) is None
