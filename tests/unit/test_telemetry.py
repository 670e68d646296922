"""The device layer on a CPU box: NVML detection, utilization sampling, marks, memory names.

GPU paths are exercised against a simulated pynvml module, put where the real one is imported.
"""

import math
import os
import sys
import threading
import time
import types

import pytest
import torch

from sweeper.measure import telemetry
from tests.helpers import wait_for

MiB = 2**20
CPU_UTILIZATION_METRICS = {
    "utilization_samples",
    "process_cpu_percent_mean",
    "process_cpu_percent_max",
    "system_cpu_percent_mean",
    "system_cpu_percent_max",
}


@pytest.fixture
def fresh_nvml():
    """Forget the once-per-process NVML result before and after the test."""
    telemetry._load_nvml.cache_clear()
    yield
    telemetry._load_nvml.cache_clear()


@pytest.fixture
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def simulated_pynvml(init_error=None, read_error=None):
    """A stand-in for the pynvml module: one GPU at 70% busy with 3 GiB in use."""

    class NVMLError(Exception):
        pass

    calls = {"nvmlInit": 0, "uuids": []}

    def nvml_init():
        calls["nvmlInit"] += 1
        if init_error:
            raise NVMLError(init_error)

    def handle_by_uuid(uuid):
        calls["uuids"].append(uuid)
        if uuid != "GPU-0c4e1a2b-0000-1111-2222-333344445555":
            raise NVMLError("Not Found")
        return "handle-0"

    def utilization_rates(handle):
        if read_error:
            raise NVMLError(read_error)
        return types.SimpleNamespace(gpu=70, memory=30)

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        calls=calls,
        nvmlInit=nvml_init,
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByUUID=handle_by_uuid,
        nvmlDeviceGetUtilizationRates=utilization_rates,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30),
    )


def cpu_device():
    return telemetry.select(use_gpu=False)


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "utilization-sampler"]


# NVML detection


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nvml_status_without_a_gpu_is_a_one_line_no(fresh_nvml, capsys):
    ok, reason = telemetry.nvml_status()
    assert ok is False
    assert reason.strip() and "\n" not in reason
    assert "Traceback" not in capsys.readouterr().err
    assert telemetry.nvml_status() == (False, reason)


