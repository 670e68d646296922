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


# -- what the sweep feeds the fit (sweeper/report/folding.py) -----------------------------------------


def run(batch, steps, seed, multiplier=1.0, reached=True, status="ok", b_simple=None):
    from sweeper.report.analysis import Trial

    point = f"mb{batch}-acc1-w1" + ("" if multiplier == 1.0 else f"-lrx{multiplier:g}")
    return Trial(key=f"{point}-s{seed}", point_key=point, seed=seed, micro_batch_size=batch, accumulation_steps=1,
                 num_workers=1, global_batch_size=batch, status=status, lr_multiplier=multiplier,
                 steps_to_target=steps if reached and status == "ok" else None,
                 reached_target=reached if status == "ok" else None, gns_b_simple=b_simple)


def test_the_fit_takes_the_best_multiplier_per_batch_and_only_points_that_reached_the_target_in_every_seed():
    from sweeper.report import folding

    trials = [
        run(32, 300, 0), run(32, 310, 1),  # x1 is best at 32
        run(32, 400, 0, 2.0), run(32, 420, 1, 2.0),
        run(64, 200, 0), run(64, None, 1, reached=False),  # x1 missed in one seed: left out...
        run(64, 260, 0, 2.0), run(64, 240, 1, 2.0),  # ...so x2 stands for 64, though slower than x1's one seed
        run(128, 90, 0, 4.0, status="diverged"), run(128, 150, 1, 4.0),  # diverged in a seed: left out
    ]
    assert sorted(folding.fitted_points(trials)) == ["mb32-acc1-w1", "mb64-acc1-w1-lrx2"]
    assert sorted(folding.critical_batch_observations(trials)) == [(32.0, 300.0), (32.0, 310.0), (64.0, 240.0),
                                                                  (64.0, 260.0)]
    found = folding.critical_batch(trials)  # 305 steps at 32, 250 at 64: S_min 195, B_crit 18
    assert found.s_min == pytest.approx(195.0) and found.critical_batch_size == pytest.approx(64 * 55 / 195)
    metrics = folding.critical_batch_metrics(found, 12.5)
    assert metrics["critical_batch_points"] == 2 and metrics["gns_b_simple_mean"] == 12.5


def test_without_a_fit_the_reason_says_what_is_missing_and_b_simple_is_a_mean_over_points():
    from sweeper.report import folding

    assert folding.no_fit_reason([run(32, None, 0, reached=False)]).startswith("no point recorded steps_to_target")
    one = [run(32, 300, 0), run(64, None, 0, reached=False), run(64, 200, 1)]
    assert folding.no_fit_reason(one).startswith("1 global batch size(s) reached the target in every seed")
    faster = [run(32, 400, 0), run(64, 150, 0)]  # steps fell faster than 1/B
    assert folding.critical_batch(faster) is None and folding.no_fit_reason(faster).startswith("no diminishing return")
    # Two seeds of one point (10, 30) and one of another (50): (20 + 50) / 2, not (10 + 30 + 50) / 3.
    noise = [run(32, 1, 0, b_simple=10.0), run(32, 1, 1, b_simple=30.0), run(64, 1, 0, b_simple=50.0)]
    assert folding.b_simple_mean(noise) == pytest.approx(35.0)
