"""The recommendation's quality rule on a loss (report.quality): a language model is judged by its
validation loss (lower is better), with intervals from its standard error or over seeds, the tolerance
report.max_loss_rise in the loss's units, ties, the not-learned rule against the unigram entropy."""

from __future__ import annotations

import math

import pytest

from sweeper.config.report import ReportConfig, check
from sweeper.errors import ConfigError
from sweeper import stats
from sweeper.report import analysis, quality
from sweeper.report.analysis import Trial, recommend, summarize
from sweeper.report.quality import ACCURACY, BITS_PER_BYTE, LOSS

LN2 = math.log(2)


def lm(key: str, tokens_per_second: float, loss: float, se: float = 0.01, seed=None, status="ok",
       entropy_bits: float = 4.5, byte_level: bool = True, micro: int = 16) -> Trial:
    """A byte-level language model's point: loss in nats per token, its SE over the validation sequences."""
    return Trial(key, micro, 1, 1, micro, status, samples_per_second=tokens_per_second / 64,
                 tokens_per_second=tokens_per_second, val_loss=loss, val_loss_se=se,
                 val_bits_per_byte=loss / LN2 if byte_level else None, val_accuracy=0.4, val_samples=50,
                 train_unigram_entropy_bits=entropy_bits, seed=seed, point_key=key if seed is not None else None,
                 num_classes=256, context=64)


def test_auto_picks_bits_per_byte_for_bytes_the_loss_for_other_tokens_and_accuracy_for_a_classifier():
    assert quality.resolve("auto", [lm("a", 100, 2.4)]) is BITS_PER_BYTE
    assert quality.resolve("auto", [lm("a", 100, 2.4, byte_level=False)]) is LOSS
    assert quality.resolve("auto", [Trial("a", 1, 1, 1, 1, "ok", val_accuracy=0.9)]) is ACCURACY
    assert quality.resolve("val_loss", [lm("a", 100, 2.4)]) is LOSS
    assert recommend([lm("a", 100, 2.4)]).quality == "val_bits_per_byte"


def test_a_faster_point_whose_loss_is_certified_within_the_rise_is_recommended():
    # 0.010 nats worse with SEs of 0.004 each: the one-sided 95 % upper bound of the rise is
    # 0.010 + 1.645 * 0.00566 = 0.0193 nats = 0.0278 bits, under 0.05 bits per byte.
    slow, fast = lm("mb16-acc1-w1", 1000, 2.400, 0.004), lm("mb64-acc1-w1", 3000, 2.410, 0.004, micro=64)
    rec = recommend([slow, fast], "throughput", max_loss_rise=0.05)
    assert rec.best.key == "mb64-acc1-w1" and rec.quality == "val_bits_per_byte"
    assert "Certified not worse: its val_bits_per_byte" in rec.reason
    assert "wholly below +0.05 (report.max_loss_rise)" in rec.reason
    assert "3000 tokens/s" in rec.reason and "samples/s" not in rec.reason and "accuracy" not in rec.reason
    # The same gap with the sign flipped is the slow point being worse: the fast one is then the best
    # by loss, and also the fastest.
    flipped = recommend([lm("mb16-acc1-w1", 1000, 2.410, 0.004), lm("mb64-acc1-w1", 3000, 2.400, 0.004, micro=64)],
                        "throughput", max_loss_rise=0.05)
    assert flipped.best.key == "mb64-acc1-w1" and "Certified" not in flipped.reason


def test_a_faster_point_shown_worse_by_more_than_the_rise_is_excluded_and_an_unclear_one_unproven():
    best, worse, unclear = (lm("mb16-acc1-w1", 1000, 2.40, 0.004), lm("mb64-acc1-w1", 3000, 2.60, 0.004, micro=64),
                            lm("mb32-acc1-w1", 2000, 2.43, 0.02, micro=32))
    rec = recommend([best, worse, unclear], "throughput", max_loss_rise=0.03)
    assert rec.best.key == "mb16-acc1-w1"
    assert "more than report.max_loss_rise=0.03 above the best" in rec.excluded["mb64-acc1-w1"]
    # The rise shown in the loss's own direction: positive is worse.
    gap = quality.BITS_PER_BYTE.gap(summarize([unclear]), summarize([best]), 0.90)
    assert gap.mean == pytest.approx(-0.03 / LN2)
    assert "+0.043 [" in rec.unproven["mb32-acc1-w1"]
    assert "neither wholly below nor wholly above +0.03 (report.max_loss_rise)" in rec.unproven["mb32-acc1-w1"]
    assert "mb16-acc1-w1 is this run's best point by val_bits_per_byte" in rec.reason


