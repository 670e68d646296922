"""sweep.strategy=smart: accuracy-equivalence classes and their representatives, the rungs, the
halving rule, a point composed from its measurement runs, the compute ledger; and through the CLI,
an interrupted smart sweep resumed mid-rung to a finished record."""

import math
import random
import statistics
from dataclasses import replace

import pytest
import torch

from sweeper.config import DataConfig, ModelConfig, TrainConfig
from sweeper.plan import GridPoint, replicate
from sweeper.report import sections
from sweeper.workloads import models
from sweeper.schema import PointResult
from sweeper.strategies import smart
from sweeper.worker.spec import PointSpec

# The demo's layouts (conf/experiment/resnet_batch.yaml): micro-batch [16,64] x accumulation [1,2] x workers [1,2].
DEMO = [GridPoint(m, a, w) for m in (16, 64) for a in (1, 2) for w in (1, 2)]


def keys(points):
    return sorted(p.key for p in points)


# ---------------------------------------------------------------------------------------------------
# Which layouts train the same model


def test_batch_coupled_layers_are_found_in_the_model():
    resnet = models.build_on_meta(ModelConfig(name="resnet18"), 10)
    assert models.batch_coupled_layers(resnet) == ["BatchNorm2d"]
    mlp = models.build(ModelConfig(name="mlp", depth=2, width=32, input_shape=[1, 8, 8]), 10)
    assert models.batch_coupled_layers(mlp) == []
    per_sample = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.GroupNorm(2, 8), torch.nn.Dropout(),
                                     torch.nn.InstanceNorm1d(8))  # no running statistics: per sample
    assert models.batch_coupled_layers(per_sample) == []
    assert models.batch_coupled_layers(torch.nn.InstanceNorm1d(8, track_running_stats=True)) == ["InstanceNorm1d"]


def test_a_batchnorm_free_model_shares_a_class_per_global_batch():
    found = {c.key: c for c in smart.classes(DEMO, coupled=False)}
    assert {k: keys(c.members) for k, c in found.items()} == {
        "gb16": ["mb16-acc1-w1"],
        "gb32": ["mb16-acc1-w2", "mb16-acc2-w1"],
        "gb64": ["mb16-acc2-w2", "mb64-acc1-w1"],
        "gb128": ["mb64-acc1-w2", "mb64-acc2-w1"],
        "gb256": ["mb64-acc2-w2"],
    }
    # the representative: fewest workers, then the largest micro-batch, then the fewest accumulation steps
    assert {k: c.representative.key for k, c in found.items()} == {
        "gb16": "mb16-acc1-w1", "gb32": "mb16-acc2-w1", "gb64": "mb64-acc1-w1", "gb128": "mb64-acc2-w1",
        "gb256": "mb64-acc2-w2"}


def test_a_batchnorm_model_shares_a_class_only_at_the_same_micro_batch():
    found = {c.key: c for c in smart.classes(DEMO, coupled=True)}
    assert {k: keys(c.members) for k, c in found.items()} == {
        "gb16-mb16": ["mb16-acc1-w1"],
        "gb32-mb16": ["mb16-acc1-w2", "mb16-acc2-w1"],
        "gb64-mb16": ["mb16-acc2-w2"],
        "gb64-mb64": ["mb64-acc1-w1"],
        "gb128-mb64": ["mb64-acc1-w2", "mb64-acc2-w1"],
        "gb256-mb64": ["mb64-acc2-w2"],
    }
    assert found["gb128-mb64"].representative.key == "mb64-acc2-w1"


def test_seeds_fold_into_a_class_and_lr_multipliers_and_recipes_split_it():
    points = replicate(DEMO, [0.5, 1.0], [0, 1, 2]) + [replace(p, precision="bf16") for p in DEMO[:2]]
    found = smart.classes(points, coupled=False)
    assert len(found) == 5 * 2 + 2  # 5 global batches x 2 multipliers, and bf16's gb16 and gb32
    assert all(m.seed is None for c in found for m in c.members)
    by_key = {c.key: c for c in found}
    assert keys(by_key["gb32-lrx0.5"].members) == ["mb16-acc1-w2-lrx0.5", "mb16-acc2-w1-lrx0.5"]
    assert keys(by_key["gb32-bf16"].members) == ["mb16-acc1-w2-bf16"]


