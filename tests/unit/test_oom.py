"""Out of memory as a result: the simulated CPU budget, implied OOMs, the frontier search on a real
model against exhaustive search, and the fake-tensor estimate against measurement."""

import gc
from dataclasses import replace

import pytest
import torch

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.measure import memory, telemetry
from sweeper.plan import GridPoint
from sweeper.worker.points import implied_oom, run_point, run_points
from sweeper.worker.probes import run_frontier
from sweeper.worker.spec import FrontierSpec, PointSpec, WorkerContext
from sweeper.workloads import datasets as data_mod
from sweeper.workloads import models
from tests.helpers import point_spec

MLP = ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=3, width=64)
DATA = DataConfig(name="synthetic", num_samples=1024)
TRAIN = TrainConfig(seed=3)
MEASURE = MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, flops=False)


def spec(micro: int, accum: int = 1, budget=None, steps: int = 4, model=MLP) -> PointSpec:
    return point_spec(GridPoint(micro, accum, 1), model, DATA, lr=0.1, steps=steps, train=TRAIN, measure=MEASURE,
                      memory_budget_bytes=budget)


def tracked_peak(micro: int, model=MLP) -> int:
    result = run_point(spec(micro, steps=MEASURE.warmup_steps, model=model), WorkerContext())
    assert result["status"] == "ok", result
    return result["memory_tracked_peak_bytes"]


def test_simulated_oom_is_raised_by_the_op_that_crosses_the_budget_as_a_real_oom():
    torch.manual_seed(0)
    model = models.build(MLP, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        torch.nn.functional.cross_entropy(model(torch.randn(64, 1, 8, 8)), torch.randint(0, 10, (64,))).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    peak = memory.track_step(model, opt, step, torch.device("cpu")).peak_bytes
    memory.track_step(model, opt, step, torch.device("cpu"), budget_bytes=peak)  # exactly at the budget: fits
    with pytest.raises(torch.OutOfMemoryError) as caught:
        memory.track_step(model, opt, step, torch.device("cpu"), budget_bytes=peak - 1)
    error = caught.value
    assert isinstance(error, memory.SimulatedOutOfMemoryError) and isinstance(error, RuntimeError)
    # The CPU allocator's own words, which OOM handlers (Lightning's is_oom_error) look for.
    assert len(error.args) == 1 and "DefaultCPUAllocator: can't allocate memory" in error.args[0]
    assert "simulated" in error.args[0]


def test_simulated_oom_is_recorded_as_oom_and_the_worker_group_goes_on():
    budget = tracked_peak(64) - 1
    assert run_point(spec(16, 2, steps=2), WorkerContext())["memory_tracked_peak_bytes"] <= budget
    results = []
    specs = [replace(s, memory_budget_bytes=budget) for s in (spec(16), spec(64), spec(128), spec(16, 2), spec(8))]
    run_points(specs, WorkerContext(), results.append)
    by_key = {r["trial_key"]: r for r in results}
    assert by_key["mb16-acc1-w1"]["status"] == "ok"
    assert by_key["mb16-acc1-w1"]["memory_budget_mode"] == "simulated"
    oom = by_key["mb64-acc1-w1"]
    assert oom["status"] == "oom" and oom["oom_simulated"] is True and "DefaultCPUAllocator" in oom["error"]
    implied = by_key["mb128-acc1-w1"]
    assert implied["status"] == "oom" and implied["oom_implied_by"] == "mb64-acc1-w1"
    assert "oom_simulated" not in implied  # never run: nothing was simulated for it
    assert by_key["mb16-acc2-w1"]["status"] == "ok" and by_key["mb8-acc1-w1"]["status"] == "ok"


def test_implied_oom_rule():
    accumulating = [GridPoint(64, 2, 1)]
    assert implied_oom(GridPoint(64, 4, 1), accumulating) == accumulating[0]
    assert implied_oom(GridPoint(128, 2, 1), accumulating) == accumulating[0]
    assert implied_oom(GridPoint(128, 1, 1), accumulating) is None  # no accumulated gradients beside it
    assert implied_oom(GridPoint(128, 2, 2), accumulating) is None  # another worker count
    single = [GridPoint(64, 1, 1)]
    assert implied_oom(GridPoint(128, 1, 1), single) == single[0]
    assert implied_oom(GridPoint(64, 2, 1), single) == single[0]
    assert implied_oom(GridPoint(32, 2, 1), single) is None


def test_frontier_search_on_a_real_model_is_within_ten_percent_of_exhaustive_search():
    budget = (tracked_peak(100) + tracked_peak(101)) // 2  # the true maximum is 100 by construction
    upper = 200
    # Exhaustive: every micro-batch from 1 to the cap, each a real (simulated-budget) probe.
    device, splits = telemetry.select(False, 0), data_mod.load(DATA, MLP.input_shape)
    gc.freeze()  # as run_points does: each probe's collection then walks only its own objects
    fits = [
        m
        for m in range(1, upper + 1)
        if run_point(spec(m, budget=budget, steps=2), WorkerContext(), device, splits)["status"] == "ok"
    ]
    truth = max(fits)
    assert truth == 100 and fits == list(range(1, 101))

    reports = []
    template = spec(8)
    run_frontier(FrontierSpec(template, budget, {}, upper), WorkerContext(), reports.append)
    probes, found = reports[:-1], reports[-1]
    assert found.trial_key == "frontier-w1" and all(p.probe_role for p in probes)
    assert 0.9 * truth <= found.plain.micro_batch_size <= truth
    assert found.plain.fit_probes <= 3 and found.plain.verifications <= 1
    assert [p.probe_role for p in probes].count("verify") == found.plain.verifications
    assert all("val_accuracy" not in p for p in probes)


@pytest.mark.parametrize("model,micro", [(MLP, 32), (ModelConfig(name="resnet18", input_shape=[3, 32, 32]), 16)])
def test_fake_tensor_estimate_is_within_15_percent_of_the_measured_tracked_peak(model, micro):
    estimate = memory.estimate_step(lambda: models.build(model, 10), models.samples(model, 10), micro).peak_bytes
    measured = tracked_peak(micro, model=replace(model))
    assert abs(estimate / measured - 1) < 0.15, (estimate, measured)
