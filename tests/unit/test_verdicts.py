"""Issue 46, findings 1-4 and the class rule: every verdict ("tie", "not worse", "certified") comes from one
non-inferiority judgement that pairs by seed, never counts layouts, LR multipliers or recipes as seeds,
uses the spread over seeds when seeds do not match, and says "not tested" where no interval exists."""

from dataclasses import replace

import pytest

from sweeper import stats
from sweeper.report.analysis import Trial, gap_words, judge_gap, lr_table, recommend, summarize
from sweeper.report.recipe_comparison import compare_recipes


def run(mb, acc=1, w=1, seed=0, accuracy=0.9, rate=100.0, lr_multiplier=None, precision=None, **figures):
    """One seed's run of a point (the key carries the seed, `point_key` the point)."""
    point = f"mb{mb}-acc{acc}-w{w}" + (f"-lrx{lr_multiplier:g}" if lr_multiplier not in (None, 1.0) else "") + (
        f"-{precision}" if precision not in (None, "fp32") else "")
    return Trial(key=f"{point}-s{seed}", point_key=point, seed=seed, micro_batch_size=mb, accumulation_steps=acc,
                 num_workers=w, global_batch_size=mb * acc * w, status="ok", val_accuracy=accuracy,
                 samples_per_second=rate, lr_multiplier=lr_multiplier, precision=precision, **figures)


# --- finding 1: objective accuracy's ties are the paired judgement ------------------------------------


def test_accuracy_objective_does_not_tie_a_point_worse_in_every_seed():
    # Welch's unpaired test cannot separate them (p = 0.07), but the faster point is 0.04 worse in every
    # seed: the paired gap is -0.040 [-0.040, -0.040], no tie.
    best = [run(16, seed=s, accuracy=a, rate=100.0) for s, a in enumerate([0.84, 0.86, 0.82])]
    faster = [run(32, seed=s, accuracy=a, rate=200.0) for s, a in enumerate([0.80, 0.82, 0.78])]
    rec = recommend([*best, *faster], "accuracy")
    assert rec.best.key == "mb16-acc1-w1"
    assert rec.ties == {}
    assert "cannot tell apart" not in rec.reason


def test_time_to_accuracy_does_not_pick_a_point_worse_in_every_seed():
    best = [run(16, seed=s, accuracy=a, rate=100.0, samples_seen=1000.0) for s, a in enumerate([0.84, 0.86, 0.82])]
    faster = [run(32, seed=s, accuracy=a, rate=200.0, samples_seen=1000.0) for s, a in enumerate([0.80, 0.82, 0.78])]
    rec = recommend([*best, *faster], "time_to_accuracy", min_accuracy=0.5, max_accuracy_drop=0.02)
    assert rec.best.key == "mb16-acc1-w1"


def test_accuracy_objective_ties_a_point_certified_within_the_tie_floor():
    best = [run(16, seed=s, accuracy=a, rate=100.0) for s, a in enumerate([0.84, 0.86, 0.82])]
    close = [run(32, seed=s, accuracy=a - 0.001, rate=200.0) for s, a in enumerate([0.84, 0.86, 0.82])]
    rec = recommend([*best, *close], "accuracy")
    assert rec.best.key == "mb32-acc1-w1"
    assert "mb32-acc1-w1" in rec.ties and "[-0.001, -0.001]" in rec.ties["mb32-acc1-w1"]


# --- finding 2: layouts, LR multipliers and recipes are never seeds --------------------------------


def _one_seed_three_layouts(**extra):
    layouts = [(32, 1), (16, 2), (8, 4)]
    return [run(mb, acc, lr_multiplier=m, accuracy=a, val_samples=360, **extra)
            for m, a in ((1.0, 0.90), (2.0, 0.91)) for mb, acc in layouts]


def test_lr_table_with_one_seed_does_not_count_layouts_as_seeds():
    row = lr_table(_one_seed_three_layouts(), max_drop=0.02)[32]
    (multiplier, gap), = row.judged
    assert multiplier == 1.0
    assert gap.interval.sd is None  # no spread over seeds: there is one seed
    assert "seeds" not in gap.interval.how
    assert "360 and 360 validation samples" in gap.interval.how  # one validation set, not three pooled
    words = gap_words("lr x1", "lr x2", gap, 0.02, 0.95)
    assert "about" not in words and "more seeds (sweep.seeds) would settle it" in words