def test_a_layout_that_failed_its_throughput_run_cannot_represent_its_class():
    found = {c.key: c for c in smart.classes(DEMO, False, excluded=[GridPoint(16, 2, 1), GridPoint(64, 2, 2)])}
    assert found["gb32"].representative.key == "mb16-acc1-w2"  # the other member trains for the class
    assert keys(found["gb32"].members) == ["mb16-acc1-w2", "mb16-acc2-w1"]  # still both recorded from it
    assert "gb256" not in found  # no member left to train it


# ---------------------------------------------------------------------------------------------------
# Rungs and the halving rule


def test_rungs_train_to_shares_of_the_budget_in_whole_steps():
    assert smart.rung_fractions(3, 3) == pytest.approx([1 / 9, 1 / 3, 1.0])
    assert smart.rung_fractions(2, 1) == [1.0]
    assert [smart.rung_steps(89, f) for f in smart.rung_fractions(3, 3)] == [10, 30, 89]
    assert smart.rung_steps(9, 1 / 3) == 3  # not 4: 9 x (1/3) in floating point is 3.0000000000000004
    assert smart.rung_steps(5, 0.01) == 1  # at least one step
    # evaluations of a budget: every 256 samples rounded up to whole global batches, and one at the end
    assert smart.evaluations(89, 256, 16) == 6 and smart.evaluations(32, 256, 16) == 2
    assert smart.evaluations(89, None, 16) == 1


def test_what_smart_can_save_is_bounded_by_classes_per_point_before_any_run():
    # the demo with 2 LR multipliers: 16 points per seed; a BatchNorm-free model has 10 classes, ResNet-18 12
    least, most = smart.sample_share(10, 16, eta=3, rungs=3)
    assert least == pytest.approx((10 / 9 + 4 / 3 + 2) / 16)  # 10 classes a ninth in, 4 a third, 2 to the end
    assert most == pytest.approx(10 * (1 / 9 + 1 / 3 + 1) / 16)  # nothing stopped: every class every rung
    assert smart.sample_share(12, 16, 3, 3) == pytest.approx(((12 / 9 + 4 / 3 + 2) / 16, 12 * 13 / 9 / 16))
    assert smart.sample_share(5, 5, 3, 1) == (1.0, 1.0)  # one rung: every class once, as the grid


