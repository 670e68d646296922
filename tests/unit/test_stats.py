"""Confidence intervals and the tie test against known answers: Wilson's interval, the t interval over
seeds, Welch's t-test (sweeper/stats.py). Pure, no processes."""

import math
import statistics

import pytest
from scipy import stats as scipy_stats

from sweeper import stats

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def test_wilson_interval_of_81_in_263_is_the_textbook_one():
    interval = stats.binomial(81 / 263, 263)
    assert (round(interval.low, 4), round(interval.high, 4)) == (0.2553, 0.3662)
    assert interval.mean == 81 / 263 and interval.n == 263 and interval.sd is None
    assert interval.how == "Wilson interval of 263 validation samples, 95 % (one seed)"
    # Independently: Wilson's bounds are the two p where the score statistic is exactly z,
    # |p_hat - p| = z sqrt(p (1 - p) / n).
    for p in (interval.low, interval.high):
        assert abs(81 / 263 - p) == pytest.approx(Z95 * math.sqrt(p * (1 - p) / 263), rel=1e-9)


def test_wilson_interval_stays_inside_0_and_1_where_the_normal_one_does_not():
    perfect = stats.binomial(1.0, 20)
    # At 20/20 Wilson's bounds are n / (n + z^2) = 0.8389 and 1; at 0/20, 0 and z^2 / (n + z^2) = 0.1611.
    assert perfect.high == 1.0 and round(perfect.low, 4) == 0.8389
    zero = stats.binomial(0.0, 20)
    assert zero.low == 0.0 and round(zero.high, 4) == 0.1611
    # A wider interval at a higher level, a narrower one with more samples.
    assert stats.binomial(0.8, 360, 0.99).high > stats.binomial(0.8, 360).high
    assert stats.binomial(0.8, 3600).high < stats.binomial(0.8, 360).high


def test_binomial_rejects_what_is_not_an_accuracy():
    with pytest.raises(ValueError, match="positive number of validation samples"):
        stats.binomial(0.5, 0)
    with pytest.raises(ValueError, match="fraction between 0 and 1"):
        stats.binomial(80.0, 100)
    with pytest.raises(ValueError, match="level=95"):
        stats.binomial(0.5, 100, 95)


def test_t_interval_over_seeds_by_hand():
    values = [0.80, 0.82, 0.78]  # mean 0.80, sd 0.02
    interval = stats.over_seeds(values)
    half = 4.302652729911275 * 0.02 / math.sqrt(3)  # t(0.975, 2 dof) = 4.3027 from the table
    assert interval.mean == pytest.approx(0.80) and interval.sd == pytest.approx(0.02)
    assert (interval.low, interval.high) == (pytest.approx(0.80 - half), pytest.approx(0.80 + half))
    assert interval.n == 3 and interval.how == "t interval over 3 seeds, 95 %"
    with pytest.raises(ValueError, match="at least 2 values"):
        stats.over_seeds([0.8])
    with pytest.raises(ValueError, match="finite"):
        stats.over_seeds([0.8, float("nan")])


def test_welch_p_matches_the_textbook_example_and_scipy():
    # Wikipedia, "Welch's t-test", example 1: t = -2.46, nu = 25.0, p = 0.021.
    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    assert round(stats.welch_p(a, b), 3) == 0.021
    # The Welch-Satterthwaite statistic and degrees of freedom written out.
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    assert (round(t, 2), round(dof, 1)) == (-2.46, 25.0)
    assert stats.welch_p(a, b) == pytest.approx(2 * scipy_stats.t.sf(abs(t), dof), rel=1e-12)


def test_tie_rule_known_answer_on_fixed_arrays():
    # Means 0.80 and 0.84, sd 0.02 each over 3 seeds: t = -0.04 / sqrt(2 x 0.02^2 / 3) = -sqrt(6) with
    # 4 degrees of freedom. The table's two-sided critical values at 4 dof are 2.776 (95 %) and 2.132
    # (90 %), so |t| = 2.449 lies between them: a tie at 95 %, separable at 90 %.
    a, b = [0.80, 0.82, 0.78], [0.84, 0.86, 0.82]
    p = stats.welch_p(a, b)
    assert p == pytest.approx(2 * scipy_stats.t.sf(math.sqrt(6), 4), rel=1e-9)
    assert 0.05 < p < 0.10 and round(p, 4) == 0.0705
    assert stats.separable(a, b) is False
    assert stats.separable(a, b, level=0.90) is True
    # Further apart (0.80 vs 0.90): p = 0.0023, separable at 95 %.
    assert stats.separable(a, [0.90, 0.92, 0.88]) is True
    # One value on a side: no test over seeds exists; the caller decides on intervals.
    assert stats.separable([0.80], [0.99, 0.98]) is False


def test_welch_with_no_spread_is_certain_either_way():
    assert stats.welch_p([0.8, 0.8], [0.8, 0.8]) == 1.0
    assert stats.welch_p([0.8, 0.8], [0.9, 0.9]) == 0.0
    assert stats.separable([0.8, 0.8], [0.9, 0.9]) is True


def test_interval_overlap_and_text():
    a, b = stats.binomial(0.78, 360), stats.binomial(0.82, 360)
    assert a.overlaps(b) and b.overlaps(a)
    assert not stats.binomial(0.60, 360).overlaps(b)
    assert a.text() == f"0.780 [{a.low:.3f}, {a.high:.3f}]"


# --- non-inferiority: the interval of a gap (issue 27) ----------------------------------------------


def test_paired_difference_is_a_t_interval_over_the_per_seed_differences():
    gap = stats.paired_difference([0.93, 0.92, 0.94], [0.925, 0.93, 0.935])
    # differences +0.005, -0.010, +0.005: mean 0, sd 0.00866, t(2, 0.975) = 4.3027
    assert gap.mean == pytest.approx(0.0, abs=1e-12) and gap.sd == pytest.approx(0.00866025, rel=1e-5)
    assert gap.high == pytest.approx(4.302653 * 0.00866025 / 3 ** 0.5, rel=1e-5)
    assert gap.low == pytest.approx(-gap.high) and gap.how == "paired t interval over 3 seeds, 95 %"
    with pytest.raises(ValueError, match="at least 2 pairs"):
        stats.paired_difference([0.9], [0.8])
    with pytest.raises(ValueError, match="as many values"):
        stats.paired_difference([0.9, 0.8], [0.8])


def test_the_paired_interval_is_narrower_than_welchs_when_seeds_correlate():
    # Each seed moves both points together (same samples, same order): the pair's difference is steady.
    a, b = [0.80, 0.90, 0.70, 0.85], [0.78, 0.89, 0.67, 0.84]
    paired = stats.paired_difference(a, b)
    welch = stats.welch_difference(a, b)
    assert paired.high - paired.low < (welch.high - welch.low) / 5
    assert paired.low > 0 > welch.low  # pairing proves the gap; the unpaired interval cannot


def test_newcombe_difference_matches_newcombes_published_example():
    # Newcombe 1998 (Stat Med 17:873), method 10, 56/70 - 48/80 = 0.2000: 95 % CI [0.0524, 0.3339].
    gap = stats.newcombe_difference(56, 70, 48, 80)
    assert gap.mean == pytest.approx(0.2)
    assert (round(gap.low, 4), round(gap.high, 4)) == (0.0524, 0.3339)


def test_newcombe_difference_of_one_seed_matches_the_formula_from_wilson_bounds():
    # 300/359 vs 330/359, by hand: Wilson bounds l, u of each proportion with z = 1.959964, then
    # low = d - sqrt((p1 - l1)^2 + (u2 - p2)^2), high = d + sqrt((u1 - p1)^2 + (p2 - l2)^2).
    z, n = 1.959963984540054, 359

    def wilson(p):
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
        return centre - half, centre + half

    p1, p2 = 300 / 359, 330 / 359
    (l1, u1), (l2, u2) = wilson(p1), wilson(p2)
    d = p1 - p2
    low = d - ((p1 - l1) ** 2 + (u2 - p2) ** 2) ** 0.5
    high = d + ((u1 - p1) ** 2 + (p2 - l2) ** 2) ** 0.5
    gap = stats.newcombe_difference(300, 359, 330, 359)
    assert gap.mean == pytest.approx(d) and gap.low == pytest.approx(low) and gap.high == pytest.approx(high)
    assert -0.14 < gap.low < -0.12 and -0.04 < gap.high < -0.03  # about -0.084 [-0.131, -0.036]


def test_seeds_to_settle_shrinks_the_half_width_past_the_threshold():
    gap = stats.paired_difference([0.82, 0.80, 0.78], [0.84, 0.86, 0.82])  # -0.04, sd 0.02
    # t(n-1) * 0.02 / sqrt(n) < |-0.04 - (-0.02)| = 0.02 first at n = 7 (2.447 / 2.646 = 0.925).
    assert stats.seeds_to_settle(gap, -0.02) == 7
    assert stats.seeds_to_settle(stats.binomial(0.8, 100), -0.02) is None  # no spread over seeds
