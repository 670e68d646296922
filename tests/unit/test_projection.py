"""The answer beyond the sweep (report/projection.py and its parts): the throughput model's fit, predictions and
errors, goodput, the run at full length and the sweep's cost, the answer at report.target_workers, the headline
that says them in 3 lines, and the settings' checks. Every figure is worked out by hand in the comments."""

from functools import partial

import pytest
import yaml

from sweeper.config.report import ReportConfig, check
from sweeper.measure import sharded_memory
from sweeper.report import elastic, goodput, headline, projection, projection_sections, run_cost, target_cluster
from sweeper.report import throughput_model as tm
from sweeper.report.analysis import recommend
from sweeper.report.output import override_line
from sweeper.report.trials import summarize_all
from tests.helpers import trial

# The model the points below are made from: 10 ms per micro-step + 1 ms per sample of it + 5 ms per optimizer
# step, and with 2 workers DDP's all-reduce of 4e6 parameter bytes at 1 GB/s: 2 x (2-1)/2 x 4e6 = 4e6 bytes,
# 4 ms.
P = 4e6


point = partial(trial, lr=0.1, precision="fp32", activation_checkpointing="none", optimizer="sgd")


def exact(mb, acc, w, peak=None, **more):
    step = acc * (0.010 + 0.001 * mb) + 0.005 + (tm.comm_bytes_per_step("ddp", w, acc, P) * 1e-9)
    return point(mb, acc, w, samples_per_second=mb * acc * w / step, memory_parameters_bytes=P,
                 peak_memory_bytes=peak, val_accuracy=0.9, val_samples=1000, **more)


# step seconds:  mb16-acc1-w1 0.026 + 0.005 = 0.031 (516.1 samples/s); mb32-acc1-w1 0.047 (680.9);
# mb16-acc2-w1 2 x 0.026 + 0.005 = 0.057 (561.4); mb32-acc2-w1 0.089 (719.1); mb16-acc1-w2 0.031 + 0.004 = 0.035
# (914.3); mb32-acc2-w2 0.093 (1,376.3). Peaks: 1 MB per sample, DDP's buckets and held gradients 4 MB each.
POINTS = [exact(16, 1, 1, 100e6), exact(32, 1, 1, 116e6), exact(16, 2, 1, 104e6), exact(32, 2, 1, 120e6),
          exact(16, 1, 2, 104e6), exact(32, 2, 2, 124e6)]


def test_ring_collectives_move_what_each_parallelism_needs():
    # 4 workers, 1,000 parameter bytes: a ring moves 3/4 of a buffer per all-gather or reduce-scatter.
    assert tm.comm_bytes_per_step("ddp", 4, 2, 1000) == 1500  # one all-reduce: 2 x 750
    # ZeRO-3: one reduce-scatter (750) and per micro-step two all-gathers of bf16 weights (half the bytes):
    # 750 x (1 + 2 x 2 x 0.5) = 2,250.
    assert tm.comm_bytes_per_step("zero3", 4, 2, 1000, gather_ratio=0.5) == 2250
    assert tm.comm_bytes_per_step("zero2", 2, 3, 1000) == 2000  # 500 x (1 + 3 gathers)
    assert tm.comm_bytes_per_step("zero3", 1, 4, 1000) == 0  # one worker gathers nothing
    # ZeRO-1: DDP's all-reduce (1,500) and one broadcast of the updated weights, each rank's share (750): 2,250.
    assert tm.comm_bytes_per_step("zero1", 4, 2, 1000) == 2250
    # HSDP on one node is ZeRO-3 there: 750 x (1 + 2 x 2 x 0.5) = 2,250.
    assert tm.comm_bytes_per_step("hsdp", 4, 2, 1000, gather_ratio=0.5) == 2250


def test_the_model_recovers_its_own_coefficients_and_predicts_what_was_not_measured():
    model = tm.fit_all(POINTS)[tm.group_of(POINTS[0])]
    c = model.coefficients
    assert (c.fixed_seconds, c.per_sample_seconds, c.per_step_seconds) == pytest.approx((0.010, 0.001, 0.005))
    assert c.seconds_per_byte == pytest.approx(1e-9)
    assert model.within_error == pytest.approx(0.0, abs=1e-9)
    # mb64-acc1-w2, never measured: 0.010 + 0.064 + 0.005 + 0.004 = 0.083 s for 128 samples: 1,542.2 samples/s.
    got = model.predict(tm.Layout(64, 1, 2))
    assert got.samples_per_second == pytest.approx(128 / 0.083) and got.measured is None
    assert "leave-one-out over 6" in got.rule
    # 4 workers, beyond the largest measured (2): 2 x 3/4 x 4e6 = 6e6 bytes, 6 ms: 0.031 + 0.006 = 0.037 s for
    # 64 samples. Its error: predicting the 2-worker points from the 1-worker ones, which measured no
    # communication at all: unbounded.
    four = model.predict(tm.Layout(16, 1, 4))
    assert four.samples_per_second == pytest.approx(64 / 0.037)
    assert four.error is None and four.rule.startswith("unbounded")


