"""What a point's recipe did, as its result's figures: fp16's loss scaling, checkpointing and compilation,
clipping (train.grad_clip_norm), the figures your step returned (train.step_fn), the items a loss counted and
their rate, a precision the device only emulates, and how its accumulation reduced and what a step sent
(`sync_figures`). Every rank computes the same (its collectives: every rank
calls them). Knows torch and measure.communication only.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from sweeper import recipe
from sweeper.measure import communication
from sweeper.schema import PointResult
from sweeper.worker import collectives as comm
from sweeper.worker.step import Training


def recipe_figures(result: PointResult, run: Training, first_step_time: Optional[float], loop_started: float) -> None:
    """Loss scaling, checkpointing, compilation, clipping and your step's figures."""
    figures = result.recipe
    figures.checkpointed_blocks = run.checkpointed_blocks if run.spec.point.checkpointing != "none" else None
    if run.scaler is not None and len(run.scales) > 1:
        # The scale before the first step, then after each: a skipped step halves it (a growth,
        # after 2000 clean steps, doubles it).
        scales = run.scale_values()
        figures.grad_scaler_scale = scales[-1]
        figures.grad_scaler_skipped_steps = sum(after < before for before, after in zip(scales, scales[1:]))
    if run.spec.train.compile and first_step_time is not None:
        figures.compile_step_seconds = first_step_time - loop_started
    done = run.steps_done
    if run.clipped is not None and done:  # the same on every rank: the norm is the whole gradient's
        clipped = int(run.clipped[:done].sum().item())
        figures.grad_clipped_steps, figures.grad_clipped_fraction = clipped, clipped / done
    figures.step_metrics = step_metrics(run)


def sync_figures(result: PointResult, run: Training) -> None:
    """How accumulation reduced, as the worker read it back from its model (for the point's param gradient_sync),
    and the collectives of one optimizer step (the last warm-up step's, the same on every rank) with the bytes
    each worker sent for them (measure.communication's ring arithmetic)."""
    result.gradient_sync = run.gradient_sync
    if run.collectives is None:
        return
    sent = communication.traffic(run.collectives, run.spec.point.num_workers)
    result.communication.communication_bytes_per_step = sent.bytes
    result.communication.communication_collectives_per_step = sent.collectives


def timed_steps(run: Training) -> range:
    """The steps a figure of the timed steps averages over: those after the warm-up (all of them in a run too
    short for any)."""
    first = min(run.spec.first_timed_step, run.steps_done)
    return range(first, run.steps_done) if first < run.steps_done else range(0, run.steps_done)


def step_metrics(run: Training) -> Optional[dict]:
    """Each figure train.step_fn returned, averaged over the timed steps' micro-batches and every rank (names
    gathered from every rank: one that only some returned counts as 0 on the others)."""
    names = sorted({n for names in comm.gather_objects(sorted(run.step_metrics), run.ctx) for n in names})
    steps = timed_steps(run)
    if not names or not len(steps):
        return None
    zeros = torch.zeros_like(run.step_losses)
    sums = torch.stack([run.step_metrics.get(n, zeros)[steps.start:steps.stop].sum() for n in names])
    comm.all_reduce(sums, run.ctx, dist.ReduceOp.SUM)
    count = len(steps) * run.spec.point.accumulation_steps * run.ctx.world_size
    return dict(zip(names, (sums / count).cpu().tolist()))


def items_figures(result: PointResult, run: Training) -> None:
    """A loss that counts items: every step's items (all ranks'), and the items per second of the timed steps
    (samples/s x their items per sample)."""
    if not run.counts_items or not run.steps_done:
        return
    steps = timed_steps(run)
    both = torch.stack([run.step_items[:run.steps_done].sum(), run.step_items[steps.start:steps.stop].sum()])
    comm.all_reduce(both, run.ctx, dist.ReduceOp.SUM)
    seen, timed = both.cpu().tolist()
    result.cost.items_seen = int(seen)
    rate = result.throughput.samples_per_second
    if rate is not None and len(steps):
        result.throughput.items_per_second = rate * timed / (len(steps) * run.spec.point.global_batch_size)


def emulation(result: PointResult, run: Training) -> None:
    """The point's precision, when this device only emulates it: its throughput is labelled, never the
    recipe's."""
    reason = recipe.emulated_precision(run.spec.point.precision, run.device.torch_device)
    if reason is not None:
        result.throughput.throughput_emulated = reason
