"""The training step's semantics: accumulation and data parallelism give the same global-batch step."""

import datetime
import os
import time
from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._subclasses.fake_tensor import is_fake

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.worker.evaluate import recalibrate_batchnorm
from sweeper.worker.points import run_points
from sweeper.worker import train as train_module
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.train import train_point
from tests.harness import free_port
from tests.helpers import forwards_take, point_spec, wait_for

MLP = ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=3, width=32)
DIGITS = DataConfig(name="digits")
TRAIN = TrainConfig(seed=3)
MEASURE = MeasureConfig(warmup_steps=2, windows=3, flops=False)
STEPS = 12


spec = partial(point_spec, model=MLP, data=DIGITS, train=TRAIN, measure=MEASURE, lr=0.1, steps=STEPS)


def test_same_global_batch_gives_same_loss_curve_in_one_process():
    a = train_point(spec(GridPoint(8, 4, 1)), WorkerContext())["train_loss"]
    b = train_point(spec(GridPoint(16, 2, 1)), WorkerContext())["train_loss"]
    c = train_point(spec(GridPoint(32, 1, 1)), WorkerContext())["train_loss"]
    assert len(a) == STEPS
    assert a[-1] < a[0]  # it learns
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(c), rtol=1e-5, atol=1e-6)


def test_different_global_batch_gives_a_different_curve():
    a = train_point(spec(GridPoint(8, 4, 1)), WorkerContext())["train_loss"]
    b = train_point(spec(GridPoint(8, 2, 1)), WorkerContext())["train_loss"]
    assert abs(a[-1] - b[-1]) > 1e-4


def test_result_has_measurements_and_accuracy():
    r = train_point(spec(GridPoint(16, 1, 1)), WorkerContext())
    assert r["optimizer_steps"] == STEPS and r["samples_seen"] == STEPS * 16
    assert r["samples_per_second"] > 0 and r["step_time_seconds"] > 0
    assert len(r["window_samples_per_second"]) == 3 and r["timing_windows"] == 3
    assert 0.0 <= r["val_accuracy"] <= 1.0
    assert r["peak_memory_bytes"] >= 0


def test_synthetic_data_reports_no_accuracy():
    r = train_point(spec(GridPoint(16, 1, 1), data=DataConfig(name="synthetic", num_samples=256)), WorkerContext())
    assert "val_accuracy" not in r


def _gloo_worker(rank, world_size, port, points, out, model=MLP):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    reports = []
    try:
        run_points([spec(p, model=model) for p in points], WorkerContext(rank=rank, world_size=world_size),
                   reports.append)
        out[rank] = reports
    finally:
        dist.destroy_process_group()


def test_a_two_rank_worker_group_matches_one_process_and_runs_smaller_points_on_its_first_rank():
    torch.set_num_threads(1)
    single = train_point(spec(GridPoint(8, 4, 1)), WorkerContext())["train_loss"]
    points = [GridPoint(8, 4, 1), GridPoint(8, 2, 2)]  # global batch 32 both: one curve
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gloo_worker, args=(2, free_port(), points, out), nprocs=2)
        rank0, rank1 = out[0], out[1]
    assert [r["trial_key"] for r in rank0] == ["mb8-acc4-w1", "mb8-acc2-w2"]
    assert all(r["status"] == "ok" for r in rank0)
    # Rank 1 waited out the 1-worker point and trained the 2-worker one, agreeing with rank 0.
    assert rank1[0]["status"] == "idle" and rank1[1]["train_loss"] == rank0[1]["train_loss"]
    for result in rank0:
        torch.testing.assert_close(torch.tensor(single), torch.tensor(result["train_loss"]), rtol=1e-5, atol=1e-6)


class SmallBatchNormNet(torch.nn.Module):
    """A conv net with BatchNorm: its training depends on which samples share a micro-batch, and its
    evaluation on the running statistics."""

    def __init__(self, num_classes):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(8 * 8 * 8, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


BN_NET = ModelConfig(name="bnnet", _target_="tests.unit.test_training.SmallBatchNormNet", input_shape=[1, 8, 8])


def test_accumulation_and_two_ranks_train_and_score_a_batchnorm_model_alike():
    torch.set_num_threads(1)
    single = train_point(spec(GridPoint(8, 2, 1), model=BN_NET), WorkerContext())
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gloo_worker, args=(2, free_port(), [GridPoint(8, 1, 2)], out, BN_NET), nprocs=2)
        (pair,) = out[0]
    # The same samples share each micro-batch, so BatchNorm normalizes the same groups: one curve.
    torch.testing.assert_close(torch.tensor(single["train_loss"]), torch.tensor(pair["train_loss"]),
                               rtol=1e-5, atol=1e-6)
    # Running statistics re-estimated from the trained weights: the same model scores the same,
    # although accumulation took two running-average updates per step and the pair kept one.
    assert single["bn_recalibration_samples"] == pair["bn_recalibration_samples"] == 1024
    # (Weights agree to float summation order, so at most one of the 359 validation digits may flip.)
    assert single["val_accuracy"] == pytest.approx(pair["val_accuracy"], abs=1.01 / 359)


