"""Memory traffic on the torch side of the roofline: the device's bandwidth (datasheet on GPU, a timed copy
on CPU) and the bytes and FLOPs of one forward pass, traced on fake tensors. The arithmetic is in roofline.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence, Tuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from sweeper.config import ModelConfig
from sweeper.errors import first_line
from sweeper.inference.roofline import Bandwidth, KneePrediction, predict_knee, table_bandwidth
from sweeper.measure import flops, telemetry
from sweeper.workloads import models

_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------
# Bandwidth


def gpu_bandwidth(device_name: str, total_memory_bytes: Optional[int] = None) -> Optional[Bandwidth]:
    """Datasheet memory bandwidth of a GPU named as torch.cuda.get_device_name() names it.

    Matched exactly as flops.gpu_peak_flops matches (whole names, so an unlisted variant gets None,
    not its neighbour's figure). Where the memory size changes the bandwidth (A100 40 vs 80 GB) the size
    comes from the name ("NVIDIA A100-SXM4-80GB") or else from `total_memory_bytes`; None without either.
    """
    key = flops._NAMES.get(flops._name_key(device_name))
    if key is None:
        return None
    match = _GB.search(device_name)
    if match:
        memory_gb: Optional[float] = float(match.group(1))
    elif total_memory_bytes is not None:
        memory_gb = total_memory_bytes / 1e9
    else:
        memory_gb = None
    return table_bandwidth(key, memory_gb)


def measure_cpu_bandwidth(threads: int, size_bytes: int = 256 * 2**20, repeats: int = 5) -> Bandwidth:
    """The CPU's memory bandwidth with `threads` threads (a worker's share), from a timed copy.

    Best of `repeats` copies of a `size_bytes` float32 tensor into another after one warm-up (page
    faults, the thread pool), counting its bytes read plus bytes written, as STREAM's copy does: the
    write-allocate read of the destination is not counted. The size must dwarf the last-level cache
    (32 MiB on the dev box) or the figure is the cache's; 256 MiB takes ~30 ms a copy on one thread.
    """
    for key, value in (("threads", threads), ("size_bytes", size_bytes), ("repeats", repeats)):
        if value < 1:
            raise ValueError(f"{key}={value}: must be at least 1")
    numel = max(1, size_bytes // 4)
    source = torch.ones(numel)  # written once, so every page is resident before timing
    target = torch.empty_like(source)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = flops.best_seconds(lambda: target.copy_(source), repeats)
    finally:
        torch.set_num_threads(previous)
    moved = 2 * numel * 4
    plural = "thread" if threads == 1 else "threads"
    return Bandwidth(
        moved / best,
        f"measured: copy of {numel * 4 / 2**20:.0f} MiB (read + write counted), best of {repeats}, "
        f"{threads} {plural}",
    )


def device_bandwidth(device: telemetry.Device, threads: int = 1) -> Optional[Bandwidth]:
    """The bandwidth the roofline of `device` uses: the datasheet's on GPU (None for a GPU not in the
    table), a copy measured with `threads` threads on CPU."""
    if device.is_cuda:
        return gpu_bandwidth(device.name, device.total_memory_bytes())
    return measure_cpu_bandwidth(threads)


# ---------------------------------------------------------------------------------------------------
# The bytes and FLOPs of one forward pass


@dataclass(frozen=True)
class ForwardTraffic:
    """One eval-mode forward pass of a model, as the roofline counts it.

    weight_bytes: parameters and buffers, which a forward reads once whatever the batch.
    activation_bytes_per_sample: bytes every op reads (its inputs) and writes (its outputs), per
    sample: the slope between two traced batch sizes, so tensors of a fixed size (the weights, a
    BatchNorm's statistics) do not count. Views (flatten, transpose) move nothing and are skipped.
    fixed_bytes: the intercept, what the ops move whatever the batch (mostly the weights' reads).
    forward_flops_per_sample: FlopCounterMode's count (a multiply-add is 2 FLOPs), per sample.
    """

    weight_bytes: int
    activation_bytes_per_sample: float
    fixed_bytes: float
    forward_flops_per_sample: float
    dtype: str


class _ByteCounter(TorchDispatchMode):
    """Sums the bytes of every non-view op's tensor inputs and outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    # A fake model cannot be converted with .to(dtype) (fake parameters cannot be swapped), so it is
    # built in the dtype instead.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def forward_traffic(
    build_model: Callable[[], nn.Module],
    input_shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    batch_sizes: Tuple[int, int] = (2, 4),
) -> ForwardTraffic:
    """Weights, activation bytes per sample and FLOPs per sample of one inference forward pass.

    `build_model` must construct a new model on each call: it runs under FakeTensorMode, so nothing is
    allocated and a model of any size is traced in well under a second (count_flops' approach). Only if
    that fails is a real model built and run at `batch_sizes`, with a RuntimeWarning saying so.
    The forward runs in eval mode under torch.inference_mode(), as run_inference_point times it;
    `dtype` is the floating dtype of the weights and inputs (torch.float16 for a half-precision server).
    """
    small, large = batch_sizes
    if not 1 <= small < large:
        raise ValueError(f"batch_sizes={batch_sizes}: need two sizes, 1 <= first < second, e.g. (2, 4)")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype}: the traced forward needs a floating dtype, e.g. torch.float16")
    with torch.random.fork_rng(devices=[]), _default_dtype(dtype):
        try:
            with FakeTensorMode():
                return _trace(build_model(), input_shape, dtype, small, large)
        except Exception as error:  # fake tensors cannot run every model: fall back to a real one
            warnings.warn(
                "forward_traffic: the model could not be traced under FakeTensorMode "
                f"({type(error).__name__}: {first_line(error)}); tracing a real model instead",
                RuntimeWarning,
                stacklevel=2,
            )
        return _trace(build_model(), input_shape, dtype, small, large)


def _trace(model: nn.Module, input_shape: Sequence[int], dtype: torch.dtype, small: int, large: int) -> ForwardTraffic:
    model.eval()
    weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    moved, counted = [], []
    for batch in (small, large):
        inputs = torch.randn(batch, *input_shape, dtype=dtype)
        with torch.inference_mode(), FlopCounterMode(display=False) as flop_counter, _ByteCounter() as byte_counter:
            model(inputs)
        moved.append(byte_counter.bytes)
        counted.append(flop_counter.get_total_flops())
    per_sample = (moved[1] - moved[0]) / (large - small)
    return ForwardTraffic(
        weight_bytes=int(weight_bytes),
        activation_bytes_per_sample=per_sample,
        fixed_bytes=moved[0] - per_sample * small,
        forward_flops_per_sample=(counted[1] - counted[0]) / (large - small),
        dtype=str(dtype).replace("torch.", ""),
    )


def model_traffic(cfg: ModelConfig, num_classes: int, dtype: torch.dtype = torch.float32) -> ForwardTraffic:
    """`forward_traffic` of a model of the model group (mlp, torchvision, or a `_target_` factory)."""
    return forward_traffic(lambda: models.build(cfg, num_classes), cfg.input_shape, dtype)


def predict_model_knee(
    cfg: ModelConfig,
    num_classes: int,
    peak: flops.PeakFlops,
    bandwidth: Bandwidth,
    dtype: torch.dtype = torch.float32,
) -> Tuple[KneePrediction, ForwardTraffic]:
    """The roofline knee of `cfg` on a device with `peak` FLOP/s and `bandwidth`, and the traced traffic."""
    traffic = model_traffic(cfg, num_classes, dtype)
    prediction = predict_knee(
        traffic.forward_flops_per_sample,
        traffic.weight_bytes,
        traffic.activation_bytes_per_sample,
        peak.flops_per_second,
        bandwidth.bytes_per_second,
    )
    return prediction, traffic
