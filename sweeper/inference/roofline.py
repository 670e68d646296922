"""The roofline of batched inference: the bytes one forward pass moves, its arithmetic intensity, and the
batch size where it stops being memory-bound (seed 003's knee), predicted and measured. Pure arithmetic.

Conventions
-----------
- A multiply-add is 2 FLOPs, as torch's FlopCounterMode counts (so flops.count_flops, the FlopCount a
  trial carries, and bandwidth.forward_traffic) and as datasheet peaks are quoted: a 1024 x 1024 Linear
  is 2 * 1024 * 1024 FLOPs per sample. Intensities and ridge points are in FLOPs per byte.
- Bytes and bandwidths are decimal: GB/s means 1e9 bytes per second, as the datasheets print them.
- The traffic model is an unfused (eager) forward: every op reads its inputs from and writes its outputs
  to device memory; weights are read once per batch. Caches that hold weights or activations between
  ops (a CPU's L3, a GPU's L2, a fused kernel) make the real traffic smaller.

Seed 003's arithmetic, and its comment thread
---------------------------------------------
The seed: "65 TFLOPS of fp32 and 300 GB/s, so the magic ratio should be 216"; a reader: "65 TFLOPS /
(2 * 300 GB/s) = 108". Per m x n weight matrix at batch B, loading the weights takes m*n*s / bandwidth
(s bytes per weight) and the math 2*m*n*B / peak, so the two are equal at

    B* = (peak / bandwidth) * (s / 2) = ridge (FLOPs per byte) * bytes per weight / FLOPs per multiply-add.

- With fp16 weights (s = 2) the factors of 2 cancel and B* = 65e12 / 300e9 = 216.7: the seed's figure
  is right for fp16, though its text never says where the bytes per weight went.
- The reader's 108 halves for the 2 FLOPs per multiply-add but counts one byte per weight: that is the
  knee for int8 weights, or the ridge point in multiply-adds per byte (108.3 MAC/B = 216.7 FLOP/B).
- 65 TFLOPS is the T4's fp16 tensor-core peak; its fp32 peak is 8.1 TFLOPS (NVIDIA T4 datasheet), so
  "fp32" is the slip, and fp16 the reading that makes the numbers consistent. The datasheet bandwidth
  is 320 GB/s, not 300 (B* = 203 with 320).
- Exactly, for the seed's MLP (depth 8, width 1024, 1024 inputs, 10 classes; fp16): the biases add
  bytes but no counted FLOPs, so weights W = 16,814,100 bytes against 16,797,696 FLOPs per sample and
  B* = 216.9 (weights only, as the seed reasons): 256 on a power-of-two grid.
- An eager forward also moves activations: each Linear reads and writes 2 KiB per sample and so does
  each separate ReLU, 67,604 bytes per sample in all, which caps the intensity at 16,797,696 / 67,604
  = 248 FLOP/B, barely above the T4's ridge of 216.7: B* = 216.7 * W / (f - 216.7 * a) = 1,694 (2048;
  1024 by the measured knee's 10 %-per-doubling rule, since the activations already slow the climb).
- Had the seed run PyTorch's default fp32 (8.1 TFLOPS, 320 GB/s, W = 33.6 MB, a = 135 KB per sample),
  B* = 63.6 (64 on the grid), which agrees better with the knee it measured "around ~128" than
  either fp16 figure does; the seed does not say which it ran.
tests/unit/test_roofline.py holds these numbers as known answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Optional, Sequence

from sweeper.measure.knee import knee as _series_knee

# Seed 003's example: "65 TFLOPS" (the T4's fp16 tensor-core peak), "300 GB/s" (the datasheet says 320).
SEED_003_PEAK_FLOPS_PER_SECOND = 65e12
SEED_003_BANDWIDTH_BYTES_PER_SECOND = 300e9
FLOPS_PER_MULTIPLY_ADD = 2  # torch's FlopCounterMode and every datasheet peak


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_second: float
    source: str  # e.g. "table: NVIDIA T4 (NVIDIA T4 datasheet)" or "measured: copy of 256 MiB ..."


@dataclass(frozen=True)
class _GpuMemory:
    name: str
    datasheet: str
    # GB/s by memory size in GB where one name covers parts with different memory (the A100 40 and
    # 80 GB); the key None when the bandwidth does not depend on it.
    gb_per_second: Dict[Optional[int], float]


# Datasheet memory bandwidth in GB/s (1e9 bytes/s), keyed like flops._GPUS so that one name match finds
# both a GPU's peak FLOP/s and its bandwidth (bandwidth.gpu_bandwidth does the matching).
GPU_BANDWIDTH: Dict[str, _GpuMemory] = {
    "v100_sxm2": _GpuMemory("NVIDIA V100 SXM2", "NVIDIA V100 datasheet", {None: 900.0}),
    "v100_pcie": _GpuMemory("NVIDIA V100 PCIe", "NVIDIA V100 datasheet", {None: 900.0}),
    "v100s_pcie": _GpuMemory("NVIDIA V100S PCIe", "NVIDIA V100 datasheet", {None: 1134.0}),
    "t4": _GpuMemory("NVIDIA T4", "NVIDIA T4 datasheet (320+ GB/s)", {None: 320.0}),
    "a10": _GpuMemory("NVIDIA A10", "NVIDIA A10 datasheet", {None: 600.0}),
    # No NVIDIA datasheet (AWS-only part): 384-bit GDDR6 at 12.5 Gbps, as AWS's G5 pages give it.
    "a10g": _GpuMemory("NVIDIA A10G", "derived from bus width and memory clock; no NVIDIA datasheet", {None: 600.0}),
    "a30": _GpuMemory("NVIDIA A30", "NVIDIA A30 datasheet", {None: 933.0}),
    "a40": _GpuMemory("NVIDIA A40", "NVIDIA A40 datasheet", {None: 696.0}),
    # The 40 GB parts have HBM2, the 80 GB parts HBM2e; the 80 GB PCIe runs it slower than the SXM.
    "a100_sxm": _GpuMemory("NVIDIA A100 SXM", "NVIDIA A100 datasheet", {40: 1555.0, 80: 2039.0}),
    "a100_pcie": _GpuMemory("NVIDIA A100 PCIe", "NVIDIA A100 datasheet", {40: 1555.0, 80: 1935.0}),
    "l4": _GpuMemory("NVIDIA L4", "NVIDIA L4 datasheet", {None: 300.0}),
    "l40": _GpuMemory("NVIDIA L40", "NVIDIA L40 datasheet", {None: 864.0}),
    "l40s": _GpuMemory("NVIDIA L40S", "NVIDIA L40S datasheet", {None: 864.0}),
    "h100_sxm": _GpuMemory("NVIDIA H100 SXM", "NVIDIA H100 datasheet", {None: 3350.0}),
    "h100_pcie": _GpuMemory("NVIDIA H100 PCIe", "NVIDIA H100 datasheet", {None: 2000.0}),
    "h100_nvl": _GpuMemory("NVIDIA H100 NVL", "NVIDIA H100 datasheet", {None: 3900.0}),
    "h200_sxm": _GpuMemory("NVIDIA H200 SXM", "NVIDIA H200 datasheet", {None: 4800.0}),
    "h200_nvl": _GpuMemory("NVIDIA H200 NVL", "NVIDIA H200 datasheet", {None: 4800.0}),
    # GeForce: bus width x data rate from the architecture whitepapers (384-bit GDDR6X).
    "rtx_3090": _GpuMemory("NVIDIA GeForce RTX 3090", "NVIDIA Ampere GA102 whitepaper", {None: 936.0}),
    "rtx_4090": _GpuMemory("NVIDIA GeForce RTX 4090", "NVIDIA Ada Lovelace architecture whitepaper", {None: 1008.0}),
    "rtx_a6000": _GpuMemory("NVIDIA RTX A6000", "NVIDIA RTX A6000 datasheet", {None: 768.0}),
    "rtx_6000_ada": _GpuMemory(
        "NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation datasheet", {None: 960.0}
    ),
}


def table_bandwidth(key: str, memory_gb: Optional[float] = None) -> Optional[Bandwidth]:
    """The datasheet bandwidth of the GPU table entry `key` (a flops._GPUS key).

    Where the bandwidth depends on the memory size (A100 40 vs 80 GB), `memory_gb` picks the nearest
    size; without it such an entry gives None rather than a guess. None for an unknown key too.
    """
    gpu = GPU_BANDWIDTH.get(key)
    if gpu is None:
        return None
    sizes = gpu.gb_per_second
    if None in sizes:
        size, gbps = None, sizes[None]
    elif memory_gb is None:
        return None
    else:
        size = min((s for s in sizes if s is not None), key=lambda s: abs(s - memory_gb))
        gbps = sizes[size]
    label = gpu.name if size is None else f"{gpu.name} {size}GB"
    return Bandwidth(gbps * 1e9, f"table: {label} {gbps:g} GB/s ({gpu.datasheet})")


# ---------------------------------------------------------------------------------------------------
# The prediction


def bytes_moved(batch_size: float, weight_bytes: float, activation_bytes_per_sample: float) -> float:
    """Bytes one forward pass of `batch_size` samples moves: the weights, read once for the whole batch,
    plus every op's inputs read and outputs written, which grow with the batch."""
    return weight_bytes + activation_bytes_per_sample * batch_size


def arithmetic_intensity(
    batch_size: float, flops_per_sample: float, weight_bytes: float, activation_bytes_per_sample: float
) -> float:
    """FLOPs per byte moved of one forward pass of `batch_size` samples."""
    return flops_per_sample * batch_size / bytes_moved(batch_size, weight_bytes, activation_bytes_per_sample)


@dataclass(frozen=True)
class KneePrediction:
    """Where a forward pass turns from memory-bound to compute-bound, on an ideal roofline.

    knee_batch_size: the batch size whose arithmetic intensity equals the device's ridge point (peak
    FLOP/s / bandwidth): below it the weights' transfer sets the time and a bigger batch is nearly
    free; above it the math does and throughput stops growing. None when the intensity never reaches
    the ridge (the activations alone move too many bytes per FLOP): memory-bound at any batch size.
    Below 1 when the model is compute-bound from batch 1.
    knee_batch_size_pow2: the knee rounded up to a power of two (1 if compute-bound from batch 1), the
    grid a batch-size sweep uses. `knee_on_grid` applies the measured knee's rule to the predicted curve
    instead, which is the figure to set beside `measured_knee`.
    """

    flops_per_sample: float
    weight_bytes: float
    activation_bytes_per_sample: float
    peak_flops_per_second: float
    bandwidth_bytes_per_second: float
    ridge_flops_per_byte: float
    intensity_at_batch_1: float
    max_intensity_flops_per_byte: float  # as the batch grows without bound; inf without activation bytes
    knee_batch_size: Optional[float]
    knee_batch_size_pow2: Optional[int]
    explanation: str

    def intensity(self, batch_size: float) -> float:
        return arithmetic_intensity(batch_size, self.flops_per_sample, self.weight_bytes,
                                    self.activation_bytes_per_sample)

    def seconds(self, batch_size: float) -> float:
        """Roofline time of one forward pass: the longer of its math at peak and its bytes at bandwidth."""
        compute = self.flops_per_sample * batch_size / self.peak_flops_per_second
        memory = bytes_moved(batch_size, self.weight_bytes, self.activation_bytes_per_sample)
        return max(compute, memory / self.bandwidth_bytes_per_second)

    def samples_per_second(self, batch_size: float) -> float:
        return batch_size / self.seconds(batch_size)

    def knee_on_grid(self, batch_sizes: Sequence[int], min_gain: float = 0.10) -> Optional[int]:
        """`measured_knee` of the roofline's own throughput at `batch_sizes`: the knee a perfect device
        would show on that grid under the same rule, so it compares like with like with a measurement.
        Without activation bytes, on a doubling grid, it is the first size above knee_batch_size /
        (1 + min_gain); activation bytes flatten the climb before the knee and move it earlier."""
        return measured_knee(batch_sizes, [self.samples_per_second(b) for b in batch_sizes], min_gain)


