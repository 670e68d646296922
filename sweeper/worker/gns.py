"""The gradient noise scale of a point, measured during its own steps almost for free (McCandlish,
Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training", appendix A.1).

Every optimizer step already holds K = accumulation x workers micro-batch gradients and their mean:
the squared norms of the micro-gradients (the small batch b, taken by a hook on each parameter before
accumulation and before DDP's all-reduce, as fairscale's AdaScale does) and of their mean (the big
batch B = b x K: the step's gradient) give unbiased estimates of |G|^2 and tr(Sigma), and
B_simple = tr(Sigma) / |G|^2 is their ratio of moving averages (as k-diffusion's and gpt-neox's
estimators do). Sampling without replacement from N training samples biases both; they are corrected.
BatchNorm couples the samples of a micro-batch, so its per-sample gradients are not independent: read
B_simple of a BatchNorm model as indicative. One reduction per parameter per micro-step, no gradient
copy, one all-reduce per point; no host sync until the point ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from sweeper.worker import collectives as comm
from sweeper.worker.spec import WorkerContext


@dataclass(frozen=True)
class Estimate:
    """One step's unbiased estimates: the true gradient's squared norm and the per-sample covariance's
    trace (both corrected for sampling without replacement)."""

    grad_sq_norm: float
    trace_sigma: float


def estimate(small_sq: float, big_sq: float, b: int, big_b: int, n: Optional[int] = None) -> Estimate:
    """From |G_b|^2 (the mean squared norm of the gradients of batches of b) and |G_B|^2 (the squared
    norm of their mean, a batch of B): A.1's |G|^2 = (B |G_B|^2 - b |G_b|^2) / (B - b) and
    S = (|G_b|^2 - |G_B|^2) / (1/b - 1/B). Drawn without replacement from `n` samples, E[S] is
    tr(Sigma) n/(n-1) and E[|G|^2] falls short by tr(Sigma)/(n-1): tr(Sigma) = S (n-1)/n and
    |G|^2 = estimate + S/n."""
    g2 = (big_b * big_sq - b * small_sq) / (big_b - b)
    s = (small_sq - big_sq) / (1.0 / b - 1.0 / big_b)
    if n:
        return Estimate(g2 + s / n, s * (n - 1) / n)
    return Estimate(g2, s)


def ema_ratio(estimates: Sequence[Estimate], beta: float) -> List[float]:
    """B_simple after each step: the ratio of bias-corrected exponential moving averages of tr(Sigma)
    and |G|^2 (a ratio of averages, not an average of ratios: each step's |G|^2 is noisy and may be
    near zero or negative)."""
    out, trace, g2 = [], 0.0, 0.0
    for t, e in enumerate(estimates, start=1):
        trace = beta * trace + (1 - beta) * e.trace_sigma
        g2 = beta * g2 + (1 - beta) * e.grad_sq_norm
        correction = 1 - beta**t
        # |G|^2 is a square: an average at or below zero is noise swamping it (no estimate yet), as
        # k-diffusion's clamp treats it; a negative ratio would read as a batch size.
        out.append((trace / correction) / (g2 / correction) if g2 > 0 else math.nan)
    return out


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    """|t|^2 as a 0-d tensor on t's device, with no tensor-sized temporary: a BLAS dot of a dense
    float tensor with itself (on CPU ~1.6x faster than vector_norm's generic reduction, for the same
    single read), else the norm squared."""
    if tensor.dtype in (torch.float32, torch.float64) and tensor.is_contiguous():
        flat = tensor.view(-1)
        return torch.dot(flat, flat)
    return torch.linalg.vector_norm(tensor, dtype=torch.promote_types(tensor.dtype, torch.float32)) ** 2


def total_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The norm of all `tensors` as one vector (torch.nn.utils.get_total_norm's 2-norm), from
    squared_norm: not finite when any element is not."""
    return torch.stack([squared_norm(t).double() for t in tensors]).sum().sqrt()


class MicroGradients:
    """The squared norms of a point's micro-batch gradients, summed per step on this rank, kept on the
    device by a hook on every trainable parameter."""

    def __init__(self, model: nn.Module, steps: int, accumulation_steps: int, device: torch.device,
                 every_steps: int = 1):
        self.sums = torch.zeros(steps, dtype=torch.float64, device=device)
        self.every_steps = every_steps
        self.step = 0
        # The loss is divided by the accumulation steps: a micro-gradient seen here is g / accumulation.
        self.factor = float(accumulation_steps) ** 2
        self.pending: List[torch.Tensor] = []  # this micro-step's per-parameter norms, not yet summed
        self.handles = [p.register_hook(self._hook) for p in model.parameters() if p.requires_grad]

    def _hook(self, grad: torch.Tensor) -> None:
        # A reduction: no gradient-sized temporary, which the memory figures would count. One op per
        # parameter here; flush() sums them in a few ops per micro-step (summing each into the
        # step's total here cost ~5 % of a ResNet-18 step on CPU).
        if self.step % self.every_steps == 0:  # gns.every_steps: only the measured steps are read
            self.pending.append(squared_norm(grad.detach()))

    def measured(self, steps_done: int) -> List[int]:
        """The steps whose micro-gradients were read."""
        return list(range(0, steps_done, self.every_steps))

    def flush(self, weight: Optional[torch.Tensor] = None) -> None:
        """After a micro-step's backward: its squared gradient norm added to the step's sum (times `weight`:
        a loss that counts items makes its micro-gradient a mean over its own items)."""
        if self.pending:
            squares = torch.stack(self.pending).double().sum() * self.factor
            self.sums[self.step] += squares if weight is None else squares * weight
            self.pending.clear()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def mean_sq(self, ctx: WorkerContext, micro_grads_per_step: int, steps_done: int,
                scales: Optional[Sequence[float]] = None) -> List[float]:
        """Each step's |G_b|^2 over every rank's micro-gradients (one all-reduce), fp16's loss scale
        undone (`scales`: the scale each step's backward ran with)."""
        sums = self.sums[:steps_done].clone()
        comm.all_reduce(sums, ctx, dist.ReduceOp.SUM)
        values = (sums / micro_grads_per_step).cpu().tolist()
        if scales:
            values = [v / scale**2 for v, scale in zip(values, scales)]
        return values
