"""From trials to an answer: knees, the Pareto front, recommendations per objective, the override line and YAML."""

import pytest
import yaml

from sweeper.report.analysis import (
    OBJECTIVES,
    Recommendation,
    Trial,
    knee,
    knees,
    override_line,
    pareto,
    recommend,
    recommendation_yaml,
    seconds_to_train,
)

GiB = 2**30


def trial(mb, acc=1, w=1, status="ok", **figures):
    return Trial(
        key=f"mb{mb}-acc{acc}-w{w}",
        micro_batch_size=mb,
        accumulation_steps=acc,
        num_workers=w,
        global_batch_size=mb * acc * w,
        status=status,
        **figures,
    )


# --- knee ------------------------------------------------------------------------------------------


def test_knee_on_exact_doublings_is_the_size_after_which_doubling_gains_under_10_percent():
    # 16 -> 32: +80 %; 32 -> 64: +5.6 %: the knee is 32.
    points = [(16, 100.0), (32, 180.0), (64, 190.0), (128, 195.0)]
    assert knee(points) == 32
    assert knee(list(reversed(points))) == 32  # order of input does not matter
    assert knee(points, min_gain=0.05) == 64  # 32 -> 64 (+5.6 %) passes 5 %; 64 -> 128 (+2.6 %) does not
    assert knee(points, min_gain=0.02) is None


def test_knee_normalizes_a_quadrupling_to_a_gain_per_doubling():
    # 16 -> 64 is two doublings: +20 % in total is 9.5 % per doubling (a knee at 10 %), though the
    # total gain alone would have passed; +23 % in total is 10.9 % per doubling (no knee).
    assert knee([(16, 100.0), (64, 120.0)]) == 16
    assert knee([(16, 100.0), (64, 123.0)]) is None
    # Mixed steps: 16 -> 32 is +50 %, 32 -> 128 is +20 % over two doublings (9.5 % each).
    assert knee([(16, 100.0), (32, 150.0), (128, 180.0)]) == 32


def test_no_knee_while_throughput_keeps_climbing_or_with_too_few_points():
    assert knee([(16, 100.0), (32, 190.0), (64, 360.0)]) is None
    assert knee([(16, 100.0)]) is None
    assert knee([]) is None


def test_a_throughput_drop_is_a_knee():
    assert knee([(16, 100.0), (32, 90.0), (64, 200.0)]) == 16


def test_knee_rejects_duplicate_sizes():
    with pytest.raises(ValueError, match="micro_batch_size 16 appears twice"):
        knee([(16, 100.0), (16, 110.0)])


def test_knees_per_accumulation_and_workers_series_over_ok_trials_only():
    trials = [
        trial(16, samples_per_second=100.0),
        trial(32, samples_per_second=180.0),
        trial(64, samples_per_second=190.0),
        trial(16, acc=2, samples_per_second=100.0),
        trial(16, w=2, samples_per_second=150.0),
        trial(32, w=2, samples_per_second=300.0),
        # Counted, these would put knees at 64 (1, 1) and 32 (1, 2): an ok trial without a rate
        # cannot be placed, and an OOM's rate (whatever it holds) is not a measurement.
        trial(128),
        trial(64, w=2, status="oom", samples_per_second=310.0),
    ]
    assert knees(trials) == {(1, 1): 32, (1, 2): None, (2, 1): None}


# --- pareto ----------------------------------------------------------------------------------------


def test_pareto_drops_dominated_and_not_ok_trials_and_sorts_by_memory():
    small = trial(16, samples_per_second=100.0, peak_memory_bytes=1 * GiB)
    big = trial(64, samples_per_second=150.0, peak_memory_bytes=3 * GiB)
    mid = trial(32, samples_per_second=160.0, peak_memory_bytes=2 * GiB)  # beats `big` on both
    failed = trial(128, status="failed", samples_per_second=1e6, peak_memory_bytes=1.0)
    unmeasured = trial(8, samples_per_second=500.0)
    assert pareto([big, failed, mid, unmeasured, small]) == [small, mid]


# --- recommend -------------------------------------------------------------------------------------


def test_throughput_picks_the_fastest_ok_trial_and_never_an_oom_or_failed_one():
    trials = [
        trial(16, samples_per_second=100.0, peak_memory_bytes=GiB),
        trial(32, samples_per_second=180.0, peak_memory_bytes=2 * GiB),
        trial(64, samples_per_second=170.0, peak_memory_bytes=3 * GiB),
        trial(128, status="oom", samples_per_second=1e9),
        trial(256, status="failed", samples_per_second=1e9, val_accuracy=1.0),
    ]
    rec = recommend(trials)
    assert isinstance(rec, Recommendation)
    assert rec.objective == "throughput"
    assert rec.best.key == "mb32-acc1-w1"
    assert [t.key for t in rec.runners_up] == ["mb64-acc1-w1", "mb16-acc1-w1"]
    assert rec.excluded == {"mb128-acc1-w1": "status oom", "mb256-acc1-w1": "status failed"}
    assert "180.0 samples/s" in rec.reason and "mb64-acc1-w1" in rec.reason