def test_recorded_bytes_fit_what_the_parallelism_moves_once_and_per_micro_step():
    # ZeRO-3 of 4e6 parameter bytes (2e6 per worker at 2 workers; a share (2-1)/2 x 4e6 = 2e6), whose points
    # recorded what they moved: 1.5 shares at accumulation 1 (3e6 bytes), 2.5 at accumulation 2 (5e6), so half a
    # share once per step and one per micro-step, not the formula's 1 + 2 (FSDP2 keeps its root gathered). Step
    # seconds as above with those bytes at 1 GB/s: mb16-acc1-w2 0.031 + 0.003 = 0.034; mb32-acc2-w2 0.089 + 0.005.
    z3 = partial(point, suffix="-zero3", parallelism="zero3")
    ones = [z3(mb, acc, 1, samples_per_second=mb * acc / (acc * (0.010 + 0.001 * mb) + 0.005),
               memory_parameters_bytes=P) for mb, acc in ((16, 1), (32, 1), (16, 2), (32, 2))]
    twos = [z3(16, 1, 2, samples_per_second=32 / 0.034, memory_parameters_bytes=P / 2,
               communication_bytes_per_step=3e6),
            z3(32, 2, 2, samples_per_second=128 / 0.094, memory_parameters_bytes=P / 2,
               communication_bytes_per_step=5e6)]
    model = tm.fit_all(ones + twos)[tm.group_of(twos[0])]
    assert model.shares_moved == pytest.approx((0.5, 1.0))
    # Each 2-worker point left out takes its bytes from the other's record (the formula's 1 + 2 per micro-step
    # scaled to it: 1.5 / 3 or 2.5 / 5, half), as a layout never measured would: exact.
    assert model.within_error == pytest.approx(0.0, abs=1e-9)
    # mb16-acc4-w2, never measured: 4 x 0.026 + 0.005 = 0.109 s of compute and 2e6 x (0.5 + 4) = 9e6 bytes, 9 ms:
    # 128 samples in 0.118 s (the formula's 2e6 x (1 + 8) = 18e6 bytes would say 0.127 s).
    assert model.predict(tm.Layout(16, 4, 2)).samples_per_second == pytest.approx(128 / 0.118)


def test_a_given_interconnect_bounds_the_extrapolation_with_its_measured_error():
    # 8 Gb/s is 1 GB/s, the points' own: the 1-worker fit predicts the 2-worker points exactly.
    model = tm.fit_all(POINTS, interconnect_gbps=8)[tm.group_of(POINTS[0])]
    assert model.bandwidth_given and model.beyond_error == pytest.approx(0.0, abs=1e-9)
    assert model.predict(tm.Layout(16, 1, 8)).error == pytest.approx(0.0, abs=1e-9)
    # Half the bandwidth the points had (4 Gb/s: 2 ms per MB): the 2-worker points are predicted slower.
    # mb16-acc1-w2: 0.031 + 0.008 = 0.039 s against the measured 0.035: 0.035 / 0.039 - 1 = -10.3 %;
    # mb32-acc2-w2: 0.097 against 0.093: -4.1 %. The worst: 10.3 %.
    slow = tm.fit_all(POINTS, interconnect_gbps=4)[tm.group_of(POINTS[0])]
    assert slow.beyond_error == pytest.approx(1 - 0.035 / 0.039)


def test_workers_that_share_a_node_pay_a_contention_per_sample():
    # The same points, each 2-worker one also 0.5 ms slower per sample of its worker's share (cores shared):
    # mb16-acc1-w2 0.035 + 16 x 0.0005 = 0.043 s; mb32-acc2-w2 0.093 + 64 x 0.0005 = 0.125 s.
    shared = POINTS[:4] + [point(16, 1, 2, samples_per_second=32 / 0.043, memory_parameters_bytes=P),
                           point(32, 2, 2, samples_per_second=128 / 0.125, memory_parameters_bytes=P)]
    c = tm.fit_all(shared)[tm.group_of(shared[0])].coefficients
    assert c.contention_seconds_per_sample == pytest.approx(0.0005) and c.seconds_per_byte == pytest.approx(1e-9)
    # mb64-acc1-w2: 0.083 + 64 x 0.0005 = 0.115 s for 128 samples.
    model = tm.fit_all(shared)[tm.group_of(shared[0])]
    assert model.predict(tm.Layout(64, 1, 2)).samples_per_second == pytest.approx(128 / 0.115)


