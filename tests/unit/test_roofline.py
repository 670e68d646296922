"""The roofline arithmetic (pure), seed 003's corrected numbers, and the torch-side traffic and bandwidth."""

import math
import subprocess
import sys

import pytest
import torch

from sweeper.config import ModelConfig
from sweeper.inference import roofline
from sweeper.inference.roofline import measured_knee, predict_knee
from sweeper.inference import bandwidth
from sweeper.measure import flops

SEED_MLP = ModelConfig(name="mlp", input_shape=[1024], depth=8, width=1024)
DOUBLING = [2**i for i in range(10)]  # 1 .. 512, seed 003's grid


# ---------------------------------------------------------------------------------------------------
# The knee formula


def test_knee_formula_on_known_numbers():
    # ridge = 1000 / 100 = 10 FLOP/B; B* = 10 * 1000 / (100 - 10 * 5) = 200.
    p = predict_knee(flops_per_sample=100, weight_bytes=1000, activation_bytes_per_sample=5,
                     peak_flops_per_second=1000, bandwidth_bytes_per_second=100)
    assert p.ridge_flops_per_byte == 10
    assert p.knee_batch_size == pytest.approx(200)
    assert p.knee_batch_size_pow2 == 256
    assert p.intensity_at_batch_1 == pytest.approx(100 / 1005)
    assert p.max_intensity_flops_per_byte == pytest.approx(20)
    assert p.intensity(p.knee_batch_size) == pytest.approx(p.ridge_flops_per_byte)  # the defining property
    # At the knee the math and the bytes take equally long; either side, the other one does.
    assert 200 * 100 / 1000 == pytest.approx((1000 + 5 * 200) / 100)
    assert p.seconds(100) == pytest.approx((1000 + 500) / 100)  # memory-bound
    assert p.seconds(400) == pytest.approx(400 * 100 / 1000)  # compute-bound
    assert "200.0" in p.explanation and "256" in p.explanation


def test_knee_without_activation_traffic_is_ridge_times_weight_bytes_per_flop():
    p = predict_knee(100, 1000, 0, 1000, 100)
    assert p.knee_batch_size == pytest.approx(100) and p.knee_batch_size_pow2 == 128
    assert math.isinf(p.max_intensity_flops_per_byte)


def test_no_knee_when_activations_alone_are_memory_bound():
    # 100 FLOPs per 10 bytes per sample is exactly the ridge: the intensity only approaches it.
    p = predict_knee(100, 1000, 10, 1000, 100)
    assert p.knee_batch_size is None and p.knee_batch_size_pow2 is None
    assert "Memory-bound at every batch size" in p.explanation
    assert p.knee_on_grid(DOUBLING) is None  # throughput never stops climbing on the ideal roofline


def test_compute_bound_from_batch_1():
    p = predict_knee(1e6, 1000, 0, 1000, 100)
    assert p.knee_batch_size == pytest.approx(0.01) and p.knee_batch_size_pow2 == 1
    assert p.intensity_at_batch_1 > p.ridge_flops_per_byte
    assert "Compute-bound from batch 1" in p.explanation


@pytest.mark.parametrize(
    "args, key",
    [
        ((0, 1000, 0, 1000, 100), "flops_per_sample"),
        ((100, -1, 0, 1000, 100), "weight_bytes"),
        ((100, 1000, 0, 1000, 0), "bandwidth_bytes_per_second"),
        ((100, 1000, 0, math.nan, 100), "peak_flops_per_second"),
        ((100, 0, 0, 1000, 100), "both 0"),
    ],
)
def test_predict_knee_rejects_nonsense_naming_the_argument(args, key):
    with pytest.raises(ValueError, match=key):
        predict_knee(*args)


def test_bytes_moved_reads_weights_once_per_batch():
    assert roofline.bytes_moved(1, 1000, 5) == 1005
    assert roofline.bytes_moved(64, 1000, 5) == 1000 + 64 * 5


# ---------------------------------------------------------------------------------------------------
# Seed 003: the corrected arithmetic, with its own MLP traced in fp16


@pytest.fixture(scope="module")
def seed_mlp_fp16():
    return bandwidth.model_traffic(SEED_MLP, num_classes=10, dtype=torch.float16)


def test_seed_003_mlp_traffic_in_fp16_is_exact(seed_mlp_fp16):
    t = seed_mlp_fp16
    params = 8 * (1024 * 1024 + 1024) + 1024 * 10 + 10
    assert t.weight_bytes == 2 * params == 16_814_100
    # 2 FLOPs per multiply-add, bias adds not counted: 2 * (8 * 1024 * 1024 + 1024 * 10).
    assert t.forward_flops_per_sample == 16_797_696
    # Per sample, fp16: each of 8 Linears reads 2 KiB and writes 2 KiB, so does each ReLU; the
    # classifier reads 2 KiB and writes 10 values. Flatten is a view and moves nothing.
    assert t.activation_bytes_per_sample == 8 * 4 * 2048 + 2048 + 2 * 10 == 67_604
    assert t.fixed_bytes == pytest.approx(t.weight_bytes)  # every weight read once, nothing else fixed