def test_runners_up_are_at_most_three():
    trials = [trial(2**i, samples_per_second=float(i)) for i in range(1, 7)]
    rec = recommend(trials)
    assert rec.best.key == "mb64-acc1-w1"
    assert [t.key for t in rec.runners_up] == ["mb32-acc1-w1", "mb16-acc1-w1", "mb8-acc1-w1"]


def test_nothing_ok_says_how_the_trials_ended():
    trials = [trial(8, status="failed"), trial(16, status="failed"), trial(32, status="failed"),
              trial(64, status="oom", samples_per_second=1e9)]
    rec = recommend(trials)
    assert rec.best is None and rec.runners_up == []
    assert rec.reason == "no trial finished ok: 3 failed, 1 oom"
    assert recommend([]).reason == "no trials to choose from"


def test_memory_budget_excludes_the_fastest_trial():
    trials = [
        trial(16, samples_per_second=100.0, peak_memory_bytes=1 * GiB),
        trial(32, samples_per_second=150.0, peak_memory_bytes=2 * GiB),
        trial(64, samples_per_second=200.0, peak_memory_bytes=4 * GiB),
        trial(128, samples_per_second=300.0),  # memory unknown: cannot be shown to fit
    ]
    rec = recommend(trials, memory_budget_bytes=3 * GiB)
    assert rec.best.key == "mb32-acc1-w1"
    assert "over report.memory_budget_gb=3 (3.00 GiB)" in rec.excluded["mb64-acc1-w1"]
    assert "no peak_memory_bytes" in rec.excluded["mb128-acc1-w1"]
    assert set(rec.excluded) == {"mb64-acc1-w1", "mb128-acc1-w1"}

    none_fit = recommend(trials[:3], memory_budget_bytes=0.5 * GiB)
    assert none_fit.best is None
    assert none_fit.reason == (
        "no ok trial fits report.memory_budget_gb=0.5 (512.00 MiB): "
        "the smallest peak was 1.00 GiB (mb16-acc1-w1)"
    )


def test_min_accuracy_excludes_and_explains_when_no_trial_reaches_it():
    trials = [
        trial(16, samples_per_second=100.0, val_accuracy=0.85),
        trial(32, samples_per_second=200.0, val_accuracy=0.80),
        trial(64, samples_per_second=400.0),  # no accuracy: cannot satisfy a minimum
    ]
    rec = recommend(trials, min_accuracy=0.82)
    assert rec.best.key == "mb16-acc1-w1"
    assert rec.excluded["mb32-acc1-w1"] == "val_accuracy 0.800 under report.min_accuracy=0.82"
    assert rec.excluded["mb64-acc1-w1"] == "no val_accuracy to check against report.min_accuracy=0.82"

    nobody = recommend(trials, min_accuracy=0.9)
    assert nobody.best is None and nobody.runners_up == []
    assert nobody.reason == "no ok trial reached report.min_accuracy=0.9 (best was 0.850, mb16-acc1-w1)"
    assert len(nobody.excluded) == 3


def test_accuracy_objective_picks_the_most_accurate():
    trials = [
        trial(16, samples_per_second=100.0, val_accuracy=0.97),
        trial(32, samples_per_second=300.0, val_accuracy=0.90),
        trial(64, samples_per_second=500.0, val_accuracy=0.80),
        trial(128, samples_per_second=900.0),
    ]
    rec = recommend(trials, objective="accuracy")
    assert rec.best.key == "mb16-acc1-w1"
    assert [t.key for t in rec.runners_up] == ["mb32-acc1-w1", "mb64-acc1-w1"]
    assert rec.excluded == {"mb128-acc1-w1": "no val_accuracy"}
    assert "0.970" in rec.reason


def test_accuracy_ties_within_half_a_point_are_broken_by_throughput():
    trials = [
        trial(16, samples_per_second=100.0, val_accuracy=0.962),
        trial(32, samples_per_second=200.0, val_accuracy=0.957),  # exactly 0.005 below: a tie
        trial(64, samples_per_second=900.0, val_accuracy=0.950),  # not a tie
    ]
    rec = recommend(trials, objective="accuracy")
    assert rec.best.key == "mb32-acc1-w1"
    assert [t.key for t in rec.runners_up] == ["mb16-acc1-w1", "mb64-acc1-w1"]
    assert "within 0.005" in rec.reason and "200.0 samples/s vs 100.0 samples/s" in rec.reason

    # Without the faster tie partner the most accurate wins, and no tie is claimed.
    alone = recommend([trials[0], trials[2]], objective="accuracy")
    assert alone.best.key == "mb16-acc1-w1"
    assert "within" not in alone.reason