def test_leave_one_out_errors_worked_by_hand():
    # Three 1-worker points without accumulation (the per-micro-step and per-step costs are one term here):
    # step seconds 0.020, 0.030, 0.045 at micro-batches 10, 20, 30 (500, 666.7, 666.7 samples/s).
    pts = [trial(m, 1, 1, samples_per_second=m / s) for m, s in ((10, 0.020), (20, 0.030), (30, 0.045))]
    model = tm.fit_all(pts)[tm.group_of(pts[0])]
    # Without mb30: the line through (10, 0.020) and (20, 0.030), 0.010 + 0.001 m, gives 0.040 at 30:
    # 750 samples/s against 666.7: +12.5 %. Without mb10: through (20, 0.030) and (30, 0.045), 0.0015 m, gives
    # 0.015 at 10: 666.7 against 500: +33.3 %. Without mb20: 0.0075 + 0.00125 m gives 0.0325: 615.4 against
    # 666.7: -7.7 %.
    assert model.loo_errors == pytest.approx({"mb30-acc1-w1": 0.125, "mb10-acc1-w1": 1 / 3,
                                              "mb20-acc1-w1": 0.030 / 0.0325 - 1})
    assert model.within_error == pytest.approx(1 / 3) and model.within_median == pytest.approx(0.125)
    assert model.predict(tm.Layout(40, 1, 1)).error == pytest.approx(1 / 3)


def test_data_bound_points_are_left_out_of_the_fit():
    # mb64-acc1-w1 waited 30 ms of a 50 ms step on data (60 %, over the 50 % limit: data-bound, as
    # report/data_bound names it): an input pipeline's figure.
    slow = point(64, 1, 1, samples_per_second=64 / 0.050, data_seconds_per_step=0.030)
    model = tm.fit_all(POINTS[:4] + [slow])[tm.group_of(slow)]
    assert "mb64-acc1-w1" in model.excluded and "60%" in model.excluded["mb64-acc1-w1"]
    assert model.coefficients.per_sample_seconds == pytest.approx(0.001)
    # data_wait_fraction (the streamed data's recorded share) wins over the figure worked from data_seconds_per_step
    streamed = trial(64, 1, 1, samples_per_second=64 / 0.050, data_seconds_per_step=0.030, data_wait_fraction=0.3)
    assert tm.data_bound(streamed) is None
    assert "70%" in tm.data_bound(trial(64, 1, 1, samples_per_second=64 / 0.050, data_wait_fraction=0.7))
    # A point whose timed windows spread 47 % measured the machine's other load: left out too, and said so.
    noisy = point(64, 1, 1, samples_per_second=500.0, samples_per_second_cv=0.47)
    assert tm.fit_all(POINTS[:4] + [noisy])[tm.group_of(noisy)].excluded == {
        "mb64-acc1-w1": "noisy: its timed windows' throughput spread 47% (over 25%)"}


def test_worker_counts_predicted_are_measured_powers_of_two_the_limit_and_the_target():
    assert tm.worker_counts([1, 2, 3], 64, [48]) == [1, 2, 3, 4, 8, 16, 32, 48, 64]
    assert tm.worker_counts([1, 2], None) == [1, 2]


# --- goodput -------------------------------------------------------------------------------------


def test_goodput_ranks_layouts_by_predicted_time_to_the_target():
    # B_noise 64, base batch 16: efficiency (64 + 16) / (64 + B): 1 at 16, 80/128 = 0.625 at 64, 80/320 = 0.25
    # at 256. 4,000 samples to the target measured at 16: E(B) = 4,000 / efficiency: 6,400 at 64, 16,000 at
    # 256 (McCandlish: E_min = 4,000 / (1 + 16/64) = 3,200; E(64) = 3,200 x 2).
    noise = goodput.NoiseScale(64.0, "test")
    anchor = goodput.Anchor(16, 4000.0, "mb16")
    cands = [goodput.Candidate("mb16", 16, 400.0), goodput.Candidate("mb64", 64, 1000.0),
             goodput.Candidate("mb256", 256, 2000.0)]
    ranked = goodput.rank(cands, noise, anchor)
    # Seconds: 4,000 / 400 = 10; 6,400 / 1,000 = 6.4; 16,000 / 2,000 = 8. Goodput: 400, 625, 500.
    assert [r.candidate.key for r in ranked] == ["mb64", "mb256", "mb16"]
    assert [r.predicted_seconds for r in ranked] == pytest.approx([6.4, 8.0, 10.0])
    assert [r.goodput for r in ranked] == pytest.approx([625.0, 500.0, 400.0])
    assert [r.predicted_samples for r in ranked] == pytest.approx([6400.0, 16000.0, 4000.0])