def test_bits_and_nats_give_the_same_answer_at_tolerances_related_by_ln2():
    points = [lm("mb16-acc1-w1", 1000, 2.400, 0.004), lm("mb32-acc1-w1", 2000, 2.405, 0.004, micro=32),
              lm("mb64-acc1-w1", 3000, 2.440, 0.004, micro=64)]
    for rise_bits in (0.01, 0.02, 0.04, 0.08):
        in_bits = recommend(points, "throughput", quality="val_bits_per_byte", max_loss_rise=rise_bits)
        in_nats = recommend(points, "throughput", quality="val_loss", max_loss_rise=rise_bits * LN2)
        assert in_bits.best.key == in_nats.best.key
        assert set(in_bits.unproven) == set(in_nats.unproven) and set(in_bits.excluded) == set(in_nats.excluded)
    assert recommend(points, "throughput", quality="val_loss", max_loss_rise=0.08 * LN2).best.key == "mb64-acc1-w1"
    assert recommend(points, "throughput", quality="val_loss", max_loss_rise=0.01 * LN2).best.key != "mb64-acc1-w1"


def test_over_seeds_the_loss_gap_is_paired_by_seed():
    # Seeds move both points together: unpaired the gap would be unclear, paired it is 0.01 +/- tiny.
    runs = [lm("mb16-acc1-w1", 1000, 2.40 + d, 0.05, seed=s) for s, d in enumerate((0.0, 0.1, -0.1))]
    runs += [lm("mb64-acc1-w1", 3000, 2.41 + d, 0.05, seed=s, micro=64) for s, d in enumerate((0.0, 0.1, -0.1))]
    rec = recommend(runs, "throughput", max_loss_rise=0.05)
    assert rec.best.key == "mb64-acc1-w1"
    assert "paired t interval over 3 seeds" in rec.reason


def test_objective_accuracy_ranks_by_the_lowest_loss_and_only_a_certified_tie_goes_to_the_faster():
    # A loss has no tie floor: a gap the data cannot separate from zero is no tie (issue 46: a tie is
    # certified, never a failure to separate), so the lowest loss wins although slower.
    a, b, c = (lm("mb16-acc1-w1", 1000, 2.400, 0.01), lm("mb32-acc1-w1", 2000, 2.405, 0.01, micro=32),
               lm("mb64-acc1-w1", 3000, 2.600, 0.01, micro=64))
    rec = recommend([a, b, c], "accuracy")
    assert rec.best.key == "mb16-acc1-w1" and rec.ties == {}
    assert [t.key for t in rec.runners_up] == ["mb32-acc1-w1", "mb64-acc1-w1"]
    sure = recommend([lm("mb16-acc1-w1", 1000, 2.400, 0.001), lm("mb32-acc1-w1", 2000, 2.420, 0.001, micro=32)],
                     "accuracy")
    assert sure.best.key == "mb16-acc1-w1" and "lowest val_bits_per_byte" in sure.reason


def test_a_language_model_that_did_not_beat_the_unigram_entropy_is_not_eligible():
    # 4.5 bits = 3.119 nats; 3.10 +/- 1.96 x 0.02 reaches above it: not learned beyond token frequencies.
    rec = recommend([lm("mb16-acc1-w1", 1000, 3.10, 0.02), lm("mb32-acc1-w1", 500, 2.40, 0.02, micro=32)])
    assert rec.best.key == "mb32-acc1-w1"
    assert "not below the training stream's unigram entropy" in rec.excluded["mb16-acc1-w1"]
    nobody = recommend([lm("mb16-acc1-w1", 1000, 3.10, 0.02)])
    assert nobody.best is None and nobody.reason.startswith("every point did not learn")


