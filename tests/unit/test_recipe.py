"""The recipe as users train: its memory and FLOPs move the known ways (measured here on resnet18 and
the MLP, real tensors on this CPU), its optimizer state has the size it must, and a point trains in
it (bf16 and fp16 autocast, a GradScaler, checkpointing, AdamW, label smoothing, torch.compile)."""

import time

import pytest
import torch
import torch.nn.functional as F

from sweeper.workloads.samples import Samples
from sweeper import recipe
from sweeper.config import DataConfig, LossConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.measure import flops, memory
from sweeper.plan import GridPoint
from sweeper.worker import train as train_module
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.train import train_point
from sweeper.workloads import models
from tests.helpers import forwards_take

RESNET = ModelConfig(name="resnet18", input_shape=[3, 32, 32])
MLP = ModelConfig(name="mlp", depth=4, width=256, input_shape=[1, 16, 16])
CPU = torch.device("cpu")


def forward_activations(cfg: ModelConfig, batch: int, precision="fp32", checkpointing="none") -> int:
    """The activations one training step keeps from its forward (MemTracker, real tensors)."""
    torch.manual_seed(0)
    model = models.build(cfg, 10)
    recipe.apply_checkpointing(model, checkpointing)
    optimizer = recipe.build_optimizer(OptimConfig(), model.parameters(), lr=0.01)
    inputs, targets = torch.randn(batch, *cfg.input_shape), torch.randint(0, 10, (batch,))

    def step():
        with recipe.autocast(CPU, precision):
            loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer state exists, as in every step after the first
    return memory.track_step(model, optimizer, step, CPU).forward_activations_bytes


def slope(cfg: ModelConfig, **recipe_axes) -> float:
    """Activation bytes per sample, from two micro-batches."""
    return (forward_activations(cfg, 16, **recipe_axes) - forward_activations(cfg, 8, **recipe_axes)) / 8


@pytest.fixture(scope="module")
def resnet_slopes():
    return {axes: slope(RESNET, precision=axes[0], checkpointing=axes[1])
            for axes in [("fp32", "none"), ("bf16", "none"), ("fp32", "blocks")]}


def test_bf16_autocast_keeps_about_half_the_activations_of_fp32(resnet_slopes):
    ratio = resnet_slopes[("bf16", "none")] / resnet_slopes[("fp32", "none")]
    assert 0.45 <= ratio <= 0.75, ratio


def test_checkpointing_resnet_blocks_keeps_at_least_40_percent_fewer_activations(resnet_slopes):
    assert resnet_slopes[("fp32", "blocks")] <= 0.6 * resnet_slopes[("fp32", "none")], resnet_slopes


def test_checkpointing_the_mlp_layers_saves_next_to_nothing():
    # Each Linear's input is the previous ReLU's output: one tensor per layer kept either way.
    plain, wrapped = slope(MLP), slope(MLP, checkpointing="blocks")
    assert wrapped >= 0.9 * plain, (plain, wrapped)


def test_checkpointing_costs_a_third_more_hardware_flops_on_resnet18():
    def build(mode):
        def made():
            model = models.build(RESNET, 10)
            recipe.apply_checkpointing(model, mode)
            return model
        return made

    plain = flops.count_flops(build("none"), Samples(tuple(RESNET.input_shape), 10))
    wrapped = flops.count_flops(build("blocks"), Samples(tuple(RESNET.input_shape), 10))
    assert wrapped.forward_per_sample == pytest.approx(plain.forward_per_sample)
    # One more forward of every checkpointed block in backward: ~4/3 when backward is ~2x forward.
    assert wrapped.train_per_sample / plain.train_per_sample == pytest.approx(1.33, abs=0.05)


