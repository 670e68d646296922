"""FLOP counts against hand-worked answers, the peak table's name matching, MFU."""

import math
import re

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from sweeper.workloads.samples import Samples
from sweeper.measure.flops import (
    PeakFlops,
    count_flops,
    dtype_key,
    gpu_peak_flops,
    measure_cpu_peak_flops,
    mfu,
)

# count_flops warns "count_flops: ..." when it falls back to a real model; here that fails.
fake_only = pytest.mark.filterwarnings("error:count_flops")


@fake_only
def test_linear_counts_forward_and_weight_gradient_only():
    # The input needs no gradient, so backward is one matmul (weight grad): 2*B*in*out.
    c = count_flops(lambda: nn.Linear(12, 5, bias=False), Samples((12,), 5), batch_size=4)
    assert c.forward_per_sample == 2 * 12 * 5
    assert c.train_per_sample == 4 * 12 * 5


@fake_only
def test_mlp_counts_input_gradient_of_the_second_layer_only():
    def build():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    # Bias adds are not counted (FlopCounterMode counts matmuls), so biases change nothing.
    forward = 2 * 64 * 32 + 2 * 32 * 10
    backward = 2 * 64 * 32 + 2 * (2 * 32 * 10)  # weight grads; input grad of layer 2 only
    for batch_size in (2, 8):  # per sample, whatever the batch
        c = count_flops(build, Samples((1, 8, 8), 10), batch_size=batch_size)
        assert c.forward_per_sample == forward
        assert c.train_per_sample == forward + backward


def test_attentions_backward_counts_four_matmuls_not_a_fused_kernels_five():
    """Issue 46, finding 8: the model's backward of softmax(Q K^T) V is the gradients of the scores and of
    the values, two matmuls each; a fused kernel's recompute of the scores (torch's fifth) is left out, as
    MFU leaves out activation checkpointing's. Batch 2, 4 heads, 64 positions, head dim 32."""
    from sweeper.measure.flops import _attention, _attention_backward

    q = (2, 4, 64, 32)
    forward = 2 * (2 * 2 * 4 * 64 * 64 * 32)  # Q K^T and (scores) V, 2 FLOPs a multiply-add
    assert _attention(q, q, q) == forward
    assert _attention_backward(q, q, q, q) == 2 * forward  # 4 matmuls; five would be 2.5 x


@fake_only
def test_the_model_is_built_on_fake_tensors_and_the_random_stream_is_untouched():
    weights = []

    def build():
        model = nn.Linear(12, 5)
        weights.append(model.weight)
        return model

    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    count_flops(build, Samples((12,), 5))
    assert isinstance(weights[0], FakeTensor)
    assert torch.equal(torch.random.get_rng_state(), state)