def test_without_an_anchor_layouts_rank_by_goodput_and_a_branch_sweep_s_critical_batch_wins():
    ranked = goodput.rank([goodput.Candidate("a", 16, 400.0), goodput.Candidate("b", 64, 1000.0)],
                          goodput.NoiseScale(64.0, "test"))
    assert [r.candidate.key for r in ranked] == ["b", "a"] and ranked[0].predicted_seconds is None
    assert goodput.noise_scale(30.0, 512.0).value == 512.0 and "branches" in goodput.noise_scale(30.0, 512).source
    assert goodput.noise_scale(30.0).value == 30.0 and goodput.noise_scale(None) is None


def test_rank_correlation_by_hand():
    # ranks 1 2 3 4 against 1 2 4 3: d^2 = 2, rho = 1 - 6 x 2 / (4 x 15) = 0.8
    assert goodput.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert goodput._ranks([5, 5, 7]) == [1.5, 1.5, 3.0]
    assert goodput.spearman([1, 2], [1, 2]) is None


# --- the run and the sweep's cost ----------------------------------------------------------------


def test_the_runs_wall_time_device_hours_and_price_by_hand():
    best = trial(32, 1, 2, samples_per_second=500.0, evaluations=2, eval_seconds=3.0)
    run = run_cost.run_cost(best, 1e6, every_samples=10000, checkpoint_write=2.0, price=3.0)
    # Evaluations every ceil(10,000 / 64) x 64 = 10,048 samples: 99 on the way (994,752 samples), one at the
    # end: 100, at 3.0 / 2 = 1.5 s each: 150 s; a checkpoint with each, 2 s: 200 s. Training 1e6 / 500 = 2,000 s.
    assert (run.evaluations, run.eval_seconds, run.checkpoints, run.checkpoint_seconds) == (100, 150.0, 100, 200.0)
    assert run.wall_seconds == pytest.approx(2350.0)
    assert run.device_hours == pytest.approx(2 * 2350 / 3600)  # 1.3056
    assert run.price == pytest.approx(3 * 2 * 2350 / 3600)  # 3.9167
    bare = run_cost.run_cost(trial(32, 1, 2, samples_per_second=500.0), 1e6, None, None)
    assert bare.wall_seconds == 2000.0 and len(bare.notes) == 2  # neither evaluations nor checkpoints measured


def test_the_sweeps_own_device_hours_count_every_run_once():
    rows = [{"role": "trial", "num_workers": "2", "trial_seconds": 30.0, "worker_group_startup_seconds": 10.0},
            {"role": "trial", "num_workers": "1", "trial_seconds": 20.0},
            {"role": "probe", "num_workers": "1", "trial_seconds": 5.0}, {"role": "trial", "num_workers": "1"}]
    assert run_cost.sweep_device_seconds(rows) == 2 * 40 + 20 + 5
    # smart's points are composed from measurement runs: those count, the points not again.
    smart = [{"role": "trial", "num_workers": "1", "trial_seconds": 100.0},
             {"role": "throughput", "num_workers": "2", "trial_seconds": 10.0},
             {"role": "rung", "num_workers": "1", "trial_seconds": 30.0}]
    assert run_cost.sweep_device_seconds(smart) == 2 * 10 + 30
    assert run_cost.sweep_device_seconds([{"role": "trial"}]) is None