def test_a_class_score_is_a_t_interval_over_seeds_or_the_validation_sets_standard_error():
    over_seeds = smart.score([1.0, 2.0, 3.0], [None] * 3, 0.95)
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2 df) x sd 1 / sqrt(3)
    assert (over_seeds.mean, over_seeds.low, over_seeds.high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert over_seeds.how == "seeds"
    one = smart.score([2.0], [0.05], 0.95)
    assert (one.low, one.high) == pytest.approx((2.0 - 1.959964 * 0.05, 2.0 + 1.959964 * 0.05))
    assert one.how == "validation set"


def S(mean, half):
    return smart.Score(mean, mean - half, mean + half, 3, "seeds")


def test_halving_keeps_the_best_share_and_stops_the_rest_with_figures():
    scores = {"a": S(1.0, 0.1), "b": S(1.5, 0.1), "c": S(2.0, 0.1), "d": S(1.2, 0.05), "e": S(3.0, 0.2),
              "f": S(2.5, 0.1)}
    decision = smart.halve(scores, eta=3)
    assert decision.keep == ["a", "d"]  # ceil(6 / 3) = 2 best by mean loss
    assert sorted(decision.stopped) == ["b", "c", "e", "f"]
    assert "val loss 1.5 [1.4, 1.6] against the best a's 1 [0.9, 1.1] (seeds)" in decision.stopped["b"]


def test_halving_never_stops_a_class_whose_interval_overlaps_the_best():
    wide = {"a": S(1.0, 0.1), "b": S(1.5, 0.45), "c": S(1.6, 0.5), "d": S(1.7, 0.65), "e": S(2.0, 0.1)}
    decision = smart.halve(wide, eta=3)
    assert decision.keep == ["a", "b", "c", "d"] and list(decision.stopped) == ["e"]
    rng = random.Random(0)
    for _ in range(500):
        scores = {str(i): S(rng.uniform(0, 3), rng.uniform(0, 1)) for i in range(rng.randint(1, 12))}
        eta = rng.choice([2, 3, 4])
        decision = smart.halve(scores, eta)
        best = min(scores.values(), key=lambda s: s.mean)
        assert all(scores[k].low > best.high for k in decision.stopped)
        assert set(decision.keep) | set(decision.stopped) == set(scores)
        assert len(decision.keep) >= math.ceil(len(scores) / eta)


def seeded(*losses):
    return smart.score(list(losses), [None] * len(losses), 0.95, list(range(len(losses))))


def test_classes_measured_at_the_same_seeds_are_compared_seed_by_seed():
    # seed 0 is hard for every class (its initial weights and sample order are every class's at seed 0):
    # the classes' own intervals overlap widely, but b is worse than a at every seed by 0.3 +- 0.02
    a, b, c = seeded(4.5, 0.6, 1.2), seeded(4.82, 0.89, 1.51), seeded(4.9, 0.3, 1.6)
    assert b.low < a.high  # apart, the seeds' shared noise hides the difference
    decision = smart.halve({"a": a, "b": b, "c": c}, eta=3)
    assert decision.keep == ["a", "c"] and list(decision.stopped) == ["b"]  # c: -0.3 to +0.4, not told apart
    assert "its loss minus the best's, seed by seed, is 0.3067" in decision.stopped["b"]
    diff = smart.paired_difference(b, a, 0.95)
    half = 4.302652729911275 * statistics.stdev([0.32, 0.29, 0.31]) / math.sqrt(3)
    assert (diff.mean, diff.low, diff.high) == pytest.approx((0.3067, 0.3067 - half, 0.3067 + half), abs=1e-4)
    # other seeds, or one seed: no pairing; the classes' own intervals decide
    assert smart.paired_difference(smart.score([4.8, 0.9], [None] * 2, 0.95, [5, 6]), a, 0.95) is None
    assert smart.paired_difference(seeded(2.0), seeded(1.0), 0.95) is None


def test_halving_by_seed_never_stops_a_class_whose_paired_interval_reaches_the_best():
    rng, stops = random.Random(1), 0
    for _ in range(300):
        n = rng.randint(2, 4)
        shared = [rng.gauss(0, 1) for _ in range(n)]  # what a seed does to every class
        scores = {str(i): seeded(*(rng.uniform(0, 2) + x + rng.gauss(0, rng.uniform(0, 0.5)) for x in shared))
                  for i in range(rng.randint(1, 10))}
        decision = smart.halve(scores, rng.choice([2, 3]))
        best = scores[decision.keep[0]]
        for key in decision.stopped:
            assert smart.paired_difference(scores[key], best, 0.95).low > 0
        assert set(decision.keep) | set(decision.stopped) == set(scores)
        stops += len(decision.stopped)
    assert stops > 100  # the rule does stop classes


def test_nothing_is_stopped_before_any_class_has_learned():
    # the MLP demo a ninth into its budget: every class still at ln(10) = 2.3026, a guess's loss; the
    # small batches a hair above it (their first steps at a high LR), with tight intervals over 3 seeds
    at_start = {"gb256": S(2.303, 0.002), "gb16": S(2.313, 0.0025), "gb32": S(2.307, 0.001)}
    assert sorted(smart.halve(at_start, 3).stopped) == ["gb16", "gb32"]  # without the reference
    held = smart.halve(at_start, 3, uninformed=math.log(10))
    assert held.stopped == {} and held.keep == ["gb256", "gb32", "gb16"] and "none has learned yet" in held.note
    learning = {"gb16": S(1.9, 0.05), "gb256": S(2.30, 0.01), "gb32": S(2.0, 0.05)}
    assert list(smart.halve(learning, 3, uninformed=math.log(10)).stopped) == ["gb256"]


def test_a_class_without_a_validation_loss_cannot_be_stopped():
    scores = {"a": S(1.0, 0.01), "synthetic": smart.Score(0.0, -math.inf, math.inf, 1, "no validation loss"),
              "b": S(5.0, 0.01)}
    assert smart.halve(scores, 2).stopped == {}  # its interval is everything: it overlaps every other


def test_a_rung_run_is_the_points_run_cut_short_and_not_judged_as_learned_or_not_before_the_end():
    point = GridPoint(16, 1, 1, seed=0)
    spec = PointSpec(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), train=TrainConfig(),
                     point=point, lr=0.1, steps=90)
    first, last = smart.rung_spec(spec, 1 / 9), smart.rung_spec(spec, 1.0)
    assert (first.steps, last.steps) == (10, 90)
    assert (first.point, first.lr, first.seed, first.eval) == (spec.point, spec.lr, spec.seed, spec.eval)
    # near a guess a ninth into the budget is a model still learning: only the full budget may call it
    # did_not_learn (and a spike still over its bar at a rung's end may yet come back)
    assert first.partial and first.divergence == spec.divergence and first.divergence.check
    assert not last.partial and last.divergence == spec.divergence


