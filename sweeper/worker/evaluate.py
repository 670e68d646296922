"""A trained point's evaluation: BatchNorm statistics re-estimated, then the held-out split (eval.max_samples
of it) scored across ranks in the point's precision, eval.batch_size samples per forward, with the user's
metrics (eval.metrics_fn); an evaluation that runs out of memory is its result, not the point's failure.
The evaluations during training and the time to a target (Progress)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset

from sweeper import errors, recipe
from sweeper.config import EvalConfig
from sweeper.worker import metrics, scoring
from sweeper.worker.collectives import all_reduce
from sweeper.worker.sharding import is_sharded
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.workloads import batches

EVAL_BATCH_SIZE = EvalConfig().batch_size  # its one home is the config's default
# eval.max_samples' subset is drawn with this seed, not the point's: every seed of every point is scored
# on the same samples.
SUBSET_SEED = 0


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
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:used].tolist()
    loader = DataLoader(Subset(dataset, order), batch_size=micro_batch_size)
    torch.optim.swa_utils.update_bn(loader, model, device=device)
    return used


@dataclass
class Settings:
    """How a point evaluates (eval.batch_size, eval.max_samples, eval.metrics_fn, its precision and its
    data's collate_fn), resolved for the point."""

    batch_size: Optional[int] = None  # None: EVAL_BATCH_SIZE
    max_samples: Optional[int] = None
    precision: str = "fp32"
    collate_fn: Optional[Callable] = None
    metrics_fn: Optional[str] = None
    chunk_bytes: int = scoring.CHUNK_BYTES

    @classmethod
    def of(cls, spec: PointSpec) -> "Settings":
        batch = spec.eval.batch_size or spec.point.micro_batch_size
        return cls(batch, spec.eval.max_samples, spec.point.precision, batches.collate_of(spec.data.collate_fn),
                   spec.eval.metrics_fn)

    @property
    def size(self) -> int:
        return self.batch_size or EVAL_BATCH_SIZE


class Evaluation(NamedTuple):
    """One evaluation's figures (indexable as the (accuracy, loss, loss_se, predictions) it once was);
    `error` when it ran out of memory on any rank, the figures then None."""

    accuracy: Optional[float]
    loss: Optional[float]
    loss_se: Optional[float]
    predictions: int
    samples: int = 0
    metrics: Dict[str, Tuple[float, Optional[float]]] = {}
    error: Optional[str] = None


def validation_subset(dataset, max_samples: Optional[int]):
    """eval.max_samples of the split, drawn by a seed fixed for the sweep (every point and seed is scored on
    the same samples, which the paired rule needs), in the split's order; the whole split when it is null
    or holds no more."""
    if max_samples is None or max_samples >= len(dataset):
        return dataset
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(SUBSET_SEED))[:max_samples]
    return Subset(dataset, sorted(order.tolist()))


@torch.no_grad()
def evaluate(model: nn.Module, dataset, device: torch.device, ctx: WorkerContext,
             settings: Optional[Settings] = None) -> Evaluation:
    """Accuracy, mean cross-entropy, the mean's standard error and the predictions over the held-out split
    (eval.max_samples of it), in the point's precision (autocast, as it trained; the sums in float64): each
    rank scores a disjoint share, nothing counted twice (a sharded model's ranks pad to equal batch counts:
    `_batches`). A classifier predicts once per sample; a language model once per token, so its accuracy is
    next-token accuracy and its loss nats per token, computed in chunks of rows (worker.scoring). The
    standard error is the spread of the per-sample losses (a sequence's mean over its tokens, which are not
    independent of each other) over sqrt(samples): the noise of the validation set. With eval.metrics_fn,
    its metrics over the whole split (worker.metrics).

    Out of memory on any rank: every rank returns the `error` and no figures (the point keeps what it
    measured). A sharded model's ranks agree after every batch, since each forward waits for every rank's
    share of the weights (a sharded rank that runs out alone in the middle of a forward leaves the others
    waiting inside it: not handled)."""
    settings = settings or Settings()
    dataset = validation_subset(dataset, settings.max_samples)
    model.eval()
    share = Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))
    sums, failed = scoring.new_sums(device), None
    counts = metrics.Counts(metrics.make(settings.metrics_fn)) if settings.metrics_fn else None
    sharded = is_sharded(model)
    for batch, scored in _batches(dataset, share, ctx, sharded, settings):
        try:
            _score(model, batches.to_device(batch, device), scored, sums, counts, settings)
        except Exception as exc:  # noqa: BLE001 - out of memory is this evaluation's result; anything else raises
            if not errors.is_oom(exc):
                raise
            failed = errors.failure(exc)[1]
        # A sharded forward is a collective: its ranks stop together, after the same batch.
        if (_anyone(failed, ctx, device) if sharded else failed is not None):
            break
    if failed is not None and device.type == "cuda":
        torch.cuda.empty_cache()  # what the failed batch left cached goes back before training goes on
    model.train()
    if _anyone(failed, ctx, device):
        why = failed or "another rank ran out of memory"
        return Evaluation(None, None, None, 0, error=f"out of memory evaluating at eval.batch_size={settings.size} "
                                                      f"({why}): lower eval.batch_size")
    all_reduce(sums, ctx, dist.ReduceOp.SUM)
    accuracy, loss, se, predictions, samples = scoring.summary(sums)
    return Evaluation(accuracy, loss, se, predictions, samples, counts.finish(ctx) if counts is not None else {})