def test_a_language_model_the_worker_found_did_not_learn_is_named_by_its_loss_and_the_unigram_guess():
    # The GPT point of issue 54: status did_not_learn from its worker, loss 3.178 nats against a unigram entropy
    # of 3.147 nats (4.540 bits), next-token accuracy 0.272 over 256 tokens. Its words are the loss's.
    gpt = lm("mb16-acc1-w1", 1000, 3.178, 0.01, status="did_not_learn", entropy_bits=3.147 / LN2, byte_level=False)
    rec = recommend([gpt, lm("mb32-acc1-w1", 500, 2.40, 0.02, micro=32, byte_level=False)])
    why = rec.excluded["mb16-acc1-w1"]
    assert why.startswith("did not learn (val loss 3.178 nats per token is not below the training stream's unigram "
                          "entropy 3.147 nats, the loss of a unigram guess, by more than its noise)")
    assert "accuracy" not in why and "chance" not in why
    nobody = recommend([gpt])
    assert "mb16-acc1-w1 did not learn (val loss 3.178 nats per token" in nobody.reason
    assert "val accuracy" not in nobody.reason


def test_a_one_seed_loss_interval_is_its_mean_plus_minus_z_standard_errors():
    point = summarize([lm("a", 100, 2.4, 0.01)])
    interval = LOSS.interval(point, 0.95)
    assert interval.low == pytest.approx(2.4 - stats.z_score(0.95) * 0.01)
    in_bits = BITS_PER_BYTE.interval(point, 0.95)
    assert in_bits.mean == pytest.approx(2.4 / LN2) and in_bits.high - in_bits.low == pytest.approx(
        (interval.high - interval.low) / LN2)


def test_the_quality_settings_are_checked():
    # A name other than the built-in qualities is a metric of eval.metrics_fn's (report.quality_metric): one no
    # run recorded is judged by auto's choice, and the reason says so first.
    unknown = recommend([lm("a", 100, 2.4)], quality="accuracy")
    assert unknown.quality == "val_bits_per_byte"
    assert unknown.reason.startswith("report.quality_metric=accuracy is not a metric this sweep recorded (its runs "
                                     "recorded no metric of eval.metrics_fn), so it is judged by val_bits_per_byte")
    assert check(ReportConfig(quality="accuracy")) == [
        "report.quality 'accuracy' is invalid. Should be one of ('auto', 'val_accuracy', 'val_loss', "
        "'val_bits_per_byte')."]
    with pytest.raises(ConfigError, match="report.max_loss_rise=-0.1"):
        recommend([lm("a", 100, 2.4)], max_loss_rise=-0.1)
    assert set(quality.CHOICES) == {"auto", *quality.QUALITIES}


def test_the_yaml_names_the_quality_its_tolerance_and_each_points_loss_interval():
    import yaml

    rec = recommend([lm("mb16-acc1-w1", 1000, 2.4), lm("mb32-acc1-w1", 2000, 2.401, micro=32)], max_loss_rise=0.05)
    doc = yaml.safe_load(analysis.recommendation_yaml(rec, max_loss_rise=0.05))
    assert doc["quality"] == "val_bits_per_byte" and doc["constraints"]["max_loss_rise"] == 0.05
    assert doc["recommendation"]["tokens_per_second"] == 2000.0
    assert doc["points"]["mb32-acc1-w1"]["quality_interval"]["mean"] == pytest.approx(2.401 / LN2)


def test_a_points_bits_per_byte_and_tokens_per_second_are_means_over_its_seeds():
    from sweeper.report import folding

    folded = folding.fold([lm("a", 1000, 2.0, seed=0), lm("a", 3000, 1.0, seed=1)])[0]
    assert folded.val_bits_per_byte == pytest.approx(1.5 / LN2) and folded.tokens_per_second == 2000
    # One validation set behind every seed: the pooled loss SE is the seeds' mean, not divided by sqrt(2).
    point = summarize([lm("a", 1000, 2.0, 0.02, seed=0), lm("a", 1000, 2.0, 0.04, seed=1)])
    assert LOSS.pooled(point) == pytest.approx((2.0, 0.03))