def test_seed_003_corrected_arithmetic(seed_mlp_fp16):
    peak, bw = roofline.SEED_003_PEAK_FLOPS_PER_SECOND, roofline.SEED_003_BANDWIDTH_BYTES_PER_SECOND
    t = seed_mlp_fp16
    ridge = peak / bw
    assert ridge == pytest.approx(216.667, abs=1e-3)  # FLOPs per byte
    assert ridge / roofline.FLOPS_PER_MULTIPLY_ADD == pytest.approx(108.333, abs=1e-3)  # the reader's "108": MACs/B

    # The seed's own reasoning (weights only), done with fp16 bytes and 2 FLOPs per multiply-add: the
    # 2 bytes per weight cancel the 2 FLOPs per multiply-add, so B* = ridge (plus the biases' bytes).
    weights_only = predict_knee(t.forward_flops_per_sample, t.weight_bytes, 0, peak, bw)
    assert weights_only.knee_batch_size == pytest.approx(216.878, abs=1e-3)
    assert weights_only.knee_batch_size_pow2 == 256
    assert weights_only.intensity_at_batch_1 == pytest.approx(16_797_696 / 16_814_100)  # ~1 FLOP/B in fp16
    # The reader's 108 is this MLP's knee with one byte per weight (int8), not with fp16.
    one_byte = predict_knee(t.forward_flops_per_sample, t.weight_bytes / 2, 0, peak, bw)
    assert one_byte.knee_batch_size == pytest.approx(108.439, abs=1e-3)

    # An eager forward's activation traffic caps the intensity at 248 FLOP/B, just over the ridge.
    eager = predict_knee(t.forward_flops_per_sample, t.weight_bytes, t.activation_bytes_per_sample, peak, bw)
    assert eager.max_intensity_flops_per_byte == pytest.approx(248.472, abs=1e-3)
    assert eager.knee_batch_size == pytest.approx(1694.32, abs=0.01)
    assert eager.knee_batch_size_pow2 == 2048
    assert eager.knee_on_grid([2**i for i in range(13)]) == 1024


def test_seed_003_in_fp32_on_the_t4s_fp32_peak():
    # What PyTorch runs by default: fp32 weights and math, the T4's datasheet 8.1 TFLOPS and 320 GB/s.
    t = bandwidth.model_traffic(SEED_MLP, num_classes=10)
    assert t.weight_bytes == 33_628_200 and t.activation_bytes_per_sample == 135_208
    peak = flops.gpu_peak_flops("Tesla T4", "fp32").flops_per_second
    bw = bandwidth.gpu_bandwidth("Tesla T4").bytes_per_second
    p = predict_knee(t.forward_flops_per_sample, t.weight_bytes, t.activation_bytes_per_sample, peak, bw)
    assert p.knee_batch_size == pytest.approx(63.641, abs=1e-3)
    assert p.knee_on_grid(DOUBLING) == 64


# ---------------------------------------------------------------------------------------------------
# The measured knee


def test_measured_knee_on_a_synthetic_roofline_curve():
    # Flat time (memory-bound) to B* = 100, then linear: throughput doubles up to 64, then 64 -> 128
    # gains 100/64 - 1 = 56 %, 128 -> 256 nothing.
    def throughput(b):
        return b / max(1.0, b / 100)

    assert measured_knee(DOUBLING, [throughput(b) for b in DOUBLING]) == 128
    # A B* just above a grid point: 128 -> 256 gains 140/128 - 1 = 9.4 % < 10 %, so the knee is 128.
    assert measured_knee(DOUBLING, [b / max(1.0, b / 140) for b in DOUBLING]) == 128
    assert measured_knee(DOUBLING, [b / max(1.0, b / 150) for b in DOUBLING]) == 256


def test_measured_knee_uses_the_training_rule_per_doubling():
    sizes = [1, 2, 4, 8, 16, 32, 64]
    rates = [100, 190, 360, 640, 1000, 1050, 1060]
    assert measured_knee(sizes, rates) == 16
    assert measured_knee(sizes, rates, min_gain=0.04) == 32
    assert measured_knee([1, 2, 4], [10, 20, 40]) is None  # still climbing
    # A sparse grid is judged per doubling: 16 -> 64 at +21 % is +10 % per doubling.
    assert measured_knee([16, 64], [100, 121.5]) is None
    assert measured_knee([16, 64], [100, 120]) == 16
    with pytest.raises(ValueError, match="one throughput per batch size"):
        measured_knee([1, 2], [1.0])