def test_lr_table_pairs_by_seed_over_the_mean_of_the_layouts():
    trials = []
    for seed, (low, high) in enumerate([(0.90, 0.91), (0.88, 0.90)]):
        for mb, acc, noise in ((32, 1, 0.0), (16, 2, 0.002), (8, 4, -0.002)):
            trials += [run(mb, acc, seed=seed, lr_multiplier=1.0, accuracy=low + noise),
                       run(mb, acc, seed=seed, lr_multiplier=2.0, accuracy=high + noise)]
    (_, gap), = lr_table(trials, max_drop=0.02)[32].judged
    expected = stats.paired_difference([0.90, 0.88], [0.91, 0.90], 0.90)
    assert gap.interval.n == 2 and "over 2 seeds" in gap.interval.how
    assert gap.interval.low == pytest.approx(expected.low, abs=1e-9)
    assert gap.interval.high == pytest.approx(expected.high, abs=1e-9)


def test_recipe_comparison_with_one_seed_does_not_count_layouts_as_seeds():
    layouts = [(32, 1), (16, 2), (8, 4)]
    trials = [run(mb, acc, precision=p, accuracy=a, val_samples=360)
              for p, a in (("fp32", 0.90), ("bf16", 0.905)) for mb, acc in layouts]
    comparison = compare_recipes(trials, 0.02)
    gap = next(r.accuracy_gap for r in comparison.rows if r.precision == "bf16")
    assert gap.interval.sd is None and "seeds" not in gap.interval.how
    assert not any("over 3 seeds" in v for v in comparison.verdicts)


# --- finding 3: unmatched seeds use their spread, not pooled validation hits ------------------------


def test_unmatched_seeds_are_judged_by_their_spread_over_seeds():
    a = [run(32, seed=s, accuracy=x, val_samples=360) for s, x in zip((0, 1, 2), (0.80, 0.85, 0.90))]
    b = [run(16, seed=s, accuracy=x, val_samples=360) for s, x in zip((3, 4, 5), (0.88, 0.81, 0.84))]
    gap = judge_gap(summarize(a), summarize(b), 0.02)
    expected = stats.welch_difference([0.80, 0.85, 0.90], [0.88, 0.81, 0.84], 0.90)
    assert gap.interval.low == pytest.approx(expected.low, abs=1e-9)
    assert gap.interval.high == pytest.approx(expected.high, abs=1e-9)
    assert "Welch" in gap.interval.how and "validation samples" not in gap.interval.how
    assert gap.outcome == "unproven"


def test_one_seed_against_several_unmatched_is_not_tested():
    a = [run(32, seed=7, accuracy=0.85, val_samples=360)]
    b = [run(16, seed=s, accuracy=x, val_samples=360) for s, x in zip((3, 4, 5), (0.88, 0.81, 0.84))]
    gap = judge_gap(summarize(a), summarize(b), 0.02)
    assert gap.interval is None and gap.outcome == "untested"


# --- finding 4: no "certified" without an interval -------------------------------------------------


def test_no_interval_is_not_tested_never_certified():
    gap = judge_gap(summarize([run(32, accuracy=0.90)]), summarize([run(16, accuracy=0.90)]), 0.02)
    assert gap.outcome == "untested"
    words = gap_words("bf16 with no checkpointing", "fp32", gap, 0.02, 0.95)
    assert "certified" not in words and "not tested" in words


def test_a_faster_untested_point_is_not_recommended_over_the_most_accurate():
    rec = recommend([run(16, accuracy=0.90, rate=100.0), run(32, accuracy=0.899, rate=200.0)],
                    max_accuracy_drop=0.02)
    assert rec.best.key == "mb16-acc1-w1"
    assert "not tested" in rec.excluded["mb32-acc1-w1"]
    assert "certified" not in rec.excluded["mb32-acc1-w1"].replace("not certified", "")


# --- quality belongs to the class, speed to the layout ----------------------------------------------