def test_the_runs_time_to_the_target_where_measured_and_unknown_elsewhere():
    reached = partial(trial, evaluations=4, eval_seconds=2.0, reached_target=True)
    pts = summarize_all([
        reached(16, 1, 1, samples_per_second=400.0, samples_to_target=3200, time_to_target_seconds=9.0),
        reached(16, 2, 1, samples_per_second=450.0, samples_to_target=4000, time_to_target_seconds=9.5),
        reached(32, 1, 1, samples_per_second=500.0, samples_to_target=5000, time_to_target_seconds=11.0),
        trial(64, 1, 1, samples_per_second=800.0, reached_target=False),
    ]).values()
    rows = {r.global_batch: r for r in run_cost.to_target(list(pts), every_samples=1000)}
    # Global batch 32: its fastest point that reached it, mb32-acc1-w1 at 500/s (not mb16-acc2-w1 at 450/s), with
    # its own 5,000 samples: 10 s, and floor(5,000 / 1,024) = 4 evaluations on the way at 2.0 / 4 = 0.5 s: 12 s.
    assert rows[32].key == "mb32-acc1-w1" and rows[32].seconds == pytest.approx(12.0)
    assert rows[16].seconds == pytest.approx(3200 / 400 + 3 * 0.5)  # every 1,008 samples: 3 on the way
    assert rows[64].key is None and rows[64].seconds is None  # never reached: unknown


def test_points_that_stopped_at_the_target_untimed_still_give_its_time_and_rank_by_goodput():
    # eval.stop_at_target ends a point before a throughput window is timed: its rate to the target is its samples
    # over its measured time to it (evaluations included): 1,600 / 8 = 200/s at 8 and 3,200 / 4 = 800/s at 64.
    stopped = partial(trial, reached_target=True, gns_b_simple=64.0)
    pts = [stopped(8, 1, 1, samples_to_target=1600, time_to_target_seconds=8.0),
           stopped(8, 8, 1, samples_to_target=3200, time_to_target_seconds=4.0)]
    rows = {r.global_batch: r for r in run_cost.to_target(list(summarize_all(pts).values()), every_samples=256)}
    assert (rows[8].seconds, rows[64].seconds) == (8.0, 4.0)
    proj = projection.project(recommend(pts, "time_to_target"), pts, ReportConfig(objective="time_to_target"),
                              {"eval_every_samples": "256"})
    # B_noise 64, anchor 1,600 samples at 8: (64 + 8) / (64 + 64) = 0.5625 at 64, so 2,844 samples at 800/s: 3.6 s.
    assert [r.candidate.key for r in proj.ranked] == ["mb8-acc8-w1", "mb8-acc1-w1"]
    assert proj.ranked[0].predicted_seconds == pytest.approx(1600 / 0.5625 / 800)
    assert proj.ranked[0].candidate.throughput_from == "measured to the target"


# --- a cluster you do not have --------------------------------------------------------------------


def test_the_answer_at_eight_workers_keeps_the_global_batch_with_predicted_throughput_and_memory():
    rec = recommend(POINTS, "throughput")
    best = rec.best  # mb32-acc2-w2: 1,376 samples/s, global batch 128
    assert best.key == "mb32-acc2-w2"
    proj = projection.project(rec, POINTS, ReportConfig(target_workers=8, run_samples=1_000_000),
                              {"micro_batch_sizes": "[16, 32]", "interconnect_gbps": "8"})
    t = proj.target
    # 128 / 8 = 16 per worker: micro-batch 16 without accumulation. 0.031 s of compute + 2 x 7/8 x 4e6 bytes at
    # 1 GB/s (7 ms): 0.038 s for 128 samples, 3,368 samples/s.
    assert (t["micro_batch_size"], t["accumulation_steps"]) == (16, 1)
    assert t["samples_per_second"] == pytest.approx(128 / 0.038) and t["prediction"] is True
    # Memory from mb16-acc1-w2 (no accumulation, more than one worker, the same micro-batch): 104 MB; DDP's
    # memory does not grow with workers beyond its buckets, already there.
    assert t["peak_memory_bytes"] == 104_000_000
    # Its error, each measured point predicted from its nearest other: the worst, mb16-acc1-w1 from mb32-acc1-w1
    # with no slope left at one worker and no accumulation: 116 / 100 - 1 = 16 %.
    assert t["memory_error"] == pytest.approx(0.16)
    # The run there: 1e6 / 3,368.4 = 296.9 s on 8 workers: 0.66 device-hours.
    assert proj.target_run.device_hours == pytest.approx(8 * 1e6 / (128 / 0.038) / 3600)
    budget = target_cluster.at_target(best, 8, proj.models[tm.group_of(best)], proj.memory, [16, 32], 50e6)
    assert budget["why"].startswith("no micro-batch that divides the share fits the budget")
    assert "not a multiple" in target_cluster.at_target(best, 3, None, None, [16], None)["why"]