def test_recalibration_is_the_plain_average_of_the_chosen_samples():
    data = torch.utils.data.TensorDataset(torch.randn(100, 3) * 2 + 5, torch.zeros(100, dtype=torch.long))
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    model.eval()
    device = torch.device("cpu")
    assert recalibrate_batchnorm(model, data, micro_batch_size=8, samples=50, seed=1, device=device) == 48
    chosen = data.tensors[0][torch.randperm(100, generator=torch.Generator().manual_seed(1))[:48]]
    bn = model[0]
    torch.testing.assert_close(bn.running_mean, chosen.mean(0))  # equal batches: mean of means
    batch_vars = torch.stack([chosen[i : i + 8].var(0) for i in range(0, 48, 8)])
    torch.testing.assert_close(bn.running_var, batch_vars.mean(0))
    assert not model.training and bn.momentum == 0.1  # left as it was found
    assert recalibrate_batchnorm(model, data, 8, samples=0, seed=1, device=device) == 0
    # A micro-batch larger than the sample count still gets one whole micro-batch, not none.
    assert recalibrate_batchnorm(model, data, micro_batch_size=64, samples=50, seed=1, device=device) == 64
    assert recalibrate_batchnorm(model, data, micro_batch_size=128, samples=50, seed=1, device=device) == 100
    assert recalibrate_batchnorm(torch.nn.Linear(3, 2), data, 8, samples=50, seed=1, device=device) == 0


class FailsOnRankOne(torch.nn.Module):
    """Bad model code that breaks on one rank only: the other rank is left inside a collective."""

    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        if self.training and dist.get_rank() == 1:
            raise ValueError("rank 1 broke")
        return self.linear(x.flatten(1))


def _lonely_failure_worker(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = ModelConfig(name="fails", _target_="tests.unit.test_training.FailsOnRankOne", input_shape=[1, 8, 8])
    try:
        run_points([spec(GridPoint(8, 2, 2), model=model)], WorkerContext(rank=rank, world_size=2), lambda r: None,
                   status_timeout=datetime.timedelta(seconds=5))
    finally:
        dist.destroy_process_group()


def test_a_failure_on_one_rank_ends_the_group_instead_of_hanging_it():
    # A hung group never ends: wait for its end, far longer than the 5 s status timeout it needs (a
    # group left waiting in gloo's collective would hang for gloo's 30 minutes, past this test's limit).
    group = mp.spawn(_lonely_failure_worker, args=(free_port(),), nprocs=2, join=False)
    with pytest.raises(mp.ProcessRaisedException, match="rank 1 broke|Connection closed|timed out"):
        wait_for(lambda: group.join(timeout=1), "the worker group to end", timeout=180, every=0)


class Sleepy(torch.nn.Module):
    """A model whose forward takes a known time: 20 ms per micro-batch, whatever the batch. With
    `started` (a path, through model.kwargs), its first training forward on real tensors (not the
    driver's fake-tensor estimate) creates that file: an end-to-end test waits on it to know the
    sweep's first point is training."""

    def __init__(self, num_classes, started=None):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)
        self.started = started

    def forward(self, x):
        if self.started is not None and self.training and not is_fake(x):
            open(self.started, "a").close()
            self.started = None
        time.sleep(0.02)
        return self.linear(x.flatten(1))


def test_throughput_and_phases_are_a_step_of_known_duration(monkeypatch):
    # Every training forward takes 1/64 s on the loop's clock (tests.helpers.forwards_take: the clock
    # moves with the forwards only, so the answer is exact whatever else the machine does).
    forwards_take(monkeypatch, 2 ** -6, train_module, training_only=True)
    s = PointSpec(
        model=MLP, data=DIGITS, train=TRAIN, measure=MeasureConfig(warmup_steps=2, windows=3, stable_windows=3,
                                                                  stability_tolerance=0.2, flops=False),
        point=GridPoint(8, 2, 1), lr=0.1, steps=14,
    )
    r = train_point(s, WorkerContext())
    # A step is 2 micro-batches of 8: two forwards, 2/64 = 0.03125 s, for 16 samples: 16 / 0.03125 = 512
    # samples/s in every window. Loading a micro-batch and the optimizer's step move no forward: 0 s.
    assert r["samples_per_second"] == 512.0 and r["window_samples_per_second"] == [512.0] * 3
    assert r["step_time_seconds"] == 0.03125
    assert r["throughput_stable"] and r["stable_windows_used"] == 3
    assert r["forward_backward_seconds_per_step"] == 0.03125
    assert r["data_seconds_per_step"] == 0.0 and r["optimizer_seconds_per_step"] == 0.0


def _oom_worker(rank, port, budget, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    reports = []
    try:
        specs = [replace(spec(GridPoint(m, 1, 2)), memory_budget_bytes=budget, steps=6) for m in (8, 64, 128)]
        run_points(specs, WorkerContext(rank=rank, world_size=2), reports.append)
        out[rank] = reports
    finally:
        dist.destroy_process_group()


def test_simulated_oom_on_both_ranks_is_agreed_and_the_group_goes_on():
    one = {m: train_point(replace(spec(GridPoint(m, 1, 1)), steps=4), WorkerContext())["memory_tracked_peak_bytes"]
           for m in (8, 64)}
    budget = one[64]  # DDP's buckets put 64 samples on 2 workers over it; 8 samples stay under
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_oom_worker, args=(free_port(), budget, out), nprocs=2)
        ranks = [out[0], out[1]]
    for reports in ranks:
        assert [(r["trial_key"], r["status"]) for r in reports] == [
            ("mb8-acc1-w2", "ok"), ("mb64-acc1-w2", "oom"), ("mb128-acc1-w2", "oom")
        ]
        assert reports[1]["oom_simulated"] is True and reports[2]["oom_implied_by"] == "mb64-acc1-w2"
        assert reports[0]["memory_tracked_peak_bytes"] <= budget
