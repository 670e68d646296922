"""report.quality_metric: the recommendation judged by a metric of eval.metrics_fn's (an F1, a WER) by the same
paired rule and intervals as accuracy and loss, its words naming it; a name no run recorded is a note, and a
point whose evaluation ran out of memory says so. Hand-made trials, no processes."""

from __future__ import annotations

from sweeper.report import headline
from sweeper.report.recorded import trial_of
from sweeper.report.analysis import recommend
from sweeper.report.quality import recorded
from tests.helpers import trial

FAST, SLOW = "mb64-acc1-w1", "mb16-acc1-w1"


def point(mb: int, rate: float, accuracy: float, f1: float, se: float = 0.01, seed=None, **figures):
    return trial(mb, samples_per_second=rate, val_accuracy=accuracy, val_samples=500, seed=seed,
                 val_metrics=(("f1", f1, se, True),), **figures)


def test_the_recommendation_judges_by_a_user_metric_when_report_quality_metric_names_it():
    # The faster point has the higher accuracy but the lower F1. By accuracy it wins; by F1 its gap is
    # 0.70 - 0.80 = -0.100 with SE hypot(0.01, 0.01) = 0.0141: one-sided 95 % bounds -0.100 +/- 1.645 x 0.0141 =
    # [-0.123, -0.077], wholly below -0.02 (report.max_accuracy_drop: higher is better): excluded.
    runs = [point(64, 3000, 0.90, 0.70), point(16, 1000, 0.88, 0.80)]
    assert recommend(runs, "throughput", max_accuracy_drop=0.02).best.key == FAST
    rec = recommend(runs, "throughput", max_accuracy_drop=0.02, quality="f1")
    assert rec.best.key == SLOW and rec.quality == "f1"
    assert rec.excluded[FAST] == (
        "f1 0.700 [0.680, 0.720] is more than report.max_accuracy_drop=0.02 below the best, 0.800 [0.780, 0.820] "
        f"({SLOW}), shown at 95 %: its gap is -0.100 [-0.123, -0.077] (normal interval from the two f1s' bootstrap "
        "standard errors, one-sided 95 % bounds)")
    assert "their f1 is more than report.max_accuracy_drop=0.02 below the best (0.800" in rec.reason
    assert "accuracy" not in rec.reason.replace("report.max_accuracy_drop", "")
    # The printed answer and its table of alternatives name it too.
    assert headline.headline(rec, "")[0].startswith(f"Train {SLOW}: the best point by f1; ")
    assert {row["point"]: row["verdict"] for row in headline.alternatives(rec)} == {
        SLOW: "recommended", FAST: "worse"}


def test_a_user_metric_is_paired_by_seed_as_accuracy_and_loss_are():
    # Per seed, F1 fast - slow = [-0.005, -0.003]: mean -0.004, sd 0.00141; the one-sided 95 % bound is the
    # two-sided 90 % paired t with 1 degree of freedom, 6.314 x 0.00141 / sqrt(2) = 0.0063: [-0.010, +0.002],
    # wholly above -0.02: certified not worse, so the faster point is recommended.
    runs = [point(64, 3000, 0.90, f1, seed=s) for s, f1 in ((0, 0.795), (1, 0.800))]
    runs += [point(16, 1000, 0.88, f1, seed=s) for s, f1 in ((0, 0.800), (1, 0.803))]
    rec = recommend(runs, "throughput", max_accuracy_drop=0.02, quality="f1")
    assert rec.best.key == FAST
    assert rec.gaps[FAST].outcome == "eligible"
    # Each point's interval over its seeds: mean +/- 12.706 (t, 1 degree of freedom) x sd / sqrt(2).
    assert ("Certified not worse: its f1 0.798 [0.766, 0.829] against the best, 0.802 [0.782, 0.821] "
            f"({SLOW}), has a gap of -0.004 [-0.010, +0.002] (paired t interval over 2 seeds, one-sided 95 % bounds), "
            "wholly above -0.02 (report.max_accuracy_drop)") in rec.reason


def test_a_lower_is_better_user_metric_takes_the_loss_rise_as_its_margin():
    runs = [trial(64, samples_per_second=3000, val_metrics=(("wer", 0.31, 0.005, False),)),
            trial(16, samples_per_second=1000, val_metrics=(("wer", 0.20, 0.005, False),))]
    rec = recommend(runs, "throughput", max_loss_rise=0.05, quality="wer")
    assert rec.best.key == SLOW
    assert rec.excluded[FAST].startswith("wer 0.310 [0.300, 0.320] is more than report.max_loss_rise=0.05 above the "
                                         "best, 0.200 [0.190, 0.210]")


def test_a_quality_metric_no_run_recorded_is_a_note_and_judged_by_todays_choice():
    runs = [point(64, 3000, 0.90, 0.70), point(16, 1000, 0.88, 0.80)]
    rec = recommend(runs, "throughput", max_accuracy_drop=0.02, quality="f2")
    assert rec.quality == "val_accuracy" and rec.best.key == FAST
    assert rec.reason.startswith("report.quality_metric=f2 is not a metric this sweep recorded (its runs recorded "
                                 "f1 from eval.metrics_fn), so it is judged by val_accuracy instead. ")


def test_a_point_whose_evaluation_ran_out_of_memory_says_so_where_its_quality_is_missing():
    why = "out of memory evaluating at eval.batch_size=256 (OutOfMemoryError: CUDA out of memory): lower it"
    failed = trial(64, samples_per_second=3000, eval_error=why)
    rec = recommend([failed, point(16, 1000, 0.88, 0.80)], "accuracy", quality="f1")
    assert rec.best.key == SLOW
    assert rec.excluded[FAST] == f"no f1: its evaluation ran out of memory ({why})"


def test_a_runs_user_metrics_are_read_back_from_its_mlflow_names():
    row = {"key": FAST, "micro_batch_size": "64", "accumulation_steps": "1", "num_workers": "1",
           "global_batch_size": "64", "status": "ok", "val_metric/f1": 0.7, "val_metric_se/f1": 0.01,
           "val_metric/wer": 0.3, "sweeper.metric_directions": "f1=higher,wer=lower",
           "sweeper.eval_error": "out of memory"}
    read = trial_of(row)
    assert read.val_metrics == (("f1", 0.7, 0.01, True), ("wer", 0.3, None, False))
    assert read.eval_error == "out of memory"
    assert recorded("wer", [read]).higher_is_better is False
    assert recorded("wer", [read]).tolerance_key == "report.max_loss_rise"
