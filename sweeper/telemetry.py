"""The device layer: which torch device a worker uses, clock synchronization and peak memory.

The only module that touches CUDA memory statistics or process memory; GPU-only calls stay here.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import psutil
import torch


@dataclass
class Device:
    torch_device: torch.device
    _baseline_rss_bytes: int = 0

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def memory_measure(self) -> str:
        """What `peak_memory_bytes` means on this device (logged beside the number)."""
        if self.is_cuda:
            return "cuda: torch.cuda.max_memory_allocated (tensors held by the caching allocator)"
        return "cpu: peak process RSS (VmHWM, reset before the model is built) above the RSS at that point"

    def synchronize(self) -> None:
        # Host clocks only mean something once queued device work has finished.
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def start_memory_window(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.torch_device)
        else:
            reset_peak_rss()
            self._baseline_rss_bytes = psutil.Process().memory_info().rss

    def peak_memory_bytes(self) -> int:
        if self.is_cuda:
            return int(torch.cuda.max_memory_allocated(self.torch_device))
        return max(0, peak_rss_bytes() - self._baseline_rss_bytes)


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
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB, never reset


def select(use_gpu: bool, local_rank: int = 0) -> Device:
    if use_gpu:
        if not torch.cuda.is_available():
            raise RuntimeError("cluster.use_gpu=true but this worker sees no CUDA device")
        return Device(torch.device("cuda", local_rank))
    return Device(torch.device("cpu"))