@pytest.mark.parametrize("optim,state_per_parameter", [(OptimConfig(name="sgd"), 1), (OptimConfig(name="adamw"), 2)])
def test_optimizer_state_is_exact_for_a_model_of_known_size(optim, state_per_parameter):
    model = models.build(MLP, 10)
    n = sum(p.numel() for p in model.parameters())
    optimizer = recipe.build_optimizer(optim, model.parameters(), lr=0.01)
    inputs, targets = torch.randn(8, *MLP.input_shape), torch.randint(0, 10, (8,))

    def step():
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    m = memory.track_step(model, optimizer, step, CPU)
    assert m.parameters_bytes == 4 * n and m.gradients_bytes == 4 * n
    # SGD: one momentum buffer; AdamW: exp_avg and exp_avg_sq (its `step` counters are scalars).
    assert 4 * n * state_per_parameter <= m.optimizer_state_bytes <= 4 * n * state_per_parameter + 16 * 64


def test_the_fake_tensor_estimate_follows_the_recipe():
    def estimate(batch=16, **axes):
        return memory.estimate_step(lambda: models.build(RESNET, 10), models.samples(RESNET, 10), batch, **axes)

    def per_sample(**axes):
        return (estimate(32, **axes).forward_activations_bytes - estimate(16, **axes).forward_activations_bytes) / 16

    # Per sample: autocast's bf16 copies of the weights are a fixed cost, not the activations' slope.
    assert 0.45 <= per_sample(precision="bf16") / per_sample() <= 0.75
    fp32, adamw = estimate(), estimate(optim=OptimConfig(name="adamw"))
    assert adamw.optimizer_state_bytes == pytest.approx(2 * fp32.optimizer_state_bytes, rel=0.01)


SPEC = dict(model=MLP, data=DataConfig(name="digits"), train=TrainConfig(seed=1), lr=0.05, steps=8,
            measure=MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, flops=False))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_point_trains_in_mixed_precision_with_checkpointing_and_adamw(precision):
    spec = PointSpec(**SPEC, point=GridPoint(16, 2, 1, precision, "blocks"),
                     optim=OptimConfig(name="adamw", lr=0.001), loss=LossConfig(label_smoothing=0.1))
    result = train_point(spec, WorkerContext())
    assert len(result["train_loss"]) == 8 and all(loss == loss for loss in result["train_loss"])
    assert result["checkpointed_blocks"] == 4  # the MLP's four Linear+ReLU layers
    if precision == "fp16":
        assert result["grad_scaler_scale"] > 0 and result["grad_scaler_skipped_steps"] >= 0
    else:
        assert "grad_scaler_scale" not in result  # bf16 needs no loss scaling


class _InfGradient(torch.autograd.Function):
    """A finite loss whose gradient is infinite: what an fp16 overflow in backward looks like."""

    @staticmethod
    def forward(ctx, value):
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


def inf_gradient_at_step_2():
    """loss(logits, targets) with an infinite gradient in step 2's first micro-batch (its 5th call at
    2 micro-batches a step)."""
    calls = {"n": 0}

    def loss(logits, targets):
        calls["n"] += 1
        value = F.cross_entropy(logits, targets)
        return _InfGradient.apply(value) if calls["n"] == 5 else value

    return loss


def test_fp16_counts_the_step_its_grad_scaler_skipped_and_the_halved_scale():
    spec = PointSpec(**SPEC, point=GridPoint(16, 2, 1, "fp16"),
                     loss=LossConfig(_target_="tests.unit.test_recipe.inf_gradient_at_step_2"))
    result = train_point(spec, WorkerContext())
    assert result.status == "ok"  # an overflowing gradient is the scaler's business, not a divergence
    assert result["grad_scaler_skipped_steps"] == 1
    assert result["grad_scaler_scale"] == torch.amp.GradScaler("cpu").get_scale() / 2