def test_accuracy_objective_without_any_accuracy_says_so():
    rec = recommend([trial(16, samples_per_second=100.0)], objective="accuracy")
    assert rec.best is None
    assert rec.reason == "no ok trial has val_accuracy (synthetic data has none)"


def test_time_to_accuracy_is_the_shortest_training_among_trials_reaching_the_target():
    trials = [
        trial(16, samples_per_second=100.0, samples_seen=1000, val_accuracy=0.95),  # 10 s
        trial(32, samples_per_second=200.0, samples_seen=1000, val_accuracy=0.85),  # 5 s, under target
        trial(64, samples_per_second=125.0, samples_seen=1000, val_accuracy=0.92),  # 8 s
        trial(8, train_seconds=9.0, val_accuracy=0.93),  # wall clock only
    ]
    assert seconds_to_train(trials[2]) == pytest.approx(8.0)
    assert seconds_to_train(trials[3]) == pytest.approx(9.0)
    rec = recommend(trials, objective="time_to_accuracy", min_accuracy=0.9)
    assert rec.best.key == "mb64-acc1-w1"
    assert [t.key for t in rec.runners_up] == ["mb8-acc1-w1", "mb16-acc1-w1"]
    assert "mb32-acc1-w1" in rec.excluded
    assert "8.0 s" in rec.reason and "report.min_accuracy=0.9" in rec.reason


def test_time_to_accuracy_requires_min_accuracy():
    with pytest.raises(ValueError, match=r"report\.min_accuracy"):
        recommend([trial(16, samples_per_second=1.0)], objective="time_to_accuracy")


def test_min_accuracy_given_as_a_percentage_is_rejected():
    with pytest.raises(ValueError, match=r"report\.min_accuracy=90 must be a fraction"):
        recommend([], min_accuracy=90)


def test_invalid_objective_names_the_choices():
    with pytest.raises(ValueError) as error:
        recommend([], objective="speed")
    assert str(error.value) == f"objective 'speed' is invalid. Should be one of {OBJECTIVES}."


def test_a_runner_up_inside_the_measured_spread_is_called_within_noise():
    close = [
        trial(16, samples_per_second=100.0, samples_per_second_cv=0.03),
        trial(32, samples_per_second=98.0, samples_per_second_cv=0.01),  # 2 % behind, spread 3 %
    ]
    rec = recommend(close)
    assert rec.best.key == "mb16-acc1-w1"
    assert "within noise" in rec.reason and "2.0%" in rec.reason and "cv 3.0%" in rec.reason

    clear = [close[0], trial(32, samples_per_second=90.0, samples_per_second_cv=0.01)]  # 10 % behind
    assert "within noise" not in recommend(clear).reason


def test_an_unstable_winner_is_still_recommended_with_a_warning():
    trials = [
        trial(16, samples_per_second=200.0, throughput_stable=False),
        trial(32, samples_per_second=100.0, throughput_stable=True),
    ]
    rec = recommend(trials)
    assert rec.best.key == "mb16-acc1-w1"
    assert "unstable" in rec.reason
    assert rec.excluded == {}
    assert "unstable" not in recommend(trials[1:]).reason


# --- override line and YAML ------------------------------------------------------------------------


def test_override_line_pins_the_lr_the_trial_used():
    best = trial(64, acc=4, w=2, lr=0.07071067811865477)
    assert override_line(best, "sqrt") == (
        "sweep.micro_batch_sizes=[64] sweep.accumulation_steps=[4] sweep.num_workers=[2] "
        "train.lr=0.07071067811865477 train.lr_scaling=none"
    )
    assert override_line(best, "none").endswith("train.lr=0.07071067811865477")
    assert override_line(best).endswith("train.lr_scaling=none")  # rule unknown: pin it
    assert override_line(trial(64, acc=4, w=2)) == (
        "sweep.micro_batch_sizes=[64] sweep.accumulation_steps=[4] sweep.num_workers=[2]"
    )
    with pytest.raises(ValueError, match="lr_scaling 'cubic' is invalid"):
        override_line(best, "cubic")