def test_a_rung_continues_from_the_rung_befores_checkpoint_and_trains_only_the_steps_between():
    point = GridPoint(16, 1, 1, seed=0)
    spec = PointSpec(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), train=TrainConfig(),
                     point=point, lr=0.1, steps=90)
    first = smart.rung_spec(spec, 1 / 3, save_to="/ckpt/r1-x")
    assert (first.steps, first.start_from, first.save_state_to) == (30, None, "/ckpt/r1-x")
    before = PointResult(status="ok")
    before.cost.optimizer_steps = 30
    before.state.saved_state_path = "/ckpt/r1-x"
    last = smart.rung_spec(spec, 1.0, before)
    assert (last.steps, last.start_from, last.save_state_to, last.partial) == (60, "/ckpt/r1-x", None, False)
    # no checkpoint to continue from (its save failed, or the run did not end ok): from step 0, the whole rung
    for unusable in (replace(before, state=replace(before.state, saved_state_path=None)),
                     replace(before, status="diverged")):
        again = smart.rung_spec(spec, 1.0, unusable)
        assert (again.steps, again.start_from) == (90, None)


def test_a_continued_rung_run_is_recorded_as_one_run_from_step_0():
    before = PointResult(status="ok", train_loss=[2.3, 2.0, 1.8])
    before.cost.update(dict(optimizer_steps=3, samples_seen=48, train_seconds=1.0, trial_seconds=4.0))
    before.noise.update(dict(gns_b_simple_ema=[5.0, 6.0, 7.0], gns_trace_sigma_per_step=[1.0, 1.0, 1.0]))
    before.divergence.grad_norm = [3.0, 2.0, 1.0]
    after = PointResult(status="ok", train_loss=[1.5, 1.2])
    after.cost.update(dict(optimizer_steps=2, samples_seen=64, train_seconds=0.8, trial_seconds=3.0))
    # its evaluations came with the checkpoint (worker.state.History): the worker recorded the point's curve
    after.progress.update(dict(val_loss_curve=[(48, 1.9), (112, 1.1)], evaluations=2, eval_seconds=0.9))
    after.noise.update(dict(gns_b_simple_ema=[7.5, 8.0], gns_trace_sigma_per_step=[2.0, 2.0]))
    after.divergence.update(dict(grad_norm=[0.9, 0.8], spike_at_step=1))
    after.state.continued_from = "/ckpt/r1-x"
    out = smart.carried(before, after)
    assert out.train_loss == [2.3, 2.0, 1.8, 1.5, 1.2]
    assert out.progress.val_loss_curve == [(48, 1.9), (112, 1.1)] and out.progress.evaluations == 2  # not twice
    assert out.noise.gns_b_simple_ema == [5.0, 6.0, 7.0, 7.5, 8.0] and len(out.noise.gns_trace_sigma_per_step) == 5
    assert out.divergence.grad_norm == [3.0, 2.0, 1.0, 0.9, 0.8]
    assert out.divergence.spike_at_step == 4  # its own step 1, counted from the point's first
    assert (out.cost.optimizer_steps, out.cost.samples_seen) == (5, 112)
    # what this run spent stays its own: the ledger counts each run once
    assert (out.cost.train_seconds, out.cost.trial_seconds) == (0.8, 3.0)
    assert out.state.continued_from == "/ckpt/r1-x" and after.train_loss == [1.5, 1.2]


def test_the_ledger_counts_what_continuing_saved():
    ledger = smart.Ledger()
    ledger.continued_runs, ledger.continuation_saved = 2, 3.5
    assert ledger.metrics()["smart_continued_runs"] == 2
    assert ledger.metrics()["compute_continuation_saved_point_seconds"] == 3.5


