"""A trained point's validation accuracy: BatchNorm statistics re-estimated, then the held-out split
scored across ranks."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset

from sweeper.worker.collectives import all_reduce
from sweeper.worker.sharding import is_sharded
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads.samples import cross_entropy

EVAL_BATCH_SIZE = 256


def recalibrate_batchnorm(
    model: nn.Module, dataset, micro_batch_size: int, samples: int, seed: int, device: torch.device
) -> int:
    """Re-estimate the BatchNorm running statistics of the trained weights, as a cumulative average
    (torch.optim.swa_utils.update_bn) over `samples` seeded training samples in micro-batches, the
    groups the layers normalized over in training. Every rank does the same, so they agree. Returns
    the samples used: whole micro-batches, at least one even when `samples` is smaller; 0 for a
    model without BatchNorm or `samples` 0.

    Why: running statistics are an exponential average updated once per micro-batch forward, and DDP
    keeps rank 0's. Layouts with the same global batch take different numbers of updates (two per step
    with accumulation 2 on one worker, one kept with two workers), and in a short sweep the initial
    mean 0 / variance 1 still weighs in: validation would measure the update count, not the weights.
    """
    if samples <= 0 or not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return 0
    # A cumulative average weighs every batch alike, so all are full micro-batches (the split's
    # size caps a single one only when it holds less than one micro-batch).
    batches = max(1, min(samples, len(dataset)) // micro_batch_size)
    used = min(batches * micro_batch_size, len(dataset))
    if isinstance(dataset, IterableDataset):  # a stream has no random access: its first samples, in shard order
        chosen = list(itertools.islice(iter(dataset), used))
    else:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:used].tolist()
        chosen = Subset(dataset, order)
    loader = DataLoader(chosen, batch_size=micro_batch_size)
    torch.optim.swa_utils.update_bn(loader, model, device=device)
    return used


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device: torch.device, ctx: WorkerContext) -> Tuple[float, float, float, int]:
    """(accuracy, mean cross-entropy, the mean's standard error, predictions) over the whole held-out
    split: each rank scores a disjoint share, nothing counted twice (a sharded model's ranks pad to equal
    batch counts: `_batches`). A classifier predicts once per sample; a
    language model once per token, so its accuracy is next-token accuracy and its loss nats per token.
    The standard error is the spread of the per-sample losses (a sequence's mean over its tokens, which
    are not independent of each other) over sqrt(samples): the noise of the validation set, which
    successive halving compares against."""
    model.eval()
    share = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    # correct, loss, squared per-sample loss, samples, predictions
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    for (inputs, targets), scored in _batches(dataset, share, ctx, is_sharded(model)):
        logits = model(inputs.to(device)).float()
        if not scored:
            continue
        targets = targets.to(device)
        losses = cross_entropy(logits, targets, reduction="none").double()
        per_sample = losses.reshape(len(targets), -1).mean(dim=1)
        sums[0] += (logits.argmax(dim=-1) == targets).sum()
        sums[1] += losses.sum()
        sums[2] += (per_sample * per_sample).sum()
        sums[3] += len(targets)
        sums[4] += targets.numel()
    all_reduce(sums, ctx, dist.ReduceOp.SUM)
    model.train()
    correct, loss, squares, samples, predictions = sums.cpu().tolist()
    mean = loss / predictions  # every sample has as many predictions: also the per-sample losses' mean
    variance = max(squares / samples - mean * mean, 0.0) * samples / max(samples - 1, 1)
    return correct / predictions, mean, math.sqrt(variance / samples), int(predictions)


def _batches(dataset, share, ctx: WorkerContext, sharded: bool):
    """(batch, scored) of this rank's share; under sharding (where every forward is a collective: FSDP2
    gathers each block's weights from every rank) padded up to the largest share's number of batches with
    a batch of the split's first sample whose scores are dropped, so every rank runs as many forwards."""
    yield from ((batch, True) for batch in DataLoader(share, batch_size=EVAL_BATCH_SIZE))
    if not sharded or not len(dataset):
        return
    largest = math.ceil(math.ceil(len(dataset) / ctx.world_size) / EVAL_BATCH_SIZE)  # rank 0's share
    padding = next(iter(DataLoader(Subset(dataset, [0]), batch_size=1)))
    for _ in range(largest - math.ceil(len(share) / EVAL_BATCH_SIZE)):
        yield padding, False


@dataclass
class Progress:
    """A point's evaluations: during training every `every_steps` optimizer steps (eval.every_samples
    rounded up to whole global batches, as MLPerf does) and once at the end; the accuracy curve
    against samples seen, and when the target was first reached, on a clock that counts the
    evaluations themselves (time to target) while the throughput windows leave them out."""

    every_steps: Optional[int]
    samples_per_step: int
    target_accuracy: Optional[float] = None
    target_loss: Optional[float] = None
    stop_at_target: bool = False
    # (samples seen, accuracy, loss, then the clock at that evaluation: seconds since the point's training
    # started, the instrumented steps' seconds and count so far, and the seconds spent evaluating so far,
    # this one included; a checkpoint's older entries may lack the clock)
    curve: List[Tuple[Any, ...]] = field(default_factory=list)
    # A continued run's clock goes on from the last carried evaluation's (the run before may have
    # evaluated after its state was captured), with its instrumented steps.
    clock_start: float = 0.0
    carried_instrumented: Tuple[float, int] = (0.0, 0)
    # (optimizer steps, seconds since training started, of which evaluating, instrumented seconds and
    # steps until then)
    reached: Optional[Tuple[int, float, float, float, int]] = None
    seconds: float = 0.0  # spent evaluating
    # Steps that ran instrumented (the memory-tracked step, profiled steps) and their seconds: a real
    # training run does not pay for them, so the time to target takes out their excess over a step.
    instrumented_seconds: float = 0.0
    instrumented_steps: int = 0
    loss_se: Optional[float] = None  # the latest evaluation's loss standard error
    recalibrated: int = 0  # samples BatchNorm's statistics were last re-estimated over
    predictions: int = 0  # the latest evaluation's: samples, or tokens for a language model
    # A run continued from a training state (a checkpoint, a schedule's previous span): the samples, steps
    # and training seconds before it, so the curve, the cadence and the time to target count from the
    # point's start.
    start_samples: int = 0
    start_steps: int = 0
    start_seconds: float = 0.0
    # The target's figures (steps_to_target, samples_to_target, time_to_target_seconds,
    # eval_seconds_to_target) when it was reached before this run, in the checkpoint it continues.
    reached_before: Optional[Dict[str, float]] = None
    carried: bool = False  # whether `carry` took a checkpoint's evaluations in

    @classmethod
    def of(cls, spec: PointSpec) -> "Progress":
        g, every = spec.point.global_batch_size, spec.eval.every_samples
        return cls(math.ceil(every / g) if every else None, g, spec.eval.target_accuracy, spec.eval.target_loss,
                   spec.eval.stop_at_target)

    def carry(self, history: Any) -> None:
        """Go on from a checkpoint's evaluations (worker.state.History): its curve and seconds first, and
        its target's figures if it was reached before."""
        self.curve = [tuple(e) for e in history.evaluations] + self.curve
        self.seconds += history.eval_seconds
        clocked = [e for e in self.curve if len(e) >= 7]
        if clocked:
            self.clock_start, self.carried_instrumented = clocked[-1][3], (clocked[-1][4], clocked[-1][5])
        self.reached_before = history.target if list(history.target_of or []) == self.target_of else None
        self.carried = True

    @property
    def target_of(self) -> List[Optional[float]]:
        """What the target is (accuracy, loss): a checkpoint's figures count only for the same target."""
        return [self.target_accuracy, self.target_loss]

    @property
    def has_target(self) -> bool:
        return self.target_accuracy is not None or self.target_loss is not None

    def due(self, steps_done: int) -> bool:
        """Whether this step crossed a multiple of every_steps x the global batch, in samples since the
        point's start (at the start: every `every_steps` steps)."""
        if not self.every_steps:
            return False
        every = self.every_steps * self.samples_per_step
        now = self.start_samples + steps_done * self.samples_per_step
        return now // every > (now - self.samples_per_step) // every

    @property
    def stop(self) -> bool:
        return self.stop_at_target and self.reached is not None

    def evaluate(self, model: nn.Module, train_set, val_set, micro_batch_size: int, bn_samples: int, seed: int,
                 device: torch.device, ctx: WorkerContext, steps_done: int, since: float) -> float:
        """One evaluation after `steps_done` steps (BatchNorm re-estimated first); returns the seconds
        it took, for the throughput windows to leave out. `since`: the time training started."""
        began = time.perf_counter()
        self.recalibrated = recalibrate_batchnorm(model, train_set, micro_batch_size, bn_samples, seed, device)
        accuracy, loss, self.loss_se, self.predictions = evaluate(model, val_set, device, ctx)
        self.curve.append((self.start_samples + steps_done * self.samples_per_step, accuracy, loss))
        hit = (self.target_accuracy is not None and accuracy >= self.target_accuracy) or (
            self.target_loss is not None and loss <= self.target_loss)
        spent = time.perf_counter() - began
        self.seconds += spent
        elapsed = max(self.start_seconds, self.clock_start) + time.time() - since
        seconds, steps = self.carried_instrumented
        self.curve[-1] += (elapsed, seconds + self.instrumented_seconds, steps + self.instrumented_steps, self.seconds)
        if hit and self.reached is None:
            self.reached = (self.start_steps + steps_done, self.start_seconds + time.time() - since, self.seconds,
                            self.instrumented_seconds, self.instrumented_steps)
        return spent

    @property
    def evaluated_at(self) -> Optional[int]:
        """Samples seen at the latest evaluation."""
        return self.curve[-1][0] if self.curve else None
