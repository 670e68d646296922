"""The gradient noise scale: the estimators on gradients of known mean and covariance, the known answer
on a real model (frozen weights, exact per-sample gradients), the same estimate whatever the layout of
the same micro-batches, and k-diffusion's formula fed the same norms."""

import os
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from sweeper.config import DataConfig, GnsConfig, MeasureConfig, ModelConfig, OptimConfig
from sweeper.plan import GridPoint
from sweeper.worker.gns import Estimate, ema_ratio, estimate, squared_norm, total_norm
from sweeper.worker.points import run_point
from sweeper.worker.spec import WorkerContext
from sweeper.workloads import datasets as data_mod
from sweeper.workloads import models
from tests.harness import free_port
from tests.helpers import point_spec

MLP = ModelConfig(name="mlp", depth=2, width=32, input_shape=[1, 8, 8])
DIGITS = DataConfig(name="digits")
MEASURE = MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, flops=False, memory_breakdown=False)


def draws(rng, mean, scale, b, k, steps):
    """`steps` optimizer steps of k micro-batches of b samples, per-sample gradients ~ N(mean, diag(scale^2))."""
    samples = mean + rng.standard_normal((steps, k, b, mean.size)) * scale
    micro = samples.mean(axis=2)  # (steps, k, d)
    small = (micro**2).sum(axis=2).mean(axis=1)  # mean squared norm of the micro-gradients
    big = (micro.mean(axis=1) ** 2).sum(axis=1)  # squared norm of their mean
    return small, big


def test_the_estimators_recover_the_gradient_norm_and_the_covariance_trace():
    rng = np.random.default_rng(0)
    mean, scale = rng.standard_normal(10), rng.uniform(0.5, 2.0, 10)
    b, k = 4, 8
    small, big = draws(rng, mean, scale, b, k, 100_000)
    found = [estimate(s, g, b, b * k) for s, g in zip(small, big)]
    assert np.mean([e.grad_sq_norm for e in found]) == pytest.approx(float(mean @ mean), rel=0.01)
    assert np.mean([e.trace_sigma for e in found]) == pytest.approx(float((scale**2).sum()), rel=0.01)


def test_sampling_without_replacement_is_corrected():
    # N=200 samples; each step draws K=8 micro-batches of b=10 without replacement (as the sampler does).
    rng = np.random.default_rng(1)
    n, b, k, d = 200, 10, 8, 5
    population = rng.standard_normal((n, d)) * rng.uniform(0.5, 2, d) + rng.standard_normal(d)
    true_trace = population.var(axis=0).sum()  # the population's covariance, ddof 0
    true_g2 = float(population.mean(axis=0) @ population.mean(axis=0))
    raw, corrected = [], []
    for _ in range(40_000):
        chosen = population[rng.permutation(n)[: b * k]].reshape(k, b, d).mean(axis=1)
        small, big = (chosen**2).sum(axis=1).mean(), (chosen.mean(axis=0) ** 2).sum()
        raw.append(estimate(small, big, b, b * k))
        corrected.append(estimate(small, big, b, b * k, n))
    assert np.mean([e.trace_sigma for e in raw]) / true_trace == pytest.approx(n / (n - 1), rel=0.01)
    assert np.mean([e.trace_sigma for e in corrected]) == pytest.approx(true_trace, rel=0.01)
    assert np.mean([e.grad_sq_norm for e in corrected]) == pytest.approx(true_g2, rel=0.01)


def test_the_squared_norms_match_torchs_norm_in_every_layout_and_dtype():
    torch.manual_seed(0)
    dense = torch.randn(64, 3, 7, 7, dtype=torch.float64)
    for t in (dense.float(), dense, dense.float().to(memory_format=torch.channels_last), dense[:, 0].mT,
              dense.bfloat16()):
        expected = torch.linalg.vector_norm(t.double()) ** 2
        assert float(squared_norm(t)) == pytest.approx(float(expected), rel=1e-5 if t.dtype != torch.bfloat16 else 1e-2)
    parts = [torch.randn(10), torch.randn(3, 4), torch.randn(5, 2).t()]
    assert float(total_norm(parts)) == pytest.approx(float(torch.nn.utils.get_total_norm(parts)), rel=1e-6)
    parts[1][0, 0] = float("inf")
    assert not torch.isfinite(total_norm(parts))  # a divergence check reads it


def test_the_moving_ratio_is_k_diffusions_gradient_noise_scale():
    # k-diffusion k_diffusion/gns.py GradientNoiseScale.update (crowsonkb, MIT): the same two unbiased
    # estimates, EMAs of each, gradient_noise_scale = max(ema_var, eps) / max(ema_sq_norm, eps);
    # re-derived here from its source, fed the same norms.
    rng = np.random.default_rng(2)
    small = rng.uniform(2.0, 3.0, 50)
    big = small * rng.uniform(0.3, 0.6, 50)
    beta, eps, b, big_b = 0.9, 1e-8, 16, 64
    ema_sq, ema_var, theirs = 0.0, 0.0, []
    for s, g in zip(small, big):
        est_sq = (big_b * g - b * s) / (big_b - b)
        est_var = (s - g) / (1 / b - 1 / big_b)
        ema_sq, ema_var = beta * ema_sq + (1 - beta) * est_sq, beta * ema_var + (1 - beta) * est_var
        theirs.append(max(ema_var, eps) / max(ema_sq, eps))
    ours = ema_ratio([estimate(s, g, b, big_b) for s, g in zip(small, big)], beta)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


