"""Whether a point's training diverged, decided where the device is synchronized anyway (the timed
windows' edges), never with a host sync per step, and agreed by every rank: a rank that sees NaN
alone must not leave the others waiting in a collective.

Reasons: `nonfinite` (the loss, or the gradient's norm, NaN or infinite), `spike` (several steps in a
row far above the running loss), `chance` (a final accuracy no better than guessing: see
`chance_reason`). Ray Tune has mishandled NaN metrics for years; the status is decided here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from sweeper.config import DivergenceConfig
from sweeper.worker import collectives as comm
from sweeper.worker.step import Training

NONFINITE, SPIKE, CHANCE = "nonfinite", "spike", "chance"
# Fewer steps than this say too little about learning for the chance rule: a few noisy losses of a
# point that has hardly started (a frontier probe, a test's toy point) are not a divergence.
CHANCE_MIN_STEPS = 20


@dataclass(frozen=True)
class Diverged:
    step: int  # the first optimizer step (0-based) that shows it
    reason: str  # nonfinite | spike | chance
    detail: str  # the numbers, in words


def check(run: Training, cfg: DivergenceConfig) -> Optional[Diverged]:
    """Divergence in the steps done so far, the same on every rank (call it on every rank, at a point
    where all are: the window edges)."""
    done = run.steps_done
    if not cfg.check or done == 0:
        return None
    losses = run.step_losses[:done]
    bad = ~torch.isfinite(losses)
    # Under fp16 a non-finite gradient is the GradScaler's business (it skips the step and lowers
    # the scale); only the loss says the run itself went wrong.
    if run.grad_norms is not None and run.scaler is None:
        bad |= ~torch.isfinite(run.grad_norms[:done])
    first = torch.where(bad.any(), bad.to(torch.int64).argmax(), torch.tensor(done, device=bad.device))
    first = first.to(torch.int64).reshape(1)
    comm.all_reduce(first, run.ctx, dist.ReduceOp.MIN)
    if int(first.item()) < done:
        step = int(first.item())
        return Diverged(step, NONFINITE, f"the loss or the gradient's norm was not finite at step {step}")
    return find_spike(global_losses(run), cfg)


def global_losses(run: Training) -> List[float]:
    """The global batch's loss at each step done so far: every worker's micro-batches averaged."""
    losses = run.step_losses[: run.steps_done].clone() / run.spec.point.accumulation_steps
    comm.all_reduce(losses, run.ctx, dist.ReduceOp.SUM)
    return (losses / run.ctx.world_size).cpu().tolist()


def find_spike(losses: Sequence[float], cfg: DivergenceConfig) -> Optional[Diverged]:
    """The first run of `spike_steps` consecutive losses each above `spike_factor` x the mean of the
    `spike_window` losses before the run began (llm-foundry's rule: a loss >= 2x the running mean,
    several times in a row, ends the run) and above the untrained model's loss (the first step's).
    The second condition is for small batches: once a classifier's mean loss is small, a few hard
    micro-batches in a row exceed twice it while the run is fine; a diverging run climbs past where
    it started."""
    window, run_length = cfg.spike_window, cfg.spike_steps
    start_loss = losses[0] if losses else math.inf
    for start in range(window, len(losses) - run_length + 1):
        mean = sum(losses[start - window:start]) / window
        bar = max(cfg.spike_factor * mean, start_loss)
        if mean > 0 and all(losses[start + i] > bar for i in range(run_length)):
            return Diverged(start, SPIKE, (
                f"{run_length} steps from step {start} had losses over {cfg.spike_factor:g}x the mean of the "
                f"{window} before ({mean:.4g}) and over the untrained loss ({start_loss:.4g})"
            ))
    return None


def chance_reason(accuracy: float, num_classes: int, losses: Sequence[float], cfg: DivergenceConfig) -> Optional[str]:
    """Why a point learned nothing: a final accuracy within `chance_margin` of guessing AND a training
    loss that did not come down (its last quarter no lower than its first). A short point that is
    still learning is near chance too, but its loss falls; one stuck at chance has a flat or rising
    loss (an LR too high, say)."""
    chance = 1.0 / num_classes
    if len(losses) < CHANCE_MIN_STEPS:
        return None
    if not (cfg.check and math.isfinite(accuracy) and accuracy <= chance + cfg.chance_margin):
        return None
    quarter = max(1, len(losses) // 4)
    first, last = losses[:quarter], losses[-quarter:]
    if not first or sum(last) / len(last) < sum(first) / len(first):
        return None
    return (f"its validation accuracy {accuracy:.3f} is within {cfg.chance_margin:g} of chance (1/{num_classes} = "
            f"{chance:.3f}) and its training loss did not come down")