def predict_knee(
    flops_per_sample: float,
    weight_bytes: float,
    activation_bytes_per_sample: float,
    peak_flops_per_second: float,
    bandwidth_bytes_per_second: float,
) -> KneePrediction:
    """Solve flops_per_sample * B / (W + a * B) = ridge for B: B* = ridge * W / (flops_per_sample - ridge * a).

    W is `weight_bytes` (parameters and buffers, read once per batch), a is
    `activation_bytes_per_sample` (bytes read and written by the ops, per sample), ridge is
    peak_flops_per_second / bandwidth_bytes_per_second in FLOPs per byte, FLOPs counting a multiply-add
    as 2 (torch's FlopCounterMode convention). No knee when flops_per_sample <= ridge * a.
    """
    _check_knee_inputs(flops_per_sample, weight_bytes, activation_bytes_per_sample, peak_flops_per_second,
                       bandwidth_bytes_per_second)
    ridge = peak_flops_per_second / bandwidth_bytes_per_second
    denominator = flops_per_sample - ridge * activation_bytes_per_sample
    knee = ridge * weight_bytes / denominator if denominator > 0 else None
    ceiling = flops_per_sample / activation_bytes_per_sample if activation_bytes_per_sample else math.inf
    numbers = KneePrediction(
        flops_per_sample=float(flops_per_sample),
        weight_bytes=float(weight_bytes),
        activation_bytes_per_sample=float(activation_bytes_per_sample),
        peak_flops_per_second=float(peak_flops_per_second),
        bandwidth_bytes_per_second=float(bandwidth_bytes_per_second),
        ridge_flops_per_byte=ridge,
        intensity_at_batch_1=arithmetic_intensity(1, flops_per_sample, weight_bytes, activation_bytes_per_sample),
        max_intensity_flops_per_byte=ceiling,
        knee_batch_size=knee,
        knee_batch_size_pow2=None if knee is None else 1 if knee <= 1 else 2 ** math.ceil(math.log2(knee)),
        explanation="",
    )
    return replace(numbers, explanation=_explanation(numbers))