def _issue_sweep():
    """Issue 46's sweep on fixed inputs: the MLP on digits (no BatchNorm), one seed, global batch 32 as mb16 x
    acc2 and mb32 x acc1 at LR multipliers 1 and 2, 360 validation samples. The two layouts of a multiplier
    train the same model and land one validation sample apart."""
    figures = dict(val_samples=360, lr=0.002, optimizer="adamw", precision="fp32", activation_checkpointing="none",
                   samples_seen=1437.0)
    hits = {(16, 2, 1.0): 342, (32, 1, 1.0): 343, (16, 2, 2.0): 351, (32, 1, 2.0): 350}
    rates = {(16, 2): 595.0, (32, 1): 896.0}
    return [run(mb, acc, lr_multiplier=m, accuracy=h / 360, rate=rates[(mb, acc)] + (3.0 if m == 1.0 else 0.0),
                **{**figures, "lr": 0.002 * m})
            for (mb, acc, m), h in hits.items()]


def test_the_faster_layout_of_the_better_class_is_recommended():
    trials = _issue_sweep()
    # Judged layout by layout, the slower layout wins by one validation sample.
    assert recommend(trials, max_accuracy_drop=0.02).best.key == "mb16-acc2-w1-lrx2"
    rec = recommend(trials, max_accuracy_drop=0.02, coupled=False)
    assert rec.best.key == "mb32-acc1-w1-lrx2"
    assert rec.top == "class gb32-lrx2"
    # One quality per class: the class's mean over its layouts, judged once.
    assert rec.classes["mb16-acc2-w1-lrx2"] is rec.classes["mb32-acc1-w1-lrx2"]
    assert rec.classes["mb32-acc1-w1-lrx2"].trial.val_accuracy == pytest.approx(350.5 / 360, abs=1e-12)
    assert rec.gaps["mb32-acc1-w1"].outcome == rec.gaps["mb16-acc2-w1"].outcome != "eligible"
    assert "mb32-acc1-w1-lrx2 is the class's fastest layout" in rec.reason


def test_batch_norm_keeps_the_micro_batch_in_the_class():
    rec = recommend(_issue_sweep(), max_accuracy_drop=0.02, coupled=True)
    assert rec.best.key == "mb16-acc2-w1-lrx2"  # a class of its own: the most accurate by one sample
    assert rec.classes["mb16-acc2-w1-lrx2"].key == "mb16-acc2-w1-lrx2"


def test_the_headline_fits_three_lines_and_the_table_names_each_verdict():
    from sweeper.report import classes, headline
    from sweeper.report.text import answer_text
    from sweeper.report.output import override_line

    rec = recommend(_issue_sweep(), max_accuracy_drop=0.02, coupled=False)
    lines = headline.headline(rec, override_line(rec.best))
    assert len(lines) <= 3 and all(len(line) <= 120 for line in lines)
    assert lines[0].startswith("Train mb32-acc1-w1-lrx2: the best class's fastest layout; ")
    assert "device-hours" in lines[0] and "val_accuracy 0.974" in lines[0]
    assert lines[-1].endswith("sweep.lr_multipliers=[2.0]") or "sweep.lr_multipliers=[2.0]" in " ".join(lines)
    rows = {row["point"]: row for row in headline.alternatives(rec)}
    assert rows["mb32-acc1-w1-lrx2"]["verdict"] == "recommended"
    assert rows["mb16-acc2-w1-lrx2"]["verdict"] == "same model, slower"
    assert rows["mb32-acc1-w1"]["verdict"] in ("unproven", "worse")
    text = answer_text(rec, override_line(rec.best))
    assert text.splitlines()[len(lines)].split() == ["point", "samples/s", "val_accuracy", "gap", "[interval]",
                                                     "verdict", "seeds", "to", "settle"]
    words = classes.words(rec.classes, False)
    assert "class gb32-lrx2: mb16-acc2-w1-lrx2, mb32-acc1-w1-lrx2" in words and "without batch-coupled" in words


# --- the answer at a glance: points, and a language model's tokens/s and judged loss first ---------


def _lm_runs():
    return [replace(run(16, seed=s, accuracy=0.4, rate=10.0), tokens_per_second=2560.0, val_bits_per_byte=3.2 + s / 100,
                    val_loss=2.2, val_loss_se=0.01, context=256) for s in (0, 1)]