# ---------------------------------------------------------------------------------------------------
# A point composed from its measurement runs


def measured(**sections) -> PointResult:
    result = PointResult(trial_key="x", device="cpu")
    for name, figures in sections.items():
        getattr(result, name).update(figures)
    return result


TP = measured(throughput=dict(samples_per_second=1000.0, step_time_seconds=0.032, throughput_stable=True),
              memory=dict(peak_memory_bytes=123456), cost=dict(trial_seconds=1.5, startup_seconds=0.4,
                                                               optimizer_steps=30))
REP = measured(accuracy=dict(val_accuracy=0.8765, val_loss=0.4321, val_loss_se=0.02, val_samples=360),
               progress=dict(evaluations=4, eval_seconds=0.8, reached_target=1, steps_to_target=20,
                             samples_to_target=640, time_to_target_seconds=9.0, eval_seconds_to_target=0.6),
               throughput=dict(samples_per_second=1.0, step_time_seconds=99.0),  # a rung run's: never copied
               memory=dict(peak_memory_bytes=1), cost=dict(optimizer_steps=45, samples_seen=1440, trial_seconds=5.0))
REP.train_loss = [2.3, 1.1]
CLASS = smart.classes([GridPoint(16, 2, 1, seed=0), GridPoint(32, 1, 1, seed=0)], coupled=False)[0]


def test_a_members_accuracy_is_its_representatives_exactly_and_its_throughput_its_layouts():
    unit = replace(CLASS.representative, seed=0)
    point = GridPoint(16, 2, 1, seed=0)
    out = smart.compose(point, TP, unit, REP, CLASS, rung=3, stopped=None)
    assert out.status == "ok" and out.trial_key == "mb16-acc2-w1-s0"
    for section in ("accuracy", "divergence", "noise"):
        assert getattr(out, section).to_flat() == getattr(REP, section).to_flat()  # every figure, bit for bit
    assert replace(out.progress, time_to_target_seconds=9.0) == REP.progress
    assert out.train_loss == REP.train_loss and out.cost.samples_seen == 1440 and out.cost.optimizer_steps == 45
    assert out.throughput == TP.throughput and out.memory == TP.memory
    assert out.cost.startup_seconds == 0.4 and out.cost.trial_seconds is None  # no run of its own
    # time to target: the representative's 20 steps at this layout's 0.032 s, plus its 0.6 s of evaluations
    assert out.progress.time_to_target_seconds == pytest.approx(20 * 0.032 + 0.6)
    assert out.progress.steps_to_target == 20 and out.progress.samples_to_target == 640
    tags = out.tags()
    assert tags["sweeper.accuracy_from"] == "r3-mb32-acc1-w1-s0"
    assert tags["sweeper.throughput_from"] == "tp-mb16-acc2-w1"
    assert tags["sweeper.accuracy_class"] == "gb32" and tags["sweeper.time_to_target"].startswith("derived")
    assert REP.progress.time_to_target_seconds == 9.0  # the representative's own record is untouched
    # two members of one class carry the same accuracy figures
    other = smart.compose(GridPoint(32, 1, 1, seed=0), TP, unit, REP, CLASS, 3, None)
    assert other.accuracy == out.accuracy and other.provenance.accuracy_from == out.provenance.accuracy_from


def test_a_stopped_or_failed_representative_marks_its_members():
    unit = replace(CLASS.representative, seed=0)
    stopped = smart.compose(GridPoint(16, 2, 1, seed=0), TP, unit, REP, CLASS, 1, "val loss 2 against 1")
    assert stopped.status == "stopped" and "rung 1: val loss 2 against 1" in stopped.error
    assert stopped.metrics()["stopped_at_rung"] == 1 and stopped.metrics()["stopped_at_samples"] == 1440
    assert stopped.tags()["sweeper.stopped"] == "val loss 2 against 1"
    diverged = replace(REP, status="diverged", error="loss nan at step 3")
    out = smart.compose(GridPoint(16, 2, 1, seed=0), TP, unit, diverged, CLASS, 1, None)
    assert out.status == "diverged" and "(in its class representative r1-mb32-acc1-w1-s0)" in out.error
    lost = smart.compose(GridPoint(16, 2, 1, seed=0), TP, unit, None, CLASS, 2, None)
    assert lost.status == "failed" and lost.throughput == TP.throughput