def test_knee_on_grid_matches_measured_knee_of_the_predicted_curve():
    p = predict_knee(100, 1000, 0, 1000, 100)  # B* = 100
    assert p.knee_on_grid(DOUBLING) == measured_knee(DOUBLING, [p.samples_per_second(b) for b in DOUBLING]) == 128


# ---------------------------------------------------------------------------------------------------
# Bandwidth: the datasheet table and the CPU measurement


@pytest.mark.parametrize(
    "name, gb_per_second",
    [
        ("Tesla T4", 320),
        ("NVIDIA A100-SXM4-40GB", 1555),
        ("NVIDIA A100-SXM4-80GB", 2039),
        ("NVIDIA A100-PCIE-40GB", 1555),
        ("NVIDIA A100 80GB PCIe", 1935),
        ("NVIDIA H100 80GB HBM3", 3350),
        ("NVIDIA H100 PCIe", 2000),
        ("NVIDIA L4", 300),
        ("NVIDIA A10", 600),
        ("Tesla V100-SXM2-32GB", 900),
        ("NVIDIA GeForce RTX 4090", 1008),
        ("NVIDIA GeForce RTX 3090", 936),
    ],
)
def test_gpu_bandwidth_from_the_datasheet_table(name, gb_per_second):
    found = bandwidth.gpu_bandwidth(name)
    assert found is not None and found.bytes_per_second == gb_per_second * 1e9
    assert found.source.startswith("table: ")


def test_gpu_bandwidth_refuses_to_guess():
    assert bandwidth.gpu_bandwidth("NVIDIA GeForce RTX 4090 D") is None  # a variant: other figures
    assert bandwidth.gpu_bandwidth("NVIDIA A100-SXM4") is None  # 40 or 80 GB: they differ
    # The size from the device's memory instead (an 80 GB A100 reports ~85e9 bytes).
    assert bandwidth.gpu_bandwidth("NVIDIA A100-SXM4", total_memory_bytes=85_100_000_000).bytes_per_second == 2039e9


def test_bandwidth_table_is_keyed_like_the_peak_flops_table():
    assert set(roofline.GPU_BANDWIDTH) == set(flops._GPUS)


def test_cpu_bandwidth_is_the_bytes_a_copy_reads_and_writes_over_its_best_time(monkeypatch):
    # The copy runs for real; its best time is given (1/128 s), so the figure is exact. The machine's own
    # figure is a benchmark: scripts/bench_clocks.py.
    seen = []

    def best_seconds(run, repeats):
        copied = run()
        seen.append((repeats, copied.numel(), bool((copied == 1).all()), torch.get_num_threads()))
        return 2 ** -7

    monkeypatch.setattr(flops, "best_seconds", best_seconds)
    measured = bandwidth.measure_cpu_bandwidth(threads=1, size_bytes=64 * 2**20, repeats=3)
    assert seen == [(3, 16 * 2**20, True, 1)]  # 64 MiB of float32 ones copied, best of 3, on 1 thread
    # Read and written: 2 x 64 MiB = 134217728 bytes in 1/128 s, 17179869184 bytes/s (17.2 GB/s).
    assert measured.bytes_per_second == 17179869184.0
    assert measured.source == "measured: copy of 64 MiB (read + write counted), best of 3, 1 thread"
    with pytest.raises(ValueError, match="threads=0"):
        bandwidth.measure_cpu_bandwidth(threads=0)


def test_forward_traffic_slope_leaves_out_fixed_size_tensors():
    # eval BatchNorm reads its four statistics whatever the batch: they are weights, not per sample.
    def build():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))

    t = bandwidth.forward_traffic(build, [8])
    assert t.weight_bytes == 4 * (8 * 4 + 4 + 4 * 4) + 8  # params, running stats and the batch counter
    # Linear reads 8 and writes 4 floats a sample; BatchNorm reads 4 and writes 4.
    assert t.activation_bytes_per_sample == 4 * (8 + 4 + 4 + 4)
    assert t.forward_flops_per_sample == 2 * 8 * 4


def test_roofline_stays_pure():
    # The arithmetic runs (and is tested) without torch: the driver can import it cheaply.
    code = "import sys, sweeper.inference.roofline; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_early_dip_does_not_end_the_climb():
    # Measured here on the seed-003 MLP (1 thread): batch 2 is slower per sample than batch 1.
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    rates = [510, 552, 1240, 2051, 2964, 3858, 4385, 4918, 4902, 5184]
    assert measured_knee(sizes, rates) == 128
