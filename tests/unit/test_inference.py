"""Inference points on CPU: latency from timed runs, memory of one forward, OOM (simulated) and its implications."""

import random

import pytest
import torch

from sweeper.config import ModelConfig
from sweeper.inference import latency
from sweeper.inference.latency import InferenceSpec, run_inference_point, run_inference_points, summarize_latency
from sweeper.measure.flops import FlopCount, PeakFlops
from tests.helpers import forwards_take

# The timing tests give every forward 1/64 s on the clock the timing reads (tests.helpers.forwards_take):
# their figures are exact, whatever else the machine does.
TICK = 2 ** -6


class Custom(torch.nn.Module):
    """A model of the user's own (model._target_): its key names only the batch."""

    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(8, num_classes)

    def forward(self, x):
        return self.linear(x)


class Broken(torch.nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(8, num_classes)

    def forward(self, x):
        raise RuntimeError("shape mismatch in my layer\nsecond line")


CUSTOM = ModelConfig(name="custom", _target_="tests.unit.test_inference.Custom", input_shape=[8])
BROKEN = ModelConfig(name="broken", _target_="tests.unit.test_inference.Broken", input_shape=[8])
TINY_MLP = ModelConfig(name="mlp", input_shape=[16], depth=2, width=64)


def spec(model=TINY_MLP, batch_size=8, **overrides):
    fast = dict(warmup_runs=1, timed_runs=5, min_timed_seconds=0.0)
    return InferenceSpec(model=model, num_classes=4, batch_size=batch_size, **{**fast, **overrides})


def test_latency_summary_is_derived_from_the_samples():
    samples = [i / 1000 for i in range(1, 101)]  # 1 .. 100 ms
    random.Random(0).shuffle(samples)
    s = summarize_latency(samples, batch_size=10)
    assert s["latency_p50_seconds"] == pytest.approx(0.0505)
    assert s["latency_p95_seconds"] == pytest.approx(0.09505)
    assert s["latency_p99_seconds"] == pytest.approx(0.09901)
    assert s["latency_mean_seconds"] == pytest.approx(0.0505)
    # 1..100 ms: population stdev sqrt((100^2 - 1) / 12) = 28.866 ms over the mean 50.5 ms.
    assert s["latency_cv"] == pytest.approx(0.571606, rel=1e-5)
    assert s["samples_per_second"] == pytest.approx(10 / 0.0505)  # the headline: batch / median
    assert s["samples_per_second_overall"] == pytest.approx(10 * 100 / sum(samples))
    assert s["timed_runs"] == 100 and s["latency_samples_seconds"] == samples
    # A tail does not move the headline, only the overall rate.
    tailed = summarize_latency(samples[:-1] + [10.0], batch_size=10)
    assert tailed["samples_per_second"] == pytest.approx(s["samples_per_second"], rel=0.02)
    assert tailed["samples_per_second_overall"] < s["samples_per_second_overall"] / 2
    with pytest.raises(ValueError, match="no latency samples"):
        summarize_latency([], batch_size=1)


def test_a_forward_of_known_duration_reads_as_that_latency(monkeypatch):
    forwards_take(monkeypatch, TICK, latency)
    r = run_inference_point(spec(CUSTOM, batch_size=4))
    assert r["status"] == "ok" and r["role"] == "inference" and r["trial_key"] == "bs4"
    assert r["latency_samples_seconds"] == [TICK] * 5 and r["timed_runs"] == 5  # the warm-up run is not among them
    assert r["latency_p50_seconds"] == r["latency_p99_seconds"] == TICK
    # 4 samples in 1/64 s: 256 samples/s, at the median and over all runs alike.
    assert r["samples_per_second"] == r["samples_per_second_overall"] == 256.0


def test_timing_goes_on_until_the_minimum_duration(monkeypatch):
    forwards_take(monkeypatch, TICK, latency)
    r = run_inference_point(spec(CUSTOM, timed_runs=3, min_timed_seconds=0.125))
    # 3 runs asked for take 3/64 s, short of 0.125 s = 8/64 s: timing goes on to the 8th run.
    assert r["timed_runs"] == 8 and r["timed_seconds"] == 0.125
    capped = run_inference_point(spec(CUSTOM, timed_runs=3, min_timed_seconds=10.0, max_timed_runs=4))
    assert capped["timed_runs"] == 4 and capped["timed_seconds"] == 4 * TICK


def test_cpu_memory_is_the_tracked_peak_of_one_forward_under_inference_mode():
    small = run_inference_point(spec(batch_size=8))
    large = run_inference_point(spec(batch_size=512))
    params = 4 * (16 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4)
    for r in (small, large):
        assert r["status"] == "ok" and r["memory_measure"].startswith("cpu: peak tensor memory of one forward")
        assert r["memory_parameters_bytes"] == params
        assert r["peak_memory_bytes"] == r["memory_tracked_peak_bytes"] > params
        assert r["memory_gradients_bytes"] == 0  # inference_mode: no autograd state
    # The input batch and the activations grow with it: 504 more samples of at least 16 + 64 floats.
    assert large["peak_memory_bytes"] - small["peak_memory_bytes"] >= 504 * 4 * (16 + 64)


def test_keys_carry_the_mlp_width_so_a_width_sweep_has_distinct_keys():
    assert spec(batch_size=64).key == "mlp64-bs64"
    assert spec(ModelConfig(name="mlp", input_shape=[16], width=1024), batch_size=64).key == "mlp1024-bs64"
    assert spec(CUSTOM, batch_size=64).key == "bs64"
    with pytest.raises(ValueError, match="inference.timed_runs has 0"):
        spec(timed_runs=0)
    with pytest.raises(ValueError, match="inference.min_timed_seconds"):
        spec(min_timed_seconds=-1)


def test_achieved_flops_and_mfu_from_the_forward_flop_count(monkeypatch):
    forwards_take(monkeypatch, TICK, latency)
    count = FlopCount(forward_per_sample=1e6, train_per_sample=3e6)
    r = run_inference_point(spec(batch_size=8, flop_count=count), peak=PeakFlops(1.024e9, "table: a test's"))
    # 8 samples in 1/64 s: 512 samples/s; x 1e6 FLOPs a sample = 5.12e8 FLOP/s, half the peak of 1.024e9.
    assert r["samples_per_second"] == 512.0 and r["forward_flops_per_sample"] == 1e6
    assert r["achieved_flops_per_second"] == 5.12e8 and r["mfu"] == 0.5
    assert r["peak_flops_per_second"] == 1.024e9 and r["peak_flops_source"] == "table: a test's"


def test_the_cpu_peak_is_measured_on_the_inference_threads():
    reports = []
    run_inference_points([spec(batch_size=8, flop_count=FlopCount(1e6, 3e6))], reports.append, threads=1)
    # The CPU peak is the faster of a matmul and a convolution, measured on the inference threads.
    source = reports[0]["peak_flops_source"]
    assert source.startswith("measured: fp32 ") and "the faster of matmul" in source and "1 thread" in source
    assert reports[0]["peak_flops_per_second"] > 0


def test_simulated_oom_implies_oom_for_larger_batches_of_the_same_model(monkeypatch):
    ran = []
    real = latency.run_inference_point

    def recording(s, *args, **kwargs):
        ran.append((s.key, s.memory_budget_bytes))
        return real(s, *args, **kwargs)

    monkeypatch.setattr(latency, "run_inference_point", recording)
    budget = 100_000  # the 22 kB of weights and a small batch fit; 1024 samples of 64 floats do not
    specs = [
        spec(batch_size=2048, memory_budget_bytes=budget),
        spec(batch_size=8, memory_budget_bytes=budget),
        spec(batch_size=1024, memory_budget_bytes=budget),
        spec(batch_size=2048),  # the same model without the budget: another series, not implied
    ]
    reports = []
    run_inference_points(specs, reports.append)

    assert ran == [("mlp64-bs8", budget), ("mlp64-bs1024", budget), ("mlp64-bs2048", None)]  # smallest first
    assert [(r["trial_key"], r["status"]) for r in reports] == [
        ("mlp64-bs8", "ok"), ("mlp64-bs1024", "oom"), ("mlp64-bs2048", "oom"), ("mlp64-bs2048", "ok"),
    ]
    ok, oom, implied, unbudgeted = reports
    assert ok["memory_budget_mode"] == "simulated" and ok["peak_memory_bytes"] <= budget
    assert oom["oom_simulated"] is True and "over the budget of 100000 bytes" in oom["error"]
    assert implied["oom_implied_by"] == "mlp64-bs1024" and "latency_p50_seconds" not in implied
    assert "memory_budget_mode" not in unbudgeted


def test_a_failing_model_is_a_result_not_an_exception():
    reports = []
    run_inference_points([spec(BROKEN, batch_size=2), spec(CUSTOM, batch_size=2, timed_runs=1)], reports.append)
    failed, ok = reports
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: shape mismatch in my layer"
    assert "oom_implied_by" not in failed and ok["status"] == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_a_gpu_without_one_fails_the_point():
    r = run_inference_point(spec(use_gpu=True))
    assert r["status"] == "failed" and "no CUDA device" in r["error"]


def test_the_callers_random_stream_and_threads_are_left_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    run_inference_points([spec(batch_size=2, timed_runs=1)], lambda r: None, threads=1)
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads
