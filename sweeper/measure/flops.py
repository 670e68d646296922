"""FLOPs per training sample, and the peak FLOP/s they are compared with (MFU).

Counting runs on fake tensors; peaks come from NVIDIA datasheets or a timed CPU matmul.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from sweeper.errors import first_line
from sweeper.workloads.samples import Samples, cross_entropy

DTYPE_KEYS = ("fp32", "tf32", "fp16", "bf16")
# TF32 is a matmul mode, not a tensor dtype: no torch.dtype maps to it.
_TORCH_DTYPE_KEYS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class FlopCount:
    # As torch.utils.flop_counter counts: a multiply-add is 2 FLOPs, and only matmuls,
    # convolutions and attention are counted (bias adds, norms, activations and the
    # loss are not), which is the convention MFU figures are quoted in.
    forward_per_sample: float
    train_per_sample: float  # forward + backward: the model's FLOPs, what MFU counts
    # The share of the train FLOPs in convolutions: on GPU, fp32 convolutions and matmuls run
    # as TF32 under different switches, so the right peak depends on which dominates.
    convolution_share: float = 0.0
    # What the hardware computes per sample, recomputation included (activation checkpointing runs
    # each wrapped block's forward again in backward): HFU counts these (PaLM, appendix B). None:
    # the same as train_per_sample.
    hardware_per_sample: Optional[float] = None

    @property
    def hardware(self) -> float:
        return self.train_per_sample if self.hardware_per_sample is None else self.hardware_per_sample


def _attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                        **kwargs) -> int:
    # The model's backward: twice the forward's two matmuls (the gradients of scores and values).
    # Fused kernels also recompute the scores (torch's own formula counts a fifth matmul): that is a
    # kernel's rematerialization, which MFU leaves out as it leaves out activation checkpointing's.
    return 2 * flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


_aten = torch.ops.aten
# Attention as every backend computes it: the CPU's fused kernel is missing from torch's own table
# (an attention on CPU counted nothing), and its backward formulas count the recompute.
ATTENTION_FORMULAS = {
    op: formula
    for ops, formula in (
        (("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention"), _attention),
        (("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_cudnn_attention_backward"),
         _attention_backward),
    )
    for name in ops if hasattr(_aten, name)
    for op in [getattr(_aten, name)]
}


@dataclass(frozen=True)
class PeakFlops:
    flops_per_second: float
    source: str  # e.g. "table: NVIDIA A100 SXM fp32 dense (...)" or "measured: ..."


class _ModelError(ValueError):
    """A problem with the caller's model itself, which counting on a real model would not fix."""


def count_flops(
    build_model: Callable[[], nn.Module],
    samples: Samples,
    batch_size: int = 2,
) -> FlopCount:
    """FLOPs of one training step (forward, cross-entropy, backward) per sample of `samples`' kind.

    `build_model` must construct a new model on each call: it is called under FakeTensorMode,
    so no weights are allocated or initialized and a model of any size is counted in well
    under a second. Only if that fails (e.g. data-dependent Python control flow in forward)
    is a real model built and run on a real batch, with a RuntimeWarning saying so.
    """
    if batch_size < 2:
        raise ValueError(
            f"batch_size={batch_size}: must be at least 2, because BatchNorm in train mode "
            "rejects a batch of one; pass batch_size=2"
        )
    # The builder's weight init draws from the global generator; a FLOP count must not
    # shift the random stream of the training run that asked for it.
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        try:
            with FakeTensorMode():
                model = build_model()
                _require_fake(model)
                return _count(model, samples, batch_size)
        except _ModelError:
            raise
        except Exception as error:  # fake tensors cannot run every model; see the fallback
            warnings.warn(
                "count_flops: the model could not be built or run under FakeTensorMode "
                f"({type(error).__name__}: {first_line(error)}); counting on a real model and "
                f"a real batch of {batch_size} instead",
                RuntimeWarning,
                stacklevel=2,
            )
        return _count(build_model(), samples, batch_size)


def _require_fake(model: nn.Module) -> None:
    # A builder that returns an existing model (lambda: model) would otherwise have its
    # gradients and BatchNorm statistics written by the count.
    tensors = [*model.named_parameters(), *model.named_buffers()]
    real = [name for name, t in tensors if not isinstance(t, FakeTensor)]
    if real:
        raise _ModelError(
            f"build_model returned a model whose tensors it did not create ({real[0]!r} "
            "already existed): pass a function that constructs a new model on each call, "
            "e.g. lambda: torchvision.models.resnet18(num_classes=10)"
        )


def _count(model: nn.Module, samples: Samples, batch_size: int) -> FlopCount:
    if not any(p.requires_grad for p in model.parameters()):
        raise _ModelError(
            f"the model ({type(model).__name__}) has no trainable parameters: there is no "
            "backward pass to count; give the model at least one parameter"
        )
    model.train()
    inputs, targets = samples.batch(batch_size)
    with FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS) as counter:
        # The same loss as the training step; it adds no counted FLOPs of its own.
        loss = cross_entropy(model(inputs), targets)
        forward = counter.get_total_flops()
        loss.backward()
        total = counter.get_total_flops()
    by_op = counter.get_flop_counts().get("Global", {})
    convolution = sum(n for op, n in by_op.items() if "convolution" in str(op))
    return FlopCount(forward / batch_size, total / batch_size, convolution / total if total else 0.0)


@dataclass(frozen=True)
class _Gpu:
    name: str
    datasheet: str
    tflops: Dict[str, float]  # dense, no sparsity; a missing key: no such math on the GPU


# Dense peaks in TFLOP/s. Datasheets quote tensor-core figures "with sparsity" (2:4
# structured), which dense training cannot reach, so those are halved here. Where a
# GeForce card's tensor cores run FP32 accumulation at half the FP16-accumulate rate, the
# FP32-accumulate figure is used: that is what PyTorch's fp16/bf16 matmuls request.
_GPUS: Dict[str, _Gpu] = {
    "v100_sxm2": _Gpu(
        "NVIDIA V100 SXM2",
        "NVIDIA V100 datasheet",
        {"fp32": 15.7, "fp16": 125.0},
    ),
    "v100_pcie": _Gpu(
        "NVIDIA V100 PCIe",
        "NVIDIA V100 datasheet",
        {"fp32": 14.0, "fp16": 112.0},
    ),
    "v100s_pcie": _Gpu(
        "NVIDIA V100S PCIe",
        "NVIDIA V100 datasheet",
        {"fp32": 16.4, "fp16": 130.0},
    ),
    "t4": _Gpu(
        "NVIDIA T4",
        "NVIDIA T4 datasheet",
        {"fp32": 8.1, "fp16": 65.0},
    ),
    "a10": _Gpu(
        "NVIDIA A10",
        "NVIDIA A10 datasheet",
        {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    ),
    # AWS-only part with no NVIDIA datasheet; the A10's figures, often copied for it, do
    # not apply. 80 GA102 SMs at 1710 MHz with GeForce-rate FP32 accumulation give these,
    # as in Baseten's "NVIDIA A10 vs A10G" (more FP32 than the A10, less tensor math).
    "a10g": _Gpu(
        "NVIDIA A10G",
        "derived from SM count and boost clock; no NVIDIA datasheet",
        {"fp32": 35.0, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0},
    ),
    "a30": _Gpu(
        "NVIDIA A30",
        "NVIDIA A30 datasheet",
        {"fp32": 10.3, "tf32": 82.0, "fp16": 165.0, "bf16": 165.0},
    ),
    "a40": _Gpu(
        "NVIDIA A40",
        "NVIDIA A40 datasheet",
        {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7},
    ),
    # The A100 datasheet gives SXM and PCIe, 40 and 80 GB, the same peaks; they differ in
    # power limit, so a PCIe card sustains less of it.
    "a100_sxm": _Gpu(
        "NVIDIA A100 SXM",
        "NVIDIA A100 datasheet",
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    ),
    "a100_pcie": _Gpu(
        "NVIDIA A100 PCIe",
        "NVIDIA A100 datasheet",
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    ),
    "l4": _Gpu(
        "NVIDIA L4",
        "NVIDIA L4 datasheet",
        {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    ),
    "l40": _Gpu(
        "NVIDIA L40",
        "NVIDIA L40 datasheet",
        {"fp32": 90.5, "tf32": 90.5, "fp16": 181.05, "bf16": 181.05},
    ),
    "l40s": _Gpu(
        "NVIDIA L40S",
        "NVIDIA L40S datasheet",
        {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05},
    ),
    "h100_sxm": _Gpu(
        "NVIDIA H100 SXM",
        "NVIDIA H100 datasheet",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
    ),
    "h100_pcie": _Gpu(
        "NVIDIA H100 PCIe",
        "NVIDIA H100 datasheet",
        {"fp32": 51.0, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5},
    ),
    "h100_nvl": _Gpu(
        "NVIDIA H100 NVL",
        "NVIDIA H100 datasheet",
        {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
    ),
    "h200_sxm": _Gpu(
        "NVIDIA H200 SXM",
        "NVIDIA H200 datasheet",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
    ),
    "h200_nvl": _Gpu(
        "NVIDIA H200 NVL",
        "NVIDIA H200 datasheet",
        {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
    ),
    "rtx_3090": _Gpu(
        "NVIDIA GeForce RTX 3090",
        "NVIDIA Ampere GA102 whitepaper",
        {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
    ),
    "rtx_4090": _Gpu(
        "NVIDIA GeForce RTX 4090",
        "NVIDIA Ada Lovelace architecture whitepaper",
        {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
    ),
    "rtx_a6000": _Gpu(
        "NVIDIA RTX A6000",
        "NVIDIA RTX A6000 datasheet, Ampere GA102 whitepaper",
        {"fp32": 38.7, "tf32": 77.4, "fp16": 154.8, "bf16": 154.8},
    ),
    "rtx_6000_ada": _Gpu(
        "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA Ada Lovelace architecture whitepaper",
        {"fp32": 91.1, "tf32": 182.1, "fp16": 364.2, "bf16": 364.2},
    ),
}

# torch.cuda.get_device_name() strings, reduced by _name_key, to table entries. Whole
# names, not substrings: "A10" is a prefix of "A100" and "L4" of "L40S", and variants not
# listed here (laptop parts, "Ti", "4090 D", MIG slices) have other peaks, so they get None
# rather than the nearest match.
_NAMES: Dict[Tuple[str, ...], str] = {
    ("V100", "SXM2"): "v100_sxm2",
    ("V100", "PCIE"): "v100_pcie",
    ("V100S", "PCIE"): "v100s_pcie",
    ("T4",): "t4",
    ("A10",): "a10",
    ("A10G",): "a10g",
    ("A30",): "a30",
    ("A40",): "a40",
    ("A100", "SXM4"): "a100_sxm",
    ("A100", "SXM"): "a100_sxm",
    ("A100", "PCIE"): "a100_pcie",
    ("L4",): "l4",
    ("L40",): "l40",
    ("L40S",): "l40s",
    ("H100",): "h100_sxm",  # the SXM reports "NVIDIA H100 80GB HBM3"
    ("H100", "SXM5"): "h100_sxm",
    ("H100", "PCIE"): "h100_pcie",
    ("H100", "NVL"): "h100_nvl",
    ("H200",): "h200_sxm",
    ("H200", "NVL"): "h200_nvl",
    ("RTX", "3090"): "rtx_3090",
    ("RTX", "4090"): "rtx_4090",
    ("RTX", "A6000"): "rtx_a6000",
    ("RTX", "6000", "ADA"): "rtx_6000_ada",
    ("RTX", "6000", "ADA", "GENERATION"): "rtx_6000_ada",
}

# Words that name the brand or the memory, never the chip's compute.
_NOISE = re.compile(r"NVIDIA|TESLA|GEFORCE|HBM\w*|\d+GB")


def _name_key(device_name: str) -> Tuple[str, ...]:
    words = re.findall(r"[A-Z0-9]+", device_name.upper())
    return tuple(w for w in words if not _NOISE.fullmatch(w))


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPE_KEYS:
        raise ValueError(
            f"dtype {dtype!r} is invalid. Should be one of {list(DTYPE_KEYS)} (dtype_key(torch_dtype) gives it)."
        )


def gpu_peak_flops(device_name: str, dtype: str) -> Optional[PeakFlops]:
    """Dense peak FLOP/s of a GPU named as torch.cuda.get_device_name() names it.

    None for a GPU not in the table, or one without that math (bf16 on a V100 or T4).
    """
    _check_dtype(dtype)
    key = _NAMES.get(_name_key(device_name))
    if key is None:
        return None
    gpu = _GPUS[key]
    tflops = gpu.tflops.get(dtype)
    if tflops is None:
        return None
    return PeakFlops(tflops * 1e12, f"table: {gpu.name} {dtype} dense ({gpu.datasheet})")


def dtype_key(dtype: torch.dtype) -> str:
    """The peak-table key of the dtype the model trains in.

    float32 maps to "fp32", not "tf32": torch leaves torch.backends.cuda.matmul.allow_tf32
    False (float32 matmul precision "highest"). But torch.backends.cudnn.allow_tf32 is True
    by default, so on Ampere and later the convolutions of an fp32 model run as TF32, and a
    conv net's fp32 MFU can exceed 1; compare such a model with gpu_peak_flops(name, "tf32").
    """
    if dtype not in _TORCH_DTYPE_KEYS:
        raise ValueError(f"dtype {dtype} has no peak FLOP/s: use torch.float32, torch.float16 or torch.bfloat16")
    return _TORCH_DTYPE_KEYS[dtype]


def measure_cpu_peak_flops(
    threads: int, size: int = 1024, repeats: int = 5, dtype: torch.dtype = torch.float32
) -> PeakFlops:
    """The CPU's achievable FLOP/s with `threads` threads (a worker's share): the faster of a
    size x size matmul and a 3x3 convolution (`size` / 4 channels), best of `repeats` each.

    Both kernels, because the libraries behind them differ per CPU: on this project's AMD EPYC
    dev box torch.mm (MKL) reaches ~104 GFLOP/s on 1 thread while oneDNN's fp32 convolution
    reaches ~225, so a matmul-only peak let a ResNet's MFU read 120 %. The faster kernel is the
    closer lower bound on the hardware's peak. The fastest run is the one least disturbed by
    other processes; on a busy machine every size reads low: the result is only as good as the quiet.
    """
    for key, value in (("threads", threads), ("size", size), ("repeats", repeats)):
        if value < 1:
            raise ValueError(f"{key}={value}: must be at least 1")
    # A private generator: measuring must not shift the training run's random stream.
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
    out = torch.empty(size, size, dtype=dtype)  # reused so no run pays for an allocation
    channels, side, batch = max(1, size // 4), 14, 32
    image = torch.randn(batch, channels, side, side, generator=generator).to(dtype)
    kernel = torch.randn(channels, channels, 3, 3, generator=generator).to(dtype)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            matmul = best_seconds(lambda: torch.mm(a, b, out=out), repeats)
            conv = best_seconds(lambda: F.conv2d(image, kernel, padding=1), repeats)
    finally:
        torch.set_num_threads(previous)
    rates = {
        f"matmul {size}x{size}": 2 * size**3 / matmul,
        f"3x3 convolution {channels} channels": 2 * batch * channels * channels * 9 * side * side / conv,
    }
    best = max(rates, key=rates.get)
    name = _TORCH_DTYPE_KEYS.get(dtype, str(dtype).replace("torch.", ""))
    plural = "thread" if threads == 1 else "threads"
    seen = ", ".join(f"{kernel_name} {rate / 1e9:.0f} GFLOP/s" for kernel_name, rate in rates.items())
    return PeakFlops(
        rates[best],
        f"measured: {name} {best}, the faster of {seen}; best of {repeats}, {threads} {plural}",
    )


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `run` after one untimed: the run least disturbed by
    other processes, the closest to what the hardware can do."""
    run()  # warm-up: thread pool start, first-touch page faults, kernel selection
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def mfu(achieved_flops_per_second: float, peak: Optional[PeakFlops]) -> Optional[float]:
    """Model FLOPs utilization: achieved / peak; None when the peak is unknown."""
    if peak is None:
        return None
    return achieved_flops_per_second / peak.flops_per_second


def device_peak(
    device_name: str, is_cuda: bool, count: FlopCount, threads: int = 1, precision: str = "fp32"
) -> Optional[PeakFlops]:
    """The peak a model's achieved FLOP/s is compared with, in the precision its matmuls run in
    (bf16/fp16 autocast: that dtype's peak). GPU: the table's dense peak; in fp32, of the math the
    model's dominant op runs in: fp32 convolutions run as TF32 when cuDNN allows it (torch's default),
    fp32 matmuls only when torch.backends.cuda.matmul.allow_tf32 is set; fp32 on GPUs without TF32
    (V100, T4). CPU: the faster of a matmul and a convolution in that dtype, measured on `threads`
    threads (a worker's share), measure_cpu_peak_flops."""
    if precision != "fp32":
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        if not is_cuda:
            return measure_cpu_peak_flops(threads, dtype=dtype)
        return gpu_peak_flops(device_name, dtype_key(dtype))
    if not is_cuda:
        return measure_cpu_peak_flops(threads)
    if count.convolution_share >= 0.5:
        tf32 = torch.backends.cudnn.allow_tf32
    else:
        tf32 = torch.backends.cuda.matmul.allow_tf32
    return (gpu_peak_flops(device_name, "tf32") if tf32 else None) or gpu_peak_flops(device_name, "fp32")