spec = partial(point_spec, model=MLP, data=DIGITS, seed=4, measure=MEASURE, lr=0.1, optim=OptimConfig(momentum=0.0),
               gns=GnsConfig(ema_beta=0.9))


def true_noise_scale() -> float:
    """tr(Sigma) / |G|^2 of the MLP's initial weights over the whole training set, from every sample's
    own gradient (torch.func)."""
    splits = data_mod.load(DIGITS, MLP.input_shape)
    torch.manual_seed(4)
    model = models.build(MLP, splits.num_classes)
    params = {k: v.detach() for k, v in model.named_parameters()}
    inputs = torch.stack([splits.train[i][0] for i in range(len(splits.train))])
    targets = torch.tensor([int(splits.train[i][1]) for i in range(len(splits.train))])

    def loss(p, x, y):
        return F.cross_entropy(torch.func.functional_call(model, p, (x[None],)), y[None])

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, inputs, targets)
    flat = torch.cat([g.reshape(len(inputs), -1) for g in grads.values()], dim=1).double()
    mean = flat.mean(dim=0)
    return float(((flat - mean) ** 2).sum(dim=1).mean() / (mean @ mean))


def test_the_estimate_on_frozen_weights_matches_the_exact_per_sample_answer():
    # lr=0: the weights never move, so every step samples the same gradient distribution.
    result = run_point(spec(GridPoint(10, 8, 1), steps=220, lr=0.0), WorkerContext())
    # frozen weights learn nothing (an accuracy not separated from a guess); measured all the same
    assert result.status in ("ok", "did_not_learn"), result.error
    trace = np.array(result["gns_trace_sigma_per_step"])
    g2 = np.array(result["gns_grad_sq_norm_per_step"])
    ratio = trace.mean() / g2.mean()
    # The ratio of means' standard error by the delta method, from the per-step spread.
    se = ratio * np.sqrt((trace.std(ddof=1) / trace.mean()) ** 2 / len(trace) + (g2.std(ddof=1) / g2.mean()) ** 2
                         / len(g2))
    truth = true_noise_scale()
    assert abs(ratio - truth) <= 3 * se and ratio == pytest.approx(truth, rel=0.05), (ratio, truth, se)
    assert result["gns_b_simple_train_avg"] == pytest.approx(ratio)
    n = len(data_mod.load(DIGITS, MLP.input_shape).train)
    assert (result["gns_small_batch"], result["gns_big_batch"], result["gns_train_samples"]) == (10, 80, n)


def _gloo(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = run_point(spec(GridPoint(16, 2, 2), steps=12), WorkerContext(rank=rank, world_size=2))
        out[rank] = (result["gns_trace_sigma_per_step"], result["gns_grad_sq_norm_per_step"])
    finally:
        dist.destroy_process_group()


def test_the_same_micro_batches_in_another_layout_give_the_same_estimate():
    single = run_point(spec(GridPoint(16, 4, 1), steps=12), WorkerContext())
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gloo, args=(free_port(), out), nprocs=2)
        trace, g2 = out[0]
    np.testing.assert_allclose(trace, single["gns_trace_sigma_per_step"], rtol=1e-5)
    np.testing.assert_allclose(g2, single["gns_grad_sq_norm_per_step"], rtol=1e-5)


def test_measuring_one_step_in_two_gives_every_other_steps_estimates_and_the_same_training():
    every = run_point(spec(GridPoint(16, 2, 1), steps=9), WorkerContext())
    half = replace(spec(GridPoint(16, 2, 1), steps=9), gns=GnsConfig(ema_beta=0.9, every_steps=2))
    other = run_point(half, WorkerContext())
    assert other["gns_every_steps"] == 2 and every["gns_every_steps"] == 1
    for series in ("gns_trace_sigma_per_step", "gns_grad_sq_norm_per_step"):
        assert len(other[series]) == 5  # steps 0, 2, 4, 6, 8
        np.testing.assert_allclose(other[series], every[series][::2], rtol=1e-9)
    # the hooks only read: the same losses either way
    np.testing.assert_allclose(other["train_loss"], every["train_loss"], rtol=0)
    # the moving averages decay per optimizer step: 0.9 a step is 0.81 a measurement
    measured = [Estimate(g, t) for t, g in zip(other["gns_trace_sigma_per_step"], other["gns_grad_sq_norm_per_step"])]
    assert other["gns_b_simple"] == pytest.approx(ema_ratio(measured, 0.81)[-1])


def test_one_micro_batch_a_step_has_no_estimate_and_says_why():
    result = run_point(spec(GridPoint(16, 1, 1), steps=6), WorkerContext())
    assert "gns_b_simple" not in result and "one micro-batch per step" in result["gns_note"]
    assert isinstance(estimate(2.0, 1.0, 4, 8), Estimate)
