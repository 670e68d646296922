"""The device layer: which torch device a worker uses, clocks, memory and utilization.

The only module that imports pynvml or psutil, and where CUDA memory statistics are read but for one
figure: a decode step's CUDA peak, which the inference sweep reads itself (sweeper/inference/latency.py,
`_measure_decode`). GPU-only calls stay here.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import resource
import threading
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Optional

import psutil
import torch

from sweeper.errors import first_line

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11


@dataclass
class Device:
    torch_device: torch.device
    _baseline_rss_bytes: int = 0
    _rss_reset: bool = False

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def name(self) -> str:
        """The device's model name (what the GPU peak-FLOP table is keyed by)."""
        if self.is_cuda:
            return torch.cuda.get_device_name(self.torch_device)
        return platform.processor() or platform.machine()

    def synchronize(self) -> None:
        # Host clocks only mean something once queued device work has finished.
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def mark(self) -> Any:
        """A point on this device's timeline, without waiting for the device.

        CPU: `time.perf_counter()`. CUDA: a timing event recorded on the current stream, so
        the span between two marks is the stream's time: host work done while queued kernels
        still run (loading the next batch, say) shows as ~0, which is what it costs the step.
        """
        if self.is_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.torch_device))
            return event
        return time.perf_counter()

    def seconds_between(self, start: Any, end: Any) -> float:
        """Seconds from mark `start` to mark `end`. On CUDA this waits for `end` to complete,
        so read the spans after the measured window, not inside each step."""
        if self.is_cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0  # elapsed_time is in milliseconds
        return end - start

    def start_memory_window(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.torch_device)
        else:
            # Memory an earlier point freed stays resident in glibc's arenas and would be reused
            # without growing RSS: hand it back first, so growth above the baseline is this
            # window's. Without a reset high-water mark the RSS figures would be stale: drop them.
            _trim_malloc()
            self._rss_reset = reset_peak_rss()
            self._baseline_rss_bytes = psutil.Process().memory_info().rss

    def total_memory_bytes(self) -> int:
        """The device's memory (GPU only: a CPU has no device memory to plan for)."""
        if not self.is_cuda:
            raise ValueError("a CPU worker has no device memory: set device.memory_budget_gb")
        return int(torch.cuda.get_device_properties(self.torch_device).total_memory)

    def limit_memory(self, budget_bytes: Optional[int]) -> str:
        """Enforce a memory budget where the device can: on CUDA the caching allocator refuses to
        reserve beyond it (torch.cuda.set_per_process_memory_fraction) and raises a real
        torch.OutOfMemoryError. Returns "enforced", or "simulated" on CPU, where the training step
        checks its tracked tensor memory against the budget instead (memory.track_step), or "none"."""
        if budget_bytes is None:
            if self.is_cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, self.torch_device)
            return "none"
        if not self.is_cuda:
            return "simulated"
        total = torch.cuda.get_device_properties(self.torch_device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), self.torch_device)
        return "enforced"

    def release_cached_memory(self) -> None:
        """Hand the caching allocator's free blocks back to the driver between measured points,
        so one point's reserved memory is not carried into the next. Nothing to do on CPU."""
        if self.is_cuda:
            with torch.cuda.device(self.torch_device):
                torch.cuda.empty_cache()

    def memory_metrics(self) -> dict[str, int]:
        """Peak memory since `start_memory_window`, each number named for what it counts.

        CUDA: bytes in tensors (allocated) and bytes held by the caching allocator (reserved);
        neither includes the CUDA context, which the device-level NVML reading does.
        CPU: the process's resident high-water mark, raw (libraries included) and above the
        RSS at the window's start. Where the kernel refuses to reset the mark
        (`reset_peak_rss` is False) there is no honest CPU figure: nothing is returned.
        """
        if self.is_cuda:
            allocated = torch.cuda.max_memory_allocated(self.torch_device)
            reserved = torch.cuda.max_memory_reserved(self.torch_device)
            return {
                "cuda_max_memory_allocated_bytes": int(allocated),
                "cuda_max_memory_reserved_bytes": int(reserved),
            }
        if not self._rss_reset:
            return {}
        peak = peak_rss_bytes()  # read once, so the two numbers agree
        return {
            "cpu_rss_peak_above_baseline_bytes": max(0, peak - self._baseline_rss_bytes),
            "cpu_rss_peak_bytes": peak,
        }

    def utilization_sampler(self, interval_seconds: float = 0.2) -> UtilizationSampler:
        """A sampler for one measured window: CPU always, the GPU too on CUDA when NVML works."""
        if not self.is_cuda:
            return UtilizationSampler(interval_seconds)
        handle, reason = _nvml_handle(self.torch_device)
        return UtilizationSampler(interval_seconds, nvml_handle=handle, gpu_unavailable_reason=reason)