def _check_knee_inputs(
    flops_per_sample: float,
    weight_bytes: float,
    activation_bytes_per_sample: float,
    peak_flops_per_second: float,
    bandwidth_bytes_per_second: float,
) -> None:
    """ValueError naming the first argument of predict_knee that no roofline can have."""
    for name, value in (
        ("flops_per_sample", flops_per_sample),
        ("peak_flops_per_second", peak_flops_per_second),
        ("bandwidth_bytes_per_second", bandwidth_bytes_per_second),
    ):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name}={value!r} is invalid: it must be a positive, finite number")
    for name, value in (("weight_bytes", weight_bytes), ("activation_bytes_per_sample", activation_bytes_per_sample)):
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name}={value!r} is invalid: it must be a finite number of bytes, >= 0")
    if weight_bytes == 0 and activation_bytes_per_sample == 0:
        raise ValueError("weight_bytes and activation_bytes_per_sample are both 0: a forward pass moves some bytes")


def _explanation(p: KneePrediction) -> str:
    """The prediction in words, with the arithmetic behind it: memory-bound at every batch size,
    compute-bound from batch 1, or the knee between."""
    device = (
        f"ridge {p.ridge_flops_per_byte:.1f} FLOP/B ({p.peak_flops_per_second / 1e12:.3g} TFLOP/s / "
        f"{p.bandwidth_bytes_per_second / 1e9:.3g} GB/s)"
    )
    if p.knee_batch_size is None:
        return (
            f"Memory-bound at every batch size: the intensity rises from {p.intensity_at_batch_1:.2f} FLOP/B at "
            f"batch 1 towards {p.max_intensity_flops_per_byte:.1f} FLOP/B, the activations' own "
            f"({p.flops_per_sample:.4g} FLOPs per {p.activation_bytes_per_sample:.4g} bytes per sample), and "
            f"never reaches the {device}."
        )
    if p.knee_batch_size <= 1:
        return (
            f"Compute-bound from batch 1: its intensity of {p.intensity_at_batch_1:.1f} FLOP/B is already above "
            f"the {device}; batching cannot raise throughput past the peak FLOP/s."
        )
    ridge, knee = p.ridge_flops_per_byte, p.knee_batch_size
    return (
        f"Memory-bound below batch {knee:.1f} (rounded up: {p.knee_batch_size_pow2}), compute-bound above: the "
        f"intensity rises from {p.intensity_at_batch_1:.2f} FLOP/B at batch 1 (the {p.weight_bytes:.4g} weight "
        f"bytes read once per batch dominate) and reaches the {device} at B* = ridge x W / (f - ridge x a) = "
        f"{ridge:.1f} x {p.weight_bytes:.4g} / ({p.flops_per_sample:.4g} - {ridge:.1f} x "
        f"{p.activation_bytes_per_sample:.4g}) = {knee:.1f}."
    )