def test_a_language_models_rows_lead_with_tokens_per_second_and_the_judged_loss():
    from sweeper.report import sections
    from sweeper.report.quality import BITS_PER_BYTE
    from sweeper.report.text import table_row

    assert list(table_row(_lm_runs()[0]))[:3] == ["point", "tokens/s", "bits/byte"]
    assert list(table_row(run(16)))[0] == "point"  # one word, "points", for the rows too
    rows = sections._point_rows(_lm_runs(), BITS_PER_BYTE)
    assert list(rows[0])[:3] == ["point", "tokens/s", "val_bits_per_byte [interval]"]
    assert rows[0]["tokens/s"] == "2,560"


def test_the_reports_last_table_is_headed_points():
    from sweeper.report import html

    page = html.render("s", [{"point": "mb16-acc1-w1"}], {}, "Train", {})
    assert "<h2>Points, one run per seed (1)</h2>" in page and "Trials" not in page


# --- "learned at all" by the same rule: seeds are never pooled as independent draws ----------------


def test_not_learned_uses_the_spread_over_seeds_not_their_pooled_hits():
    """Three seeds scored on one validation set of 359 samples are not 1,077 draws. At 0.10, 0.16 and 0.11
    against chance 0.1 their pooled hits (133 of 1,077) pass a binomial test (p ~ 0.01), while the spread over
    the seeds (the mean 0.123, one-sided t lower bound ~0.07) does not lie above chance: not learned."""
    from sweeper.report import eligibility

    seeds = [run(16, seed=s, accuracy=a, val_samples=359, num_classes=10) for s, a in enumerate([0.10, 0.16, 0.11])]
    point = summarize(seeds)
    assert stats.above_chance(round(sum(a * 359 for a in (0.10, 0.16, 0.11))), 3 * 359, 0.1)  # what pooling said
    assert eligibility.not_learned(point, 0.95)
    rec = recommend([*seeds, *(run(32, seed=s, accuracy=0.9, val_samples=359, num_classes=10) for s in range(3))])
    assert rec.excluded["mb16-acc1-w1"].startswith("did not learn")
    # seeds consistently above chance are learned; one seed is judged on its own validation hits
    assert not eligibility.not_learned(summarize([run(16, seed=s, accuracy=a, val_samples=359, num_classes=10)
                                                  for s, a in enumerate([0.30, 0.34, 0.32])]), 0.95)
    assert not eligibility.not_learned(summarize([run(16, accuracy=0.16, val_samples=359, num_classes=10)]), 0.95)
    assert eligibility.not_learned(summarize([run(16, accuracy=0.11, val_samples=359, num_classes=10)]), 0.95)


def test_a_language_models_learned_test_uses_the_spread_over_seeds_too():
    """A loss a hair under the unigram entropy in each seed's own noise, but spread widely over seeds: the
    seeds' t interval reaches above the entropy, so learning is not shown."""
    from sweeper.report import eligibility

    entropy_bits = 2.0  # 1.386 nats per token
    seeds = [replace(run(16, seed=s), val_loss=v, val_loss_se=0.002, train_unigram_entropy_bits=entropy_bits)
             for s, v in enumerate([1.30, 1.38, 1.20])]
    assert eligibility.not_learned(summarize(seeds), 0.95)
    tight = [replace(t, val_loss=v) for t, v in zip(seeds, [1.30, 1.31, 1.29])]
    assert not eligibility.not_learned(summarize(tight), 0.95)


def test_a_slower_unproven_point_is_not_called_faster():
    """The MLP bench's grid called mb16-acc1-w1, slower than its pick, 'faster but unproven'."""
    best = [run(64, seed=s, accuracy=a, rate=500.0, val_samples=359) for s, a in enumerate([0.90, 0.92, 0.91])]
    slow = [run(16, seed=s, accuracy=a, rate=200.0, val_samples=359) for s, a in enumerate([0.86, 0.91, 0.88])]
    fast = [run(32, seed=s, accuracy=a, rate=900.0, val_samples=359) for s, a in enumerate([0.86, 0.91, 0.88])]
    rec = recommend([*best, *slow, *fast], max_accuracy_drop=0.02)
    assert rec.best.key == "mb64-acc1-w1"
    assert rec.excluded["mb16-acc1-w1"].startswith("unproven: its val_accuracy gap")
    assert rec.excluded["mb32-acc1-w1"].startswith("faster but unproven: its val_accuracy gap")