def test_a_class_that_ends_early_on_one_bad_seed_marks_its_ok_seeds_stopped():
    unit0, unit1 = replace(CLASS.representative, seed=0), replace(CLASS.representative, seed=1)
    spiked = replace(REP, status="diverged", error="spike")
    why = smart.ended_early([(unit0, REP), (unit1, spiked)])
    assert why.startswith("a seed of its class did not end ok") and "mb32-acc1-w1-s1" in why
    assert smart.compose(GridPoint(16, 2, 1, seed=0), TP, unit0, REP, CLASS, 2, why).status == "stopped"
    assert smart.compose(GridPoint(16, 2, 1, seed=1), TP, unit1, spiked, CLASS, 2, why).status == "diverged"
    assert smart.ended_early([(unit0, REP), (unit1, REP)]) is None  # every seed reached its target


# ---------------------------------------------------------------------------------------------------
# The compute ledger


def run_of(seconds, status="ok"):
    result = PointResult(status=status)
    result.cost.trial_seconds = seconds
    return result


def test_the_ledger_sums_point_seconds_by_phase():
    ledger = smart.Ledger(classes=3)
    for seconds in (1.0, 2.0):
        ledger.add(GridPoint(16, 1, 1), run_of(seconds))
    ledger.add(GridPoint(16, 1, 1, seed=0), run_of(4.0), "gb16")
    ledger.add(GridPoint(16, 1, 1, seed=0), run_of(8.0), "gb16")
    ledger.add(GridPoint(32, 1, 1, seed=0), run_of(16.0), "gb32")
    ledger.add(GridPoint(64, 1, 1, seed=0), run_of(None, "failed"), "gb64")
    ledger.stopped_classes.append("gb32")
    ledger.full_grid_estimate = 124.0
    assert ledger.metrics() == {
        "compute_throughput_point_seconds": 3.0, "compute_accuracy_point_seconds": 12.0,
        "compute_stopped_point_seconds": 16.0, "compute_point_seconds": 31.0,
        "full_grid_point_seconds_estimate": 124.0, "compute_fraction_of_full_grid": 0.25,
        "smart_measurement_runs": 6, "smart_accuracy_classes": 3, "smart_classes_stopped": 1,
        "smart_continued_runs": 0, "compute_continuation_saved_point_seconds": 0.0,
    }
    assert len(ledger.measured) == 6
    words = sections.compute_words(ledger.metrics())
    assert words.startswith("The sweep spent 31.0 point-seconds")
    assert "3.0 in the layouts' throughput and memory runs, 12.0 training the accuracy classes it kept and " \
           "16.0 in classes successive halving stopped early; 6 measurement runs, 1 of 3 accuracy classes" in words
    assert words.endswith("~124.0 point-seconds (estimated from the same runs: each point's budget at its layout's "
                          "measured step time, plus its evaluations): 25% of it.")
    assert sections.compute_words({"frontier_micro_batch_size_w1": 64.0}) == ""  # a grid sweep: no section


def test_the_full_grid_estimate_is_each_points_whole_budget_and_evaluations():
    point = GridPoint(16, 1, 1, seed=0)
    spec = PointSpec(model=ModelConfig(name="mlp"), data=DataConfig(name="digits"), train=TrainConfig(),
                     point=point, lr=0.1, steps=100)
    spec = replace(spec, eval=replace(spec.eval, every_samples=400))  # every 25 steps: 4 evaluations
    rung = measured(progress=dict(evaluations=2, eval_seconds=1.0))
    estimate = smart.full_grid_estimate([point], {point: spec}, {smart.layout(point): TP},
                                         {replace(point, seed=None): "gb16"}, {"gb16": [rung]})
    # its throughput run (1.5 s, 30 steps) + the other 70 steps at 0.032 s + 4 evaluations at 0.5 s
    assert estimate == pytest.approx(1.5 + 70 * 0.032 + 4 * 0.5)
    oom = replace(TP, status="oom")
    assert smart.full_grid_estimate([point], {point: spec}, {smart.layout(point): oom}, {}, {}) == 1.5