def test_nvml_status_names_the_package_when_pynvml_is_missing(fresh_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    ok, reason = telemetry.nvml_status()
    assert ok is False
    assert "pynvml" in reason and "nvidia-ml-py" in reason and "\n" not in reason


def test_nvml_status_with_simulated_nvml_inits_once(fresh_nvml, monkeypatch):
    fake = simulated_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert telemetry.nvml_status() == (True, "NVML 550.54.15, 1 devices")
    assert telemetry.nvml_status() == (True, "NVML 550.54.15, 1 devices")
    assert fake.calls["nvmlInit"] == 1


def test_nvml_status_with_simulated_driver_failure(fresh_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", simulated_pynvml("Driver Not Loaded"))
    assert telemetry.nvml_status() == (False, "Driver Not Loaded")


# Utilization sampling


# solo, with test_cpu_marks_measure_a_sleep: the two tests of the real clocks against real work (the
# CPU's counters, perf_counter), which the machine's load moves; every figure's arithmetic is tested on a
# clock only forwards move (tests.helpers.forwards_take).
@pytest.mark.solo
def test_sampler_sees_a_busy_thread_and_a_quiet_sleep(one_torch_thread):
    device = cpu_device()
    matrix = torch.randn(256, 256)
    sampler = device.utilization_sampler(interval_seconds=0.2)
    sampler.start()
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() < wall + 1.0:
        matrix @ matrix
    # What the kernel says this process got, whatever else the machine was doing.
    got_percent = 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)
    busy = sampler.stop()

    with device.utilization_sampler(interval_seconds=0.2) as sampler:
        time.sleep(1.0)
    idle = sampler.utilization

    # ~100 (one core) on a quiet machine; less when other processes compete for the cores,
    # so the busy reading is checked against the process's own CPU clock, not a constant.
    assert busy.process_cpu_percent_mean == pytest.approx(got_percent, abs=10), busy
    assert busy.process_cpu_percent_mean > idle.process_cpu_percent_mean + 15
    assert busy.process_cpu_percent_max >= busy.process_cpu_percent_mean
    assert idle.process_cpu_percent_mean < 30, idle
    assert busy.samples >= 4 and idle.samples >= 4
    # The machine is at least as busy as this process's share of it (the system counter was
    # primed in the sampling thread, not read since boot).
    share = busy.process_cpu_percent_mean / os.cpu_count()
    assert busy.system_cpu_percent_mean >= 0.8 * share, busy
    for utilization in (busy, idle):
        assert utilization.gpu_utilization_percent_mean is None
        assert utilization.gpu_device_memory_used_bytes_max is None
        assert set(utilization.as_metrics()) == CPU_UTILIZATION_METRICS


def test_sampler_samples_a_window_shorter_than_its_interval():
    with cpu_device().utilization_sampler(interval_seconds=0.2) as sampler:
        time.sleep(0.01)
    assert sampler.utilization.samples >= 1
    assert sampler.utilization.as_metrics()["utilization_samples"] >= 1


def test_sampler_stops_promptly_and_leaves_no_thread():
    threads_before = len(sampler_threads())
    sampler = cpu_device().utilization_sampler(interval_seconds=3600.0).start()
    assert len(sampler_threads()) == threads_before + 1
    # Stopping must wake the sampler, not wait out its hour-long interval: the stop is waited for on a
    # deadline a minute long, far from both outcomes whatever the machine's load.
    stopping = threading.Thread(target=sampler.stop, daemon=True)
    stopping.start()
    stopping.join(timeout=60)
    assert not stopping.is_alive(), "stop() waited out the sampling interval"
    utilization = sampler.stop()
    assert len(sampler_threads()) == threads_before
    assert utilization.samples == 1  # the one taken at stop
    assert sampler.stop() is utilization
    with pytest.raises(RuntimeError, match="one window"):
        sampler.start()


@pytest.mark.parametrize("interval", [0, -0.2, math.nan])
def test_sampler_rejects_a_bad_interval(interval):
    with pytest.raises(ValueError, match="interval_seconds"):
        telemetry.UtilizationSampler(interval)


def test_sampler_reads_the_gpu_through_simulated_nvml(fresh_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", simulated_pynvml())
    with telemetry.UtilizationSampler(0.05, nvml_handle="handle-0") as sampler:
        wait_for(lambda: len(sampler._samples) >= 2, "two samples")
    utilization = sampler.utilization
    assert utilization.gpu_utilization_percent_mean == pytest.approx(70.0)
    assert utilization.gpu_utilization_percent_max == 70.0
    assert utilization.gpu_device_memory_used_bytes_max == 3 * 2**30
    assert utilization.gpu_unavailable_reason is None
    assert set(utilization.as_metrics()) == CPU_UTILIZATION_METRICS | {
        "gpu_utilization_percent_mean",
        "gpu_utilization_percent_max",
        "gpu_device_memory_used_bytes_max",
    }


def test_sampler_keeps_cpu_numbers_when_simulated_nvml_reads_fail(fresh_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", simulated_pynvml(read_error="GPU is lost"))
    with telemetry.UtilizationSampler(0.05, nvml_handle="handle-0") as sampler:
        wait_for(lambda: len(sampler._samples) >= 2, "two samples")
    utilization = sampler.utilization
    assert utilization.gpu_utilization_percent_mean is None
    assert utilization.gpu_unavailable_reason == "NVML read failed: GPU is lost"
    assert utilization.samples >= 2
    assert set(utilization.as_metrics()) == CPU_UTILIZATION_METRICS


def test_cuda_device_finds_its_nvml_handle_by_uuid_simulated(fresh_nvml, monkeypatch):
    fake = simulated_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    uuids = {
        0: "0c4e1a2b-0000-1111-2222-333344445555",
        1: "ffffffff-0000-1111-2222-3333",
    }
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: types.SimpleNamespace(uuid=uuids[index]),
    )
    found = telemetry.Device(torch.device("cuda", 0)).utilization_sampler()
    assert found._nvml_handle == "handle-0"
    missing = telemetry.Device(torch.device("cuda", 1)).utilization_sampler()
    assert missing._nvml_handle is None
    assert fake.calls["uuids"] == [f"GPU-{uuids[0]}", f"GPU-{uuids[1]}"]
    with missing:
        pass
    reason = missing.utilization.gpu_unavailable_reason
    assert "cuda:1" in reason and "Not Found" in reason


# Timing marks and memory


@pytest.mark.solo
def test_cpu_marks_measure_a_sleep():
    device = cpu_device()
    start = device.mark()
    time.sleep(0.2)
    end = device.mark()
    assert 0.19 <= device.seconds_between(start, end) < 0.5  # generous: the machine is shared


def test_cpu_memory_metrics_count_a_touched_tensor_under_honest_names():
    device = cpu_device()
    device.start_memory_window()
    before = device.memory_metrics()
    assert set(before) == {"cpu_rss_peak_above_baseline_bytes", "cpu_rss_peak_bytes"}
    block = torch.ones(200 * MiB, dtype=torch.uint8)  # ones() writes, so every page is resident
    after = device.memory_metrics()
    del block
    grown = after["cpu_rss_peak_above_baseline_bytes"] - before["cpu_rss_peak_above_baseline_bytes"]
    assert grown >= 180 * MiB
    # The raw mark also counts the libraries already loaded before the window.
    assert after["cpu_rss_peak_bytes"] > after["cpu_rss_peak_above_baseline_bytes"]


def test_release_cached_memory_is_a_no_op_on_cpu():
    device = cpu_device()
    device.start_memory_window()
    device.release_cached_memory()
    assert set(device.memory_metrics()) == {"cpu_rss_peak_above_baseline_bytes", "cpu_rss_peak_bytes"}
