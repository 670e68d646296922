"""Memory breakdown of one real step: known answers per category, and nothing left installed."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optimizer_globals

from sweeper.measure.memory import MemoryBreakdown, track_step

CPU = torch.device("cpu")
F32 = 4  # bytes per float32 element
CATEGORIES = (
    "parameters_bytes",
    "buffers_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "activations_bytes",
    "temporaries_bytes",
    "other_bytes",
)


def two_linears() -> nn.Module:
    # The first layer's weight is 99 % of the parameters and its gradient is the last one
    # backward computes: where a mislabelled gradient would show.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.ReLU(), nn.Linear(1000, 10, bias=False))


def small_convnet() -> nn.Module:
    # Few parameters, large activations: two 16-channel 32x32 ReLU outputs per sample.
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_step(model, optimizer, inputs, targets, accumulation_steps=1, log=None):
    def step():
        for _ in range(accumulation_steps):
            loss = F.cross_entropy(model(inputs), targets)
            if log is not None:
                log[0] += loss.detach()
            (loss / accumulation_steps).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def tracked(model, optimizer, batch=32, accumulation_steps=1, warm=True, log=None):
    """Breakdown of one step; `warm` runs an untracked step first to create the state."""
    torch.manual_seed(1)
    shape = (3, 32, 32) if isinstance(model[0], nn.Conv2d) else (1000,)
    inputs, targets = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    step = make_step(model, optimizer, inputs, targets, accumulation_steps, log)
    if warm:
        step()
    result = track_step(model, optimizer, step, CPU)
    assert sum(getattr(result, name) for name in CATEGORIES) == result.peak_bytes
    return result


@pytest.mark.parametrize("warm", [True, False], ids=["state-before", "state-created"])
def test_sgd_momentum_counts_parameters_gradients_and_state_once_each(warm):
    model = two_linears()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    m = tracked(model, sgd, warm=warm)
    n = numel(model)
    assert m.parameters_bytes == F32 * n
    assert m.optimizer_state_bytes == F32 * n  # momentum buffers, never "other"
    assert m.gradients_bytes == F32 * n
    assert m.buffers_bytes == 0 and m.other_bytes == 0
    # state-created: the peak is in optimizer.step(), once the momentum buffers exist.
    if warm:
        # Peak: the first layer's weight gradient has just been computed, and the
        # gradient of that layer's output (batch x 1000) is still alive.
        assert m.temporaries_bytes == F32 * 32 * 1000
        assert m.activations_bytes < 64  # the loss scalars; the rest was freed in backward


def test_two_micro_batches_hold_an_accumulated_and_an_incoming_gradient_at_the_peak():
    model = two_linears()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    m = tracked(model, sgd, accumulation_steps=2)
    n = numel(model)
    assert m.parameters_bytes == F32 * n
    assert m.optimizer_state_bytes == F32 * n
    # All accumulated gradients, plus the second micro-batch's gradient of the first
    # weight, computed but not yet added into its .grad.
    assert m.gradients_bytes == F32 * n + F32 * 1000 * 1000
    assert m.temporaries_bytes == F32 * 32 * 1000


def test_adam_state_is_two_moments_and_a_step_tensor_its_scratch_is_temporary():
    model = two_linears()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    m = tracked(model, adam)
    n = numel(model)
    assert m.optimizer_state_bytes == 2 * F32 * n + 2 * F32  # one float32 step per param
    assert m.gradients_bytes == F32 * n
    # The peak is inside optimizer.step(): sqrt(exp_avg_sq) and its quotient for the
    # 1000x1000 weight, freed before the step ends.
    assert m.temporaries_bytes == 2 * F32 * 1000 * 1000


def convnet_breakdown(batch: int) -> MemoryBreakdown:
    model = small_convnet()
    return tracked(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batch)


def test_activations_grow_linearly_with_batch_size_parameters_do_not():
    small, large = (convnet_breakdown(batch) for batch in (32, 64))
    per_sample = 2 * 16 * 32 * 32 * F32  # the two ReLU outputs saved for backward
    assert 32 * per_sample <= small.activations_bytes < 32 * per_sample + 64
    # At the end of forward the pooled features and the logits are alive too.
    assert small.forward_activations_bytes == 32 * per_sample + 32 * (16 + 10) * F32
    assert large.activations_bytes / small.activations_bytes == pytest.approx(2, rel=0.01)
    fwd_ratio = large.forward_activations_bytes / small.forward_activations_bytes
    assert fwd_ratio == pytest.approx(2, rel=0.01)
    assert large.parameters_bytes == small.parameters_bytes
    assert small.parameters_bytes == F32 * numel(small_convnet())
    assert large.optimizer_state_bytes == small.optimizer_state_bytes
    # The peak comes early in backward: only the last layer's gradients exist yet.
    assert small.gradients_bytes == large.gradients_bytes == F32 * (16 * 10 + 10)


def test_a_tensor_the_step_writes_into_and_keeps_is_other():
    model = small_convnet()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    log = torch.zeros(1000, dtype=torch.float64)
    m = tracked(model, sgd, log=log)
    assert m.other_bytes == log.numel() * log.element_size()


def test_metrics_are_prefixed_and_name_the_tracked_peak():
    m = MemoryBreakdown(1, 2, 3, 4, 5, 6, 7, 28, 9)
    metrics = m.as_metrics()
    assert metrics["memory_parameters_bytes"] == 1
    assert metrics["memory_tracked_peak_bytes"] == 28
    assert metrics["memory_forward_activations_bytes"] == 9
    assert metrics["memory_optimizer_peak_bytes"] == 0  # not given: no phase tracked
    assert len(metrics) == 12
    assert set(m.as_metrics("x_")) == {"x_" + k[len("memory_") :] for k in metrics}


def test_each_phase_has_its_peak_and_a_weight_heavy_adamw_step_peaks_in_the_optimizer():
    """A 1024 x 1024 Linear (4 MiB of weights) at batch 1 with AdamW on the CPU: forward holds the weights and
    the two moments (12 MiB), backward adds the gradient (16 MiB), the optimizer step adds its two temporaries
    of the tensor (sqrt and division: 24 MiB)."""
    mib = 2 ** 20
    model = nn.Linear(1024, 1024, bias=False)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(1, 1024)

    def step():
        model(x).sum().backward()
        adamw.step()
        adamw.zero_grad(set_to_none=True)

    step()
    m = track_step(model, adamw, step, torch.device("cpu"))
    assert m.peak_bytes == m.optimizer_peak_bytes == max(m.forward_peak_bytes, m.backward_peak_bytes,
                                                         m.optimizer_peak_bytes)
    assert (m.forward_peak_bytes // mib, m.backward_peak_bytes // mib, m.optimizer_peak_bytes // mib) == (12, 16, 24)


def installed() -> dict:
    return {
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "global module hooks": len(module_globals._global_forward_pre_hooks)
        + len(module_globals._global_forward_hooks)
        + len(module_globals._global_forward_hooks_always_called)
        + len(module_globals._global_backward_pre_hooks)
        + len(module_globals._global_backward_hooks),
        "global optimizer hooks": len(optimizer_globals._global_optimizer_pre_hooks)
        + len(optimizer_globals._global_optimizer_post_hooks),
        "storage resize": torch.UntypedStorage.resize_,
    }


def module_and_param_hooks(model: nn.Module) -> int:
    count = 0
    for mod in model.modules():
        count += len(mod._forward_hooks) + len(mod._forward_pre_hooks)
        count += len(mod._backward_hooks) + len(mod._backward_pre_hooks)
    for p in model.parameters():
        count += len(p._backward_hooks or {})
        count += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return count


def test_nothing_stays_installed_after_a_step_even_a_failing_one():
    model = two_linears()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = installed()
    tracked(model, sgd, accumulation_steps=2)
    assert installed() == before
    assert before["dispatch modes"] == 0
    assert module_and_param_hooks(model) == 0

    def failing_step():
        F.cross_entropy(model(torch.randn(4, 1000)), torch.zeros(4, dtype=torch.long))
        raise RuntimeError("simulated failure inside the step")

    with pytest.raises(RuntimeError, match="simulated"):
        track_step(model, sgd, failing_step, CPU)
    assert installed() == before
    assert module_and_param_hooks(model) == 0