def test_recommendation_yaml_round_trips():
    trials = [
        trial(32, acc=2, w=2, lr=0.1, samples_per_second=400.5, samples_per_second_cv=0.02,
              throughput_stable=True, peak_memory_bytes=1.5 * GiB, val_accuracy=0.95, samples_seen=4000),
        trial(16, lr=0.05, samples_per_second=150.0, peak_memory_bytes=0.5 * GiB, val_accuracy=0.93),
        trial(64, acc=2, w=2, lr=0.1, samples_per_second=500.0, peak_memory_bytes=4 * GiB, val_accuracy=0.96),
        trial(128, status="oom"),
    ]
    rec = recommend(trials, objective="throughput", min_accuracy=0.9, memory_budget_bytes=2 * GiB)
    doc = yaml.safe_load(recommendation_yaml(rec, "throughput", 0.9, 2 * GiB))

    assert doc["objective"] == "throughput"
    assert doc["constraints"] == {"min_accuracy": 0.9, "memory_budget_bytes": 2.0 * GiB, "max_accuracy_drop": None}
    chosen = doc["recommendation"]
    assert (chosen["micro_batch_size"], chosen["accumulation_steps"], chosen["num_workers"]) == (32, 2, 2)
    assert chosen["global_batch_size"] == 128
    assert chosen["lr"] == 0.1
    assert chosen["samples_per_second"] == 400.5
    assert chosen["peak_memory_bytes"] == 1.5 * GiB
    assert chosen["val_accuracy"] == 0.95
    assert chosen["throughput_stable"] is True
    assert chosen["seconds_to_train"] == pytest.approx(4000 / 400.5)
    assert chosen["overrides"] == override_line(rec.best)
    assert doc["reason"] == rec.reason
    assert [r["key"] for r in doc["runners_up"]] == ["mb16-acc1-w1"]
    assert doc["runners_up"][0]["samples_per_second"] == 150.0
    assert doc["excluded"] == rec.excluded and set(doc["excluded"]) == {"mb64-acc2-w2", "mb128-acc1-w1"}


def test_recommendation_yaml_without_a_winner_is_null_with_the_reason():
    rec = recommend([trial(16, status="oom")])
    doc = yaml.safe_load(recommendation_yaml(rec))
    assert doc["recommendation"] is None
    assert doc["reason"] == "no trial finished ok: 1 oom"
    assert doc["constraints"] == {"min_accuracy": None, "memory_budget_bytes": None, "max_accuracy_drop": None}
    with pytest.raises(ValueError, match="does not match"):
        recommendation_yaml(rec, "accuracy")


def test_a_fast_trial_that_learned_less_is_not_recommended_and_the_reason_says_so():
    # The demo's case: the fastest layout trained its sample budget in few, large steps and is at chance.
    trials = [
        trial(64, acc=2, w=2, samples_per_second=703.0, val_accuracy=0.095),
        trial(64, w=2, samples_per_second=565.0, val_accuracy=0.217),
        trial(16, w=2, samples_per_second=282.5, val_accuracy=0.930),
        trial(16, samples_per_second=284.6, val_accuracy=0.915),
        trial(32, samples_per_second=250.0, val_accuracy=0.890),
    ]
    rec = recommend(trials, "throughput", max_accuracy_drop=0.02)
    assert rec.best.key == "mb16-acc1-w1"  # fastest within 2 points of the best (0.915 vs 0.930)
    assert [t.key for t in rec.runners_up] == ["mb16-acc1-w2"]
    assert "Not recommended although faster: mb64-acc2-w2 (703.0 samples/s, val_accuracy 0.095), " \
           "mb64-acc1-w2 (565.0 samples/s, val_accuracy 0.217)" in rec.reason
    assert "more than report.max_accuracy_drop=0.02 below the best (0.930, mb16-acc1-w2)" in rec.reason
    assert "mb32-acc1-w1" not in rec.reason  # slower anyway: not a trial the guard took away
    assert rec.excluded["mb32-acc1-w1"].startswith("val_accuracy 0.890 is more than report.max_accuracy_drop=0.02")
    # Off (null), or for the accuracy objective, the guard changes nothing.
    assert recommend(trials, "throughput").best.key == "mb64-acc2-w2"
    assert recommend(trials, "accuracy", max_accuracy_drop=0.02).best.key == "mb16-acc1-w2"
    # Without measured accuracy (synthetic data) there is nothing to compare: throughput decides.
    blind = [trial(16, samples_per_second=100.0), trial(32, samples_per_second=150.0)]
    assert recommend(blind, "throughput", max_accuracy_drop=0.02).best.key == "mb32-acc1-w1"
    with pytest.raises(ValueError, match="report.max_accuracy_drop=2"):
        recommend(trials, max_accuracy_drop=2)