class DataDependent(nn.Module):
    """A forward that branches on values: fake tensors have none, so counting falls back."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(12, 5, bias=False)

    def forward(self, x):
        return self.linear(x if x.sum() > -1e9 else -x)


def test_a_model_that_cannot_run_on_fake_tensors_is_counted_on_a_real_one():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    with pytest.warns(RuntimeWarning, match="real model"):
        c = count_flops(DataDependent, Samples((12,), 5), batch_size=4)
    assert (c.forward_per_sample, c.train_per_sample) == (2 * 12 * 5, 4 * 12 * 5)
    assert torch.equal(torch.random.get_rng_state(), state)  # real init drew from a fork


def test_an_existing_model_is_refused_and_left_untouched():
    model = nn.Linear(12, 5)
    with pytest.raises(ValueError, match="constructs a new model"):
        count_flops(lambda: model, Samples((12,), 5))
    assert model.weight.grad is None


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="batch_size=1"):
        count_flops(lambda: nn.Linear(12, 5), Samples((12,), 5), batch_size=1)
    with pytest.raises(ValueError, match="no trainable parameters"):
        count_flops(nn.Flatten, Samples((5,), 5))


@fake_only
def test_resnet18_matches_the_measured_reference():
    torchvision = pytest.importorskip("torchvision")
    c = count_flops(lambda: torchvision.models.resnet18(weights=None, num_classes=10), Samples((3, 32, 32), 10))
    # STACK.md: FlopCounterMode counted 13.91 GFLOP for a forward+backward of batch 64.
    assert c.train_per_sample == pytest.approx(13.91e9 / 64, rel=0.01)
    # Backward is ~2x forward (input grad + weight grad), less the first conv's input
    # grad, which the image does not need: 2.935 observed.
    assert 2.9 < c.train_per_sample / c.forward_per_sample < 3.0


@pytest.mark.parametrize(
    "device_name, dtype, tflops, gpu",
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0, "NVIDIA A100 SXM"),
        ("NVIDIA A100-SXM4-40GB", "fp32", 19.5, "NVIDIA A100 SXM"),
        ("NVIDIA A100-PCIE-40GB", "tf32", 156.0, "NVIDIA A100 PCIe"),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0, "NVIDIA A100 PCIe"),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5, "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "bf16", 756.5, "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "fp32", 60.0, "NVIDIA H100 NVL"),
        ("NVIDIA A10", "fp16", 125.0, "NVIDIA A10"),
        ("NVIDIA A10G", "fp16", 70.0, "NVIDIA A10G"),
        ("NVIDIA L4", "bf16", 121.0, "NVIDIA L4"),
        ("NVIDIA L40S", "bf16", 362.05, "NVIDIA L40S"),
        ("NVIDIA L40", "bf16", 181.05, "NVIDIA L40"),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0, "NVIDIA V100 SXM2"),
        ("Tesla T4", "fp32", 8.1, "NVIDIA T4"),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2, "NVIDIA GeForce RTX 4090"),
        ("NVIDIA RTX 6000 Ada Generation", "fp32", 91.1, "NVIDIA RTX 6000 Ada Generation"),
    ],
)
def test_gpu_names_match_their_own_row(device_name, dtype, tflops, gpu):
    peak = gpu_peak_flops(device_name, dtype)
    assert peak is not None and peak.flops_per_second == pytest.approx(tflops * 1e12)
    # The row's name then the dtype: "NVIDIA A10 " cannot be "NVIDIA A100 ..." or "A10G".
    assert peak.source.startswith(f"table: {gpu} {dtype} dense (")


@pytest.mark.parametrize(
    "device_name, dtype",
    [
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "fp32"),  # a different, slower part
        ("NVIDIA GeForce RTX 3090 Ti", "fp32"),
        ("Quadro RTX 6000", "fp32"),  # Turing, not the RTX 6000 Ada
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "fp32"),  # a slice of the GPU
        ("AMD Instinct MI300X", "bf16"),
        ("Tesla T4", "bf16"),  # Turing has no bf16
        ("Tesla V100-SXM2-16GB", "tf32"),
    ],
)
def test_unknown_gpus_and_missing_math_have_no_peak(device_name, dtype):
    assert gpu_peak_flops(device_name, dtype) is None


def test_dtype_keys():
    assert [dtype_key(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == [
        "fp32",
        "fp16",
        "bf16",
    ]
    with pytest.raises(ValueError, match="float64"):
        dtype_key(torch.float64)
    with pytest.raises(ValueError, match="is invalid. Should be one of"):
        gpu_peak_flops("Tesla T4", "float32")


def test_cpu_peak_is_measured_with_the_given_threads_then_restores_them(monkeypatch):
    before = torch.get_num_threads()
    threads = 1 if before != 1 else 2
    state = torch.random.get_rng_state()
    peak = measure_cpu_peak_flops(threads, size=256, repeats=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert math.isfinite(peak.flops_per_second) and peak.flops_per_second > 0
    plural = "thread" if threads == 1 else "threads"
    # The faster kernel is the peak, and the source names both figures so the choice can be checked.
    match = re.fullmatch(
        r"measured: fp32 (matmul 256x256|3x3 convolution 64 channels), the faster of "
        r"matmul 256x256 (\d+) GFLOP/s, 3x3 convolution 64 channels (\d+) GFLOP/s; "
        rf"best of 2, {threads} {plural}",
        peak.source,
    )
    assert match, peak.source
    matmul, conv = int(match.group(2)), int(match.group(3))
    if matmul != conv:  # (equal once rounded to whole GFLOP/s: either may be the faster)
        assert match.group(1).startswith("matmul" if matmul > conv else "3x3")
    assert round(peak.flops_per_second / 1e9) == max(matmul, conv)
    assert torch.get_num_threads() == before

    seen = []

    def failing_mm(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise RuntimeError("simulated matmul failure")

    monkeypatch.setattr(torch, "mm", failing_mm)
    with pytest.raises(RuntimeError, match="simulated"):
        measure_cpu_peak_flops(threads, size=8)
    assert seen == [threads] and torch.get_num_threads() == before


def test_mfu():
    assert mfu(5e12, PeakFlops(20e12, "table: test")) == 0.25
    assert mfu(5e12, None) is None