def _trim_malloc() -> None:
    """Return glibc's free heap memory to the kernel (a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> bool:
    """Reset the kernel's resident-memory high-water mark (Linux: VmHWM), so a peak read later
    belongs to this window and not to, say, importing libraries. False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """The kernel's high-water mark of this process's resident memory (exact, not sampled)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    # Linux reports KiB here, and this mark is never reset.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def process_start_time() -> float:
    """When this process was created (seconds since the epoch, the clock of time.time())."""
    return psutil.Process().create_time()


def select(use_gpu: bool, local_rank: int = 0) -> Device:
    if use_gpu:
        if not torch.cuda.is_available():
            raise RuntimeError("cluster.use_gpu=true but this worker sees no CUDA device")
        return Device(torch.device("cuda", local_rank))
    return Device(torch.device("cpu"))


def nvml_status() -> tuple[bool, str]:
    """(True, "NVML <driver version>, <n> devices") or (False, a one-line reason). Never raises."""
    nvml, message = _load_nvml()
    return nvml is not None, message


@functools.cache
def _load_nvml() -> tuple[Any, str]:
    """The initialized pynvml module (None if unusable) and a one-line status; once per process.

    Imported lazily, so that a missing nvidia-ml-py costs the GPU numbers, not this module.
    """
    try:
        import pynvml
    except ImportError as exc:
        why = first_line(exc)
        return None, f"pynvml is not importable (install nvidia-ml-py): {why}"
    try:
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
    # Every worker runs this; a broken driver install must cost the GPU numbers, not the run.
    except Exception as exc:  # noqa: BLE001
        return None, first_line(exc)
    if isinstance(driver, bytes):  # older pynvml returned bytes
        driver = driver.decode()
    return pynvml, f"NVML {driver}, {count} devices"


def _nvml_handle(torch_device: torch.device) -> tuple[Any, str | None]:
    """The NVML handle of a torch CUDA device, or None and why not.

    Matched by UUID, not index: CUDA numbers the devices this process sees (after
    CUDA_VISIBLE_DEVICES, fastest first by default) while NVML numbers all of them by PCI bus.
    MIG instances are not matched; their utilization is not reported by NVML anyway.
    """
    nvml, message = _load_nvml()
    if nvml is None:
        return None, message
    index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
    uuid = f"GPU-{torch.cuda.get_device_properties(index).uuid}"
    try:
        return nvml.nvmlDeviceGetHandleByUUID(uuid), None
    except Exception as exc:  # noqa: BLE001 - same reason as in _load_nvml
        return None, f"no NVML device for cuda:{index} ({uuid}): {first_line(exc)}"


@dataclass(frozen=True)
class Utilization:
    """How busy the process, the machine and the GPU were during one measured window.

    psutil's conventions: process CPU percents are of ONE core (two busy threads read ~200);
    system CPU percents are of the WHOLE machine (100 = every core busy). The process figures
    cover this process's threads only, not DataLoader worker processes; the system figures
    cover the whole machine, those workers and other tenants included. Means are
    weighted by the time each sample covers, so the CPU means are exact for the window.
    GPU fields are None on CPU, or when NVML is unusable (`gpu_unavailable_reason` says why).
    `gpu_device_memory_used_bytes_max` is the device-level number nvidia-smi shows: every
    process on the GPU, CUDA contexts included.
    """

    samples: int
    process_cpu_percent_mean: float
    process_cpu_percent_max: float
    system_cpu_percent_mean: float
    system_cpu_percent_max: float
    gpu_utilization_percent_mean: float | None = None
    gpu_utilization_percent_max: float | None = None
    gpu_device_memory_used_bytes_max: int | None = None
    gpu_unavailable_reason: str | None = None

    def as_metrics(self) -> dict[str, float]:
        """Numeric fields as metrics, None left out; `samples` becomes `utilization_samples`."""
        metrics = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, (int, float)):
                name = "utilization_samples" if field.name == "samples" else field.name
                metrics[name] = float(value)
        return metrics


@dataclass(frozen=True)
class _Sample:
    covered_seconds: float
    process_cpu_percent: float
    system_cpu_percent: float
    gpu_utilization_percent: float | None
    gpu_memory_used_bytes: int | None


class UtilizationSampler:
    """Samples CPU (and GPU) utilization on a daemon thread over one window.

        sampler = device.utilization_sampler(interval_seconds=0.2)
        sampler.start()
        ...  # the measured work
        utilization = sampler.stop()

    or `with device.utilization_sampler() as sampler: ...`, then `sampler.utilization`.
    Each sample costs a few /proc reads (plus two NVML calls on a GPU), and the thread sleeps
    on an Event between them, so it takes little from training and stops without waiting out
    an interval. `stop()` takes a last sample, so even a window shorter than the interval has
    one. The kernel counts CPU time in 10 ms ticks, so below ~0.1 s the per-sample maxima get
    coarse (one busy thread can read 0 or 200); the means stay exact.
    """

    def __init__(
        self,
        interval_seconds: float = 0.2,
        *,
        nvml_handle: Any = None,
        gpu_unavailable_reason: str | None = None,
    ) -> None:
        if not interval_seconds > 0:  # also rejects NaN
            raise ValueError(
                f"interval_seconds={interval_seconds!r} is invalid: it must be a positive "
                "number of seconds; 0.2 is a good default."
            )
        self.interval_seconds = float(interval_seconds)
        self._nvml = _load_nvml()[0] if nvml_handle is not None else None
        self._nvml_handle = nvml_handle
        self._gpu_unavailable_reason = gpu_unavailable_reason
        self._samples: list[_Sample] = []  # appended by the sampler thread, read after join
        self._stopping = threading.Event()
        self._primed = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: Utilization | None = None

    @property
    def utilization(self) -> Utilization | None:
        """The window's result once stopped, else None."""
        return self._result

    def start(self) -> UtilizationSampler:
        if self._thread is not None:
            raise RuntimeError("this UtilizationSampler was already started: it measures one window; create another")
        self._thread = threading.Thread(target=self._run, name="utilization-sampler", daemon=True)
        self._thread.start()
        # The window starts once the counters are primed, not when the thread is asked to.
        self._primed.wait()
        return self

    def stop(self) -> Utilization:
        """Stop sampling (one last sample first) and summarize; later calls return the same."""
        if self._thread is None:
            raise RuntimeError("UtilizationSampler.stop() before start()")
        if self._result is None:
            self._stopping.set()
            self._thread.join()
            self._result = self._summarize()
        return self._result

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            process = psutil.Process()
            # psutil's first cpu_percent() is measured from nothing and reads 0.0: discard it.
            # The system counter is kept per thread, so it is primed here, in this thread.
            process.cpu_percent(None)
            psutil.cpu_percent(None)
            last = time.monotonic()
        finally:
            self._primed.set()
        stopping = False
        while not stopping:
            stopping = self._stopping.wait(self.interval_seconds)
            now = time.monotonic()
            self._samples.append(self._sample(process, now - last))
            last = now

    def _sample(self, process: psutil.Process, covered_seconds: float) -> _Sample:
        gpu_percent: float | None = None
        gpu_memory: int | None = None
        if self._nvml is not None:
            try:
                gpu_percent = float(self._nvml.nvmlDeviceGetUtilizationRates(self._nvml_handle).gpu)
                gpu_memory = int(self._nvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
            # A GPU read failing (device lost, not supported) must not end the CPU sampling.
            except Exception as exc:  # noqa: BLE001
                gpu_percent = gpu_memory = None
                self._nvml = None
                self._gpu_unavailable_reason = f"NVML read failed: {first_line(exc)}"
        return _Sample(
            covered_seconds=covered_seconds,
            process_cpu_percent=process.cpu_percent(None),
            system_cpu_percent=psutil.cpu_percent(None),
            gpu_utilization_percent=gpu_percent,
            gpu_memory_used_bytes=gpu_memory,
        )

    def _summarize(self) -> Utilization:
        samples = self._samples
        gpu = [s for s in samples if s.gpu_utilization_percent is not None]
        return Utilization(
            samples=len(samples),
            process_cpu_percent_mean=_weighted_mean(samples, [s.process_cpu_percent for s in samples]),
            process_cpu_percent_max=max((s.process_cpu_percent for s in samples), default=0.0),
            system_cpu_percent_mean=_weighted_mean(samples, [s.system_cpu_percent for s in samples]),
            system_cpu_percent_max=max((s.system_cpu_percent for s in samples), default=0.0),
            gpu_utilization_percent_mean=(
                _weighted_mean(gpu, [s.gpu_utilization_percent for s in gpu]) if gpu else None
            ),
            gpu_utilization_percent_max=max(s.gpu_utilization_percent for s in gpu) if gpu else None,
            gpu_device_memory_used_bytes_max=max(s.gpu_memory_used_bytes for s in gpu) if gpu else None,
            gpu_unavailable_reason=self._gpu_unavailable_reason,
        )


def _weighted_mean(samples: list[_Sample], values: list[Any]) -> float:
    """Mean of `values`, each weighted by the seconds its sample covers (plain mean if none)."""
    if not values:
        return 0.0
    total = sum(s.covered_seconds for s in samples)
    if total <= 0:
        return sum(values) / len(values)
    return sum(s.covered_seconds * v for s, v in zip(samples, values)) / total
