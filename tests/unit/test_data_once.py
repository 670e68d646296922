"""The data built once: a data factory is called once by the check and preflight together, and a worker group
handed the driver's copy (cluster.shared_data) does not call it again. Counted calls, not time."""

from __future__ import annotations

import threading

import torch
from torch.utils.data import TensorDataset

from sweeper.cluster import shared_data
from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.driver.preflight import preflight
from sweeper.plan import GridPoint
from sweeper.worker.points import run_points
from sweeper.worker.spec import WorkerContext
from sweeper.workloads import datasets
from tests.harness import typed_cfg
from tests.helpers import point_spec

def counted_data(log: str, n: int = 256):
    """A data factory that counts its calls, a line each in the file `log` (a real one tokenizes or reads a
    corpus each time). A file: Hydra imports this module under its dotted name, pytest under its own."""
    with open(log, "a") as f:
        f.write("called\n")
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator)
    return TensorDataset(x[:200], y[:200]), TensorDataset(x[200:], y[200:])


def calls(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_the_check_and_preflight_call_a_data_factory_once(tmp_path):
    log = tmp_path / "calls"
    cfg = typed_cfg("model=mlp", "model.input_shape=[1,8,8]", "data=custom",
                    "data._target_=tests.unit.test_data_once.counted_data", f"+data.kwargs.log={log}",
                    "sweep.micro_batch_sizes=[8,16]",
                    "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]", "train.epochs=2",
                    "measure.warmup_steps=2", "measure.windows=2", "measure.stable_windows=2")
    prepared, specs = preflight(cfg)
    assert calls(log) == 1 and prepared.num_train == 200 and prepared.num_val == 56 and len(specs) == 2
    assert datasets.built(cfg.data, cfg.model.input_shape).train is datasets.built(cfg.data, [1, 8, 8]).train
    assert calls(log) == 1  # asked again (the cluster's shared data, another shape): the driver's copy


def test_a_worker_group_given_the_drivers_data_does_not_build_it(tmp_path):
    log = tmp_path / "calls"
    data = DataConfig(name="custom", _target_="tests.unit.test_data_once.counted_data", kwargs={"log": str(log)})
    model = ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=2, width=16)
    splits = datasets.load(data, model.input_shape)  # the driver's one call
    specs = [point_spec(GridPoint(m, 1, 1), model, data, lr=0.05, steps=4, train=TrainConfig(seed=0),
                        measure=MeasureConfig(warmup_steps=1, windows=2, stable_windows=2, memory_breakdown=False,
                                              flops=False), evaluate=False) for m in (8, 16)]
    reports = []
    run_points(specs, WorkerContext(), reports.append, data={datasets.key(data, model.input_shape): splits})
    assert [r.status for r in reports] == ["ok", "ok"] and calls(log) == 1
    run_points(specs[:1], WorkerContext(), reports.append)  # not handed it: the group builds its own, as before
    assert calls(log) == 2


def test_data_is_shared_only_when_it_pickles_within_the_limit():
    small = TensorDataset(torch.zeros(10, 4))
    assert shared_data._fits(small, 1 << 20)
    assert not shared_data._fits(TensorDataset(torch.zeros(1 << 18, 4)), 1 << 20)  # 4 MiB of floats over 1 MiB
    assert not shared_data._fits(threading.Lock(), 1 << 20)  # a lock does not pickle: each group builds its own