def _anyone(failed: Optional[str], ctx: WorkerContext, device: torch.device) -> bool:
    """Whether any rank failed (a collective: every rank calls it)."""
    flag = torch.tensor([float(failed is not None)], dtype=torch.float64, device=device)
    all_reduce(flag, ctx, dist.ReduceOp.SUM)
    return bool(flag.item())


def _score(model: nn.Module, batch, scored: bool, sums: torch.Tensor, counts: Optional["metrics.Counts"],
           settings: Settings) -> None:
    """One batch's forward under the point's precision, and its scores when `scored`."""
    labelled = isinstance(batch, Mapping)
    with recipe.autocast(sums.device, settings.precision):
        outputs = model(**batch) if labelled else model(batch[0])
    if not scored:
        return
    targets = batch.get("labels") if labelled else batch[1]
    logits = outputs if isinstance(outputs, torch.Tensor) else getattr(outputs, "logits", None)
    # Scored against targets that line up with the logits (a class per sample, or a token per position);
    # a model that shifts its labels itself (a Hugging Face causal LM fed a dict) leaves this to its metrics.
    if logits is not None and targets is not None and logits.shape[:-1] == targets.shape:
        scoring.add(sums, logits, targets, settings.chunk_bytes)
    if counts is not None:
        counts.add(outputs, batch, _samples(batch))
    del outputs, logits


def _samples(batch) -> int:
    count = batches.sample_count(batch)
    if count is None:
        raise ValueError("a validation batch holds no tensor to count its samples by: give data.samples_fn")
    return count


def _batches(dataset, share, ctx: WorkerContext, sharded: bool, settings: Settings):
    """(batch, scored) of this rank's share; under sharding (where every forward is a collective: FSDP2
    gathers each block's weights from every rank) padded up to the largest share's number of batches with
    a batch of the split's first sample whose scores are dropped, so every rank runs as many forwards."""
    size, collate = settings.size, settings.collate_fn
    padding = next(iter(DataLoader(Subset(dataset, [0]), batch_size=1, collate_fn=collate))) \
        if sharded and len(dataset) else None
    for batch in DataLoader(share, batch_size=size, collate_fn=collate):
        yield batch, True
    if padding is None:
        return
    largest = math.ceil(math.ceil(len(dataset) / ctx.world_size) / size)  # rank 0's share
    for _ in range(largest - math.ceil(len(share) / size)):
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
    settings: Settings = field(default_factory=Settings)
    samples: int = 0  # validation samples the latest evaluation scored
    metrics: Dict[str, Tuple[float, Optional[float]]] = field(default_factory=dict)  # eval.metrics_fn's, latest
    # Why the evaluations stopped (out of memory): the point keeps its training's figures, and no quality.
    error: Optional[str] = None

    @classmethod
    def of(cls, spec: PointSpec) -> "Progress":
        g, every = spec.point.global_batch_size, spec.eval.every_samples
        return cls(math.ceil(every / g) if every else None, g, spec.eval.target_accuracy, spec.eval.target_loss,
                   spec.eval.stop_at_target, settings=Settings.of(spec))

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
        if self.error is not None:  # it ran out of memory before: it would again
            return 0.0
        began = time.perf_counter()
        self.recalibrated = recalibrate_batchnorm(model, train_set, micro_batch_size, bn_samples, seed, device)
        found = evaluate(model, val_set, device, ctx, self.settings)
        if found.error is not None:
            self.error = found.error
            spent = time.perf_counter() - began
            self.seconds += spent
            return spent
        accuracy, loss, self.loss_se, self.predictions = found[:4]
        self.samples, self.metrics = found.samples, found.metrics
        self.curve.append((self.start_samples + steps_done * self.samples_per_step, accuracy, loss))
        hit = (self.target_accuracy is not None and accuracy is not None and accuracy >= self.target_accuracy) or (
            self.target_loss is not None and loss is not None and loss <= self.target_loss)
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


def record(figures: Any, progress: Progress, splits: Any, language_model: bool) -> None:
    """The final evaluation's figures into a result's accuracy section (schema.Accuracy): the quality, the
    user's metrics with their standard errors and directions, or why there are none (eval_error)."""
    if progress.error is not None:
        figures.update(dict(eval_error=progress.error, eval_oom=True, eval_batch_size=progress.settings.size))
        return
    _, accuracy, loss = progress.curve[-1][:3]
    figures.update(dict(val_accuracy=accuracy, val_loss=loss, val_loss_se=progress.loss_se,
                        val_samples=progress.samples or None, num_classes=splits.num_classes,
                        eval_batch_size=progress.settings.size))
    if progress.metrics:
        declared = getattr(metrics.make(progress.settings.metrics_fn), "higher_is_better", {})
        figures.update(dict(
            val_metrics={name: value for name, (value, _) in progress.metrics.items()},
            val_metrics_se={name: se for name, (_, se) in progress.metrics.items() if se is not None},
            val_metric_directions=",".join(f"{name}={'higher' if up else 'lower'}"
                                           for name, up in sorted(declared.items()))))
    if progress.recalibrated:
        figures.bn_recalibration_samples = progress.recalibrated
    if language_model and loss is not None:
        figures.update(dict(
            val_tokens=progress.predictions, val_perplexity=math.exp(min(loss, 700.0)),
            val_bits_per_byte=loss / math.log(2) if splits.byte_level else None,
            train_unigram_entropy_bits=splits.unigram_entropy_bits))