def test_a_sharded_models_memory_moves_by_its_states_from_its_units():
    units = [sharded_memory.Unit("block0", ((256, 256), (256,))), sharded_memory.Unit("block1", ((256, 256), (256,))),
             sharded_memory.Unit("root", ((10, 256),))]
    assert target_cluster.decode_units(target_cluster.encode_units(units)) == units
    assert target_cluster.encode_units(units) == "[[2,[[256,256],[256]]],[1,[[10,256]]]]"
    z3 = partial(trial, suffix="-zero3", parallelism="zero3", optimizer="adamw", precision="fp32",
                 activation_checkpointing="none")
    ref = z3(8, 1, 2, samples_per_second=100.0, peak_memory_bytes=5e6)
    memory = target_cluster.MemoryModel("zero3", (ref,), None, units, None, 2)
    at8 = sharded_memory.peak(units, "zero3", 8, 8, 1, 0.0).total
    at2 = sharded_memory.peak(units, "zero3", 2, 8, 1, 0.0).total
    assert memory.predict(8, 1, 8) == pytest.approx(5e6 + at8 - at2) and at8 < at2
    assert target_cluster.MemoryModel("zero3", (ref,), None, None).predict(8, 1, 8) is None  # no units: unknown


# --- the headline, the YAML, the elastic plan, the checks -----------------------------------------


def test_the_headline_gives_the_run_and_the_sweeps_share_in_three_lines():
    rec = recommend(POINTS, "throughput")
    rows = [{"role": "trial", "num_workers": "2", "trial_seconds": 36.0}]
    proj = projection.project(rec, POINTS, ReportConfig(run_samples=10_000_000, price_per_device_hour=2.0), {},
                              rows)
    # 1e7 / 1,376.3 samples/s = 7,266 s = 2.0 h on 2 workers: 4.04 device-hours, price 8.07; the sweep 72
    # device-seconds, 0.02 device-hours: 0.5 % of the run.
    assert proj.run.device_hours == pytest.approx(2 * 1e7 / (128 / 0.093) / 3600)
    assert proj.share_of_run == pytest.approx(0.02 / proj.run.device_hours)
    line = override_line(rec.best)
    run_line = projection.run_override(line, proj)
    assert run_line.endswith(" train.samples=10000000")
    lines = headline.headline(rec, line, run=(lambda d: projection.run_words(proj, d), run_line))
    assert len(lines) <= 3 and all(len(x) <= 120 for x in lines)
    said = " ".join(lines)
    assert "4.0 device-h" in said and "price 8.1" in said and "sweep 0.020 device-h (0.5%)" in said
    assert "train.samples=10000000" in said
    doc = yaml.safe_load(yaml.safe_dump(projection_sections.yaml_blocks(proj, line)))
    assert doc["run"]["overrides"] == run_line and doc["sweep_cost"]["device_hours"] == pytest.approx(0.02)
    assert doc["throughput_model"]["prediction"] is True
    assert projection.metrics(proj)["run_device_hours"] == pytest.approx(proj.run.device_hours)


def test_the_elastic_plans_predicted_rows_come_from_the_model_with_their_error():
    pts = [exact(32, 4, 1, 100e6), exact(32, 1, 4, 104e6), exact(16, 1, 1, 84e6), exact(16, 1, 4, 88e6)]
    rec = recommend(pts, "throughput")
    proj = projection.project(rec, pts, ReportConfig(), {})
    found = elastic.plan(pts, pts[1], predict=proj.elastic_predictor())
    two = {r["num_workers"]: r for r in found["rows"]}[2]
    # 128 / 2 = 64 per worker: micro-batch 32 x 2. Its step: 2 x 0.042 + 0.005 + DDP's 4e6 bytes (4 ms) = 0.093 s.
    assert (two["micro_batch_size"], two["accumulation_steps"], two["source"]) == (32, 2, "predicted")
    assert two["samples_per_second"] == pytest.approx(128 / 0.093)
    assert "samples_per_second_error" in two and "throughput model" in two["why"]


def test_bad_run_settings_are_refused_with_the_key_and_the_fix():
    problems = check(ReportConfig(run_samples=0, run_tokens=2.5, price_per_device_hour=-1.0, target_workers=0))
    text = "\n".join(problems)
    for key in ("report.run_samples=0", "report.run_tokens=2.5", "report.price_per_device_hour=-1.0",
                "report.target_workers=0", "both set"):
        assert key in text
    assert check(ReportConfig(run_samples=1e6, max_workers=64, target_workers=64, price_per_device_hour=0)) == []