def test_a_compiled_point_times_its_compilation_apart(monkeypatch):
    # Counted, not timed against the step: torch's own compile callbacks say when each compilation ran,
    # against the steps done and the timed windows open at that moment.
    from torch._dynamo.callback import callback_handler

    at = {"steps": 0, "window": False}
    compiles = []  # (steps done, a window open, started, ended) of each compilation
    clock = train_module.Clock

    def counted(name, change):
        real = getattr(clock, name)

        def wrapper(self, *args):
            change()
            return real(self, *args)
        monkeypatch.setattr(clock, name, wrapper)

    counted("after_step", lambda: at.update(steps=at["steps"] + 1))
    counted("open", lambda: at.update(window=True))
    counted("close", lambda: at.update(window=False))

    def start(args):
        compiles.append([at["steps"], at["window"], time.time(), None])

    def end(args):
        compiles[-1][3] = time.time()

    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)
    try:
        measure = MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, flops=False, memory_breakdown=False)
        spec = PointSpec(**{**SPEC, "train": TrainConfig(seed=1, compile=True), "measure": measure},
                         point=GridPoint(16, 1, 1))
        result = train_point(spec, WorkerContext())
    finally:
        callback_handler.remove_start_callback(start)
        callback_handler.remove_end_callback(end)
    assert compiles and not [c for c in compiles if c[1]], compiles  # none inside a timed window
    first_step = [c for c in compiles if c[0] == 0]
    assert first_step == compiles[:len(first_step)] and first_step, compiles  # the first step compiled
    # ... and its recorded time holds those compilations, from the first one's start to the last one's end.
    assert first_step[-1][3] - first_step[0][2] <= result["compile_step_seconds"]


def test_checkpointing_wraps_only_what_it_knows_and_what_the_user_names():
    resnet = models.build(RESNET, 10)
    assert recipe.wrappable(resnet) == ["BasicBlock"]
    assert recipe.apply_checkpointing(resnet, "blocks") == 8  # resnet18: 2 blocks x 4 stages
    assert recipe.apply_checkpointing(models.build(RESNET, 10), "none") == 0
    plain = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert recipe.wrappable(plain) == [] and recipe.apply_checkpointing(plain, "blocks", ["Linear"]) == 1


def test_a_checkpointed_points_hfu_and_mfu_count_the_recomputed_forward(cfg_of, monkeypatch):
    """HFU and MFU reach a point's record from the sweep's FLOP counts: with every MLP block
    checkpointed, the hardware runs each block's forward once more in the backward."""
    from sweeper.driver.preflight import count_flops
    from sweeper.worker.points import run_point
    from sweeper.worker.spec import GroupFacts

    cfg = cfg_of("model=mlp", "model.depth=4", "model.width=256", "model.input_shape=[1,16,16]",
                 "sweep.activation_checkpointing=[none,blocks]")
    counts = count_flops(cfg, 10)["blocks"]
    # Per sample, a multiply-add 2 FLOPs: the forward is 4 blocks x 2 x 256 x 256 = 524288 plus the head's
    # 2 x 256 x 10 = 5120, 529408; training, 3 x 529408 less the first layer's unneeded input gradient
    # (2 x 256 x 256 = 131072), 1457152; the hardware also runs the 4 blocks' forward again, 1981440.
    assert (counts.forward_per_sample, counts.train_per_sample, counts.hardware_per_sample) == (
        529408, 1457152, 1981440)
    # Each training forward (one a step of 16 samples) takes 1/64 s on the loop's clock: 1024 samples/s.
    forwards_take(monkeypatch, 2 ** -6, train_module, training_only=True)
    measure = MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, flops=True)
    spec = PointSpec(**{**SPEC, "measure": measure}, point=GridPoint(16, 1, 1, "fp32", "blocks"), flop_count=counts)
    result = run_point(spec, WorkerContext(), facts=GroupFacts(peaks={"fp32": flops.PeakFlops(1e10, "a test's")}))
    assert result["samples_per_second"] == 1024.0
    # Against the peak of 1e10 FLOP/s: MFU 1457152 x 1024 / 1e10 = 0.14921, HFU 1981440 x 1024 / 1e10 = 0.20290.
    assert result["mfu"] == pytest.approx(0.1492123648, rel=1e-12)
    assert result["hfu"] == pytest.approx(0.2028994560, rel=1e-12)
