"""The training step's semantics: accumulation and data parallelism give the same global-batch step."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.training import TrialSpec, WorkerContext, run_trial

MLP = ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=3, width=32)
DIGITS = DataConfig(name="digits")
TRAIN = TrainConfig(lr=0.1, seed=3)
MEASURE = MeasureConfig(warmup_steps=2, windows=3, flops=False)
STEPS = 12


def spec(point: GridPoint, model=MLP, data=DIGITS) -> TrialSpec:
    return TrialSpec(model=model, data=data, train=TRAIN, measure=MEASURE, point=point, lr=TRAIN.lr, steps=STEPS)


def test_same_global_batch_gives_same_loss_curve_in_one_process():
    a = run_trial(spec(GridPoint(8, 4, 1)), WorkerContext())["train_loss"]
    b = run_trial(spec(GridPoint(16, 2, 1)), WorkerContext())["train_loss"]
    c = run_trial(spec(GridPoint(32, 1, 1)), WorkerContext())["train_loss"]
    assert len(a) == STEPS
    assert a[-1] < a[0]  # it learns
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(c), rtol=1e-5, atol=1e-6)


def test_different_global_batch_gives_a_different_curve():
    a = run_trial(spec(GridPoint(8, 4, 1)), WorkerContext())["train_loss"]
    b = run_trial(spec(GridPoint(8, 2, 1)), WorkerContext())["train_loss"]
    assert abs(a[-1] - b[-1]) > 1e-4


def test_result_has_measurements_and_accuracy():
    r = run_trial(spec(GridPoint(16, 1, 1)), WorkerContext())
    assert r["optimizer_steps"] == STEPS and r["samples_seen"] == STEPS * 16
    assert r["samples_per_second"] > 0 and r["step_time_seconds"] > 0
    assert len(r["window_samples_per_second"]) == 3 and r["timing_windows"] == 3
    assert 0.0 <= r["val_accuracy"] <= 1.0
    assert r["peak_memory_bytes"] >= 0


def test_synthetic_data_reports_no_accuracy():
    r = run_trial(spec(GridPoint(16, 1, 1), data=DataConfig(name="synthetic", num_samples=256)), WorkerContext())
    assert "val_accuracy" not in r


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(rank, world_size, port, point, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = run_trial(spec(point), WorkerContext(rank=rank, world_size=world_size))
        out[rank] = result["train_loss"]
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_accumulation_in_one_process():
    torch.set_num_threads(1)
    single = run_trial(spec(GridPoint(8, 4, 1)), WorkerContext())["train_loss"]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gloo_worker, args=(2, _free_port(), GridPoint(8, 2, 2), out), nprocs=2)
        rank0, rank1 = out[0], out[1]
    assert rank0 == rank1  # every rank reports the same global loss
    torch.testing.assert_close(torch.tensor(single), torch.tensor(rank0), rtol=1e-5, atol=1e-6)