# ---------------------------------------------------------------------------------------------------
# The measurement


def measured_knee(
    batch_sizes: Sequence[int], samples_per_second: Sequence[float], min_gain: float = 0.10
) -> Optional[int]:
    """The first batch size from which no doubling of the batch gains `min_gain` in throughput any more.

    Gains are scored per doubling as the training sweep's knee rule does (sweeper.analysis.knee),
    `(t2 / t1) ** (1 / log2(b2 / b1)) - 1`, so a sparse grid is judged like a doubling one. Unlike the
    training rule, which stops at the first step that gains too little, an early dip does not end the
    climb: on a CPU batch 2 can be slower per sample than batch 1 (a different matmul kernel) while
    throughput still grows tenfold after it. The knee is the batch after the last step that gains
    `min_gain`. None when the last step still does (still climbing: measure larger batches) or with
    fewer than two points.
    """
    if len(batch_sizes) != len(samples_per_second):
        raise ValueError(
            f"batch_sizes has {len(batch_sizes)} entries but samples_per_second has {len(samples_per_second)}: "
            "give one throughput per batch size (leave out sizes without an ok measurement)"
        )
    ordered = sorted((int(b), float(t)) for b, t in zip(batch_sizes, samples_per_second))
    if len(ordered) < 2:
        return None
    _series_knee(ordered, min_gain)  # the same checks on the input (positive, no duplicates)
    climbing = [
        i for i, ((b1, t1), (b2, t2)) in enumerate(zip(ordered, ordered[1:]))
        if (t2 / t1) ** (1.0 / math.log2(b2 / b1)) - 1.0 >= min_gain
    ]
    if not climbing:
        return ordered[0][0]
    last = climbing[-1] + 1  # the batch the last paying step reached
    return None if last == len(ordered) - 1 else ordered[last][0]


__all__ = [
    "FLOPS_PER_MULTIPLY_ADD",
    "GPU_BANDWIDTH",
    "SEED_003_BANDWIDTH_BYTES_PER_SECOND",
    "SEED_003_PEAK_FLOPS_PER_SECOND",
    "Bandwidth",
    "KneePrediction",
    "arithmetic_intensity",
    "bytes_moved",
    "measured_knee",
    "predict_knee",
    "table_bandwidth",
]
