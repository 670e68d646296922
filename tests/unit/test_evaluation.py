"""A point's evaluation (sweeper/worker/evaluate.py, scoring.py, metrics.py): a language model's loss in
chunks, within the memory eval.batch_size and the chunking predict; an evaluation that runs out of memory
keeps the point's throughput and memory; eval.max_samples' fixed subset; a metric of the user's own over the
whole split and every rank, with its bootstrap standard error; and their config checks."""

from __future__ import annotations

import datetime
import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from hydra.utils import get_method
from torch import nn
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.utils.data import TensorDataset

from sweeper.config import DataConfig, EvalConfig, MeasureConfig, ModelConfig, TrainConfig, validate
from sweeper.plan import GridPoint
from sweeper.worker import evaluate as evaluation
from sweeper.worker import metrics, scoring
from sweeper.worker.points import run_point
from sweeper.worker.spec import WorkerContext
from sweeper.workloads.gpt import GPT
from tests.harness import typed_cfg
from tests.helpers import point_spec

CPU = torch.device("cpu")
HERE = "tests.unit.test_evaluation"


# --- a language model's loss in chunks -------------------------------------------------------------------

VOCAB, CONTEXT = 32_000, 16
# GPT(32000, 16, 1 layer, 2 heads, d_model 8): the token table 32000 x 8 (the head is tied to it), positions
# 16 x 8, one block (two LayerNorms 2 x 16, qkv 8 x 24 + 24, proj 8 x 8 + 8, MLP 8 x 32 + 32 and 32 x 8 + 8 =
# 872), the final LayerNorm 16: 257,016 fp32 parameters.
PARAMETER_BYTES = 257_016 * 4
CHUNK = 2**20  # 1 MiB: 1,048,576 // (32000 x 4) = 8 rows per chunk
# The batch's token ids and the model's small activations (a few KiB at d_model 8), beside the figures below.
SMALL = 4096


def _tracked_peak(model: nn.Module, data, settings: evaluation.Settings) -> int:
    """torch's MemTracker (as sweeper/measure/memory.py uses it) over one evaluation: the peak of its tensors."""
    tracker = MemTracker()
    tracker.track_external(model)
    # Its module statistics are one forward's; the peak over tensors spans every batch.
    hook = model.register_forward_hook(lambda *_: tracker.reset_mod_stats())
    with tracker:
        evaluation.evaluate(model, data, CPU, WorkerContext(), settings)
    hook.remove()
    return tracker.get_tracker_snapshot("peak")[CPU][_TOTAL_KEY]


def _sequences(count: int) -> TensorDataset:
    tokens = torch.randint(0, VOCAB, (count, CONTEXT + 1), generator=torch.Generator().manual_seed(0))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


@pytest.mark.parametrize("precision, batch, logits_and_chunk", [
    # fp32 at eval.batch_size 4: logits 4 x 16 x 32000 x 4 B = 8,192,000; one chunk's log-softmax
    # 8 x 32000 x 4 = 1,024,000 (its fp32 "copy" is a view of fp32 logits).
    ("fp32", 4, 8_192_000 + 1_024_000),
    # twice the batch: twice the logits, the same chunk.
    ("fp32", 8, 16_384_000 + 1_024_000),
    # bf16 autocast: logits in bf16, 4 x 16 x 32000 x 2 B = 4,096,000; one chunk's fp32 copy and its
    # log-softmax, 1,024,000 each.
    ("bf16", 4, 4_096_000 + 2 * 1_024_000),
])
def test_a_language_models_evaluation_at_vocabulary_32k_stays_within_what_its_batch_and_chunking_predict(
        precision, batch, logits_and_chunk):
    torch.manual_seed(0)
    model, data = GPT(VOCAB, CONTEXT, 1, 2, 8), _sequences(8)  # two batches of 4, or one of 8
    assert sum(p.numel() * 4 for p in model.parameters()) == PARAMETER_BYTES
    assert scoring.predicted_bytes(batch * CONTEXT, VOCAB, 2 if precision == "bf16" else 4, CHUNK) == logits_and_chunk
    peak = _tracked_peak(model, data, evaluation.Settings(batch_size=batch, precision=precision, chunk_bytes=CHUNK))
    # Within the prediction (a batch's logits are gone before the next batch's exist), and not far under it.
    assert PARAMETER_BYTES + logits_and_chunk <= peak <= PARAMETER_BYTES + logits_and_chunk + SMALL
    # Unchunked, as evaluation was before: the log-softmax of every logit beside the logits (and under bf16
    # their fp32 copy as well): over the prediction by a whole batch of fp32 logits, less one chunk.
    whole = _tracked_peak(model, data, evaluation.Settings(batch_size=batch, precision=precision, chunk_bytes=2**40))
    assert whole >= PARAMETER_BYTES + logits_and_chunk + batch * CONTEXT * VOCAB * 4 - 2 * 1_024_000


def test_scores_in_chunks_are_the_whole_batchs_scores():
    torch.manual_seed(1)
    logits, targets = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    targets[2, 3:] = scoring.IGNORE_INDEX  # padding: scored nowhere
    sums = scoring.new_sums(CPU)
    scoring.add(sums, logits, targets, chunk_bytes=2 * 11 * 4)  # 2 rows per chunk: chunks cross samples
    accuracy, loss, se, predictions, samples = scoring.summary(sums)
    scored = targets != scoring.IGNORE_INDEX
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none", ignore_index=-100)
    per_sample = per_token.view(3, 5).sum(1) / scored.sum(1)
    assert (predictions, samples) == (13, 3)
    assert loss == pytest.approx(per_token.sum().item() / 13, abs=1e-6)
    assert accuracy == pytest.approx(((logits.argmax(-1) == targets) & scored).sum().item() / 13)
    assert se == pytest.approx(per_sample.std().item() / math.sqrt(3), abs=1e-6)


# --- eval.max_samples ------------------------------------------------------------------------------------


def test_max_samples_is_one_seeded_subset_for_every_point_in_the_splits_order():
    data = TensorDataset(torch.arange(100))
    first, again = evaluation.validation_subset(data, 10), evaluation.validation_subset(data, 10)
    assert list(first.indices) == list(again.indices) == sorted(first.indices) and len(first) == 10
    assert evaluation.validation_subset(data, 100) is data and evaluation.validation_subset(data, None) is data
    found = evaluation.evaluate(nn.Sequential(nn.Linear(4, 3)), TensorDataset(torch.randn(50, 4), torch.arange(50) % 3),
                                CPU, WorkerContext(), evaluation.Settings(batch_size=7, max_samples=20))
    assert (found.samples, found.predictions) == (20, 20)


# --- an evaluation that runs out of memory ---------------------------------------------------------------


class OutOfMemoryInEvaluation(nn.Module):
    """Trains as a linear classifier; its evaluation forward raises the CUDA allocator's error, where a
    real one enters (the validation batch's activations or logits)."""

    calls = 0

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            OutOfMemoryInEvaluation.calls += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
        return self.net(x)


def test_an_evaluation_out_of_memory_keeps_the_points_throughput_and_memory_simulated_at_the_eval_forward():
    model = ModelConfig(name="custom", _target_=f"{HERE}.OutOfMemoryInEvaluation", input_shape=[1, 8, 8])
    spec = point_spec(GridPoint(16, 1, 1), model, DataConfig(name="digits"), lr=0.05, steps=8,
                      train=TrainConfig(epochs=1), measure=MeasureConfig(warmup_steps=2, windows=3, stable_windows=2,
                                                                         stability_tolerance=0.5, flops=False),
                      eval=EvalConfig(every_samples=32))
    built = get_method(model._target_)  # the class the factory path builds (this module under its import name)
    built.calls = 0
    result = run_point(spec, WorkerContext())
    assert result.status == "ok" and result.error is None
    assert result.throughput.samples_per_second > 0 and result.memory.peak_memory_bytes > 0
    assert result.cost.optimizer_steps == 8  # training went on after the evaluation at 32 samples ran out
    assert result.accuracy.eval_oom is True and result.accuracy.eval_batch_size == 256
    assert result.accuracy.eval_error == ("out of memory evaluating at eval.batch_size=256 (OutOfMemoryError: CUDA "
                                          "out of memory. Tried to allocate 20.00 GiB (simulated)): lower "
                                          "eval.batch_size")
    assert result.accuracy.val_accuracy is None and result.accuracy.val_loss is None
    assert built.calls == 1  # it would run out again: no evaluation after the first
    assert result.tags()["sweeper.eval_oom"] == "true"
    assert "samples_per_second" in result.metrics() and "val_loss" not in result.metrics()


# --- a metric of the user's own ---------------------------------------------------------------------------


class F1:
    """Binary F1 as a user writes it for eval.metrics_fn: per-sample counts, the metric of their totals."""

    higher_is_better = {"f1": True}

    def update(self, outputs, batch):
        predicted, labels = outputs.argmax(-1), batch[1]
        return {"tp": (predicted == 1) & (labels == 1), "fp": (predicted == 1) & (labels == 0),
                "fn": (predicted == 0) & (labels == 1)}

    def compute(self, totals):
        tp, fp, fn = (float(totals[k]) for k in ("tp", "fp", "fn"))
        return {"f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0}


class Accuracy:
    higher_is_better = {"accuracy": True}

    def update(self, outputs, batch):
        return {"hits": outputs.argmax(-1) == batch[1]}

    def compute(self, totals):
        return {"accuracy": float(totals["hits"])}  # a share when the totals are a resample's weights / n


def _predictions_and_labels():
    """45 samples whose positives cluster early: per-batch F1s (batches of 8) average far from the split's."""
    predicted = np.array([1] * 10 + [0, 1] * 5 + [0] * 25)
    labels = np.array([1] * 6 + [0] * 4 + [1, 1] * 5 + [0, 1] * 3 + [0] * 19)
    return predicted, labels


def _f1_rank(rank: int, world: int, folder: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        predicted, labels = _predictions_and_labels()
        data = TensorDataset(F.one_hot(torch.tensor(predicted), 2).float(), torch.tensor(labels))
        found = evaluation.evaluate(nn.Identity(), data, CPU, WorkerContext(rank, world),
                                    evaluation.Settings(batch_size=8, metrics_fn=f"{HERE}.F1"))
        # Rank 1 alone runs out of memory (simulated at its forward): both ranks return the evaluation's error.
        fails = OutOfMemoryInEvaluation(2) if rank == 1 else nn.Sequential(nn.Identity())
        failed = evaluation.evaluate(fails, data, CPU, WorkerContext(rank, world), evaluation.Settings(batch_size=8))
    finally:
        dist.destroy_process_group()
    torch.save(dict(metrics=dict(found.metrics), error=failed.error, figures=failed[:4]),
               os.path.join(folder, f"rank{rank}.pt"))


def test_an_f1_from_metrics_fn_is_the_whole_splits_over_two_gloo_ranks_not_a_mean_of_batches(tmp_path):
    """Also: an evaluation out of memory on one rank (simulated at its forward) is agreed by both."""
    from sklearn.metrics import f1_score

    mp.spawn(_f1_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    predicted, labels = _predictions_and_labels()
    whole = f1_score(labels, predicted)  # tp 11, fp 4, fn 8: 22 / 34 = 0.647
    assert whole == pytest.approx(22 / 34)
    batches = np.mean([f1_score(labels[i:i + 8], predicted[i:i + 8], zero_division=0.0) for i in range(0, 45, 8)])
    assert abs(batches - whole) > 0.1  # what a mean over batches would have said
    for found in ranks:
        value, se = found["metrics"]["f1"]
        assert value == pytest.approx(whole, abs=1e-12)
        assert 0 < se < 0.2
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # the same figures on every rank (one seeded bootstrap)
    # An evaluation out of memory on rank 1 alone is every rank's result, and neither hangs.
    assert ranks[0]["error"] == ("out of memory evaluating at eval.batch_size=8 (another rank ran out of memory): "
                                 "lower eval.batch_size")
    assert ranks[1]["error"].startswith("out of memory evaluating at eval.batch_size=8 (OutOfMemoryError: CUDA out")
    assert ranks[0]["figures"] == ranks[1]["figures"] == (None, None, None, 0)


def test_the_bootstrap_standard_error_of_a_proportion_is_the_binomials():
    # 120 hits of 400: sqrt(0.3 x 0.7 / 400) = 0.0229. 200 resamples estimate an SE to about 5 %.
    hits = np.array([[1.0]] * 120 + [[0.0]] * 280) / 400  # each sample's share of the accuracy
    se = metrics.bootstrap_se(Accuracy(), ["hits"], hits)["accuracy"]
    assert se == pytest.approx(math.sqrt(0.3 * 0.7 / 400), rel=0.15)


def test_metrics_fn_counts_must_have_one_entry_per_sample():
    class Whole(F1):
        def update(self, outputs, batch):
            return {"tp": ((outputs.argmax(-1) == 1) & (batch[1] == 1)).sum()}

    counts = metrics.Counts(Whole())
    with pytest.raises(ValueError, match="count 'tp' has 1 entries for a batch of 4 samples: give one per sample"):
        counts.add(torch.eye(2)[[0, 1, 1, 0]], (None, torch.tensor([0, 1, 0, 0])), 4)


# --- their keys -------------------------------------------------------------------------------------------


class Lacking:
    higher_is_better = {"f1": True}

    def update(self, outputs, batch):
        return {}


def test_eval_and_quality_metric_keys_are_checked_before_launch_naming_the_key():
    assert validate(typed_cfg("eval.batch_size=0", "eval.max_samples=-1")) == [
        "eval.batch_size=0: must be a positive number of samples per forward, e.g. 64, or null (the point's "
        "micro-batch)",
        "eval.max_samples=-1: must be a positive number of validation samples, or null (the whole split)"]
    assert validate(typed_cfg(f"eval.metrics_fn={HERE}.Lacking")) == [
        f"eval.metrics_fn='{HERE}.Lacking' lacks compute: give a class whose objects have update(outputs, batch) -> "
        "{count: per-sample tensor}, compute(totals) -> {metric: float} and higher_is_better = {metric: bool}"]
    assert validate(typed_cfg("report.quality_metric=f1")) == [
        "report.quality_metric=f1 is not a metric this sweep records (eval.metrics_fn is null, so it records "
        "val_accuracy, val_loss, val_bits_per_byte): set eval.metrics_fn to a metrics class that computes f1, or "
        "report.quality_metric=null"]
    assert validate(typed_cfg(f"eval.metrics_fn={HERE}.F1", "report.quality_metric=f2")) == [
        f"report.quality_metric=f2 is not a metric eval.metrics_fn={HERE}.F1 declares (its higher_is_better has f1; "
        "built-in: val_accuracy, val_loss, val_bits_per_byte): name one of them"]
    assert validate(typed_cfg(f"eval.metrics_fn={HERE}.F1", "report.quality_metric=f1", "eval.batch_size=null")) == []
    assert validate(typed_cfg("report.quality_metric=val_loss", "report.quality=val_accuracy")) == [
        "report.quality_metric=val_loss with report.quality=val_accuracy: both name what the recommendation judges "
        "by; set one of them (the other null or auto)"]


def test_a_null_eval_batch_size_is_the_points_micro_batch():
    spec = point_spec(GridPoint(16, 2, 1), ModelConfig(name="mlp"), DataConfig(name="digits"), lr=0.1, steps=1,
                      eval=EvalConfig(batch_size=None, max_samples=100))
    settings = evaluation.Settings.of(spec)
    assert (settings.size, settings.max_samples, settings.precision) == (16, 100, "fp32")
    assert evaluation.Settings.of(replace(spec, eval=EvalConfig())).size == 256


class HitRate:
    """Accuracy again, as a user metric: its value must be val_accuracy's, its SE about the binomial's."""

    higher_is_better = {"hit_rate": True}

    def update(self, outputs, batch):
        return {"hits": outputs.argmax(-1) == batch[1], "samples": torch.ones(len(batch[1]))}

    def compute(self, totals):
        return {"hit_rate": float(totals["hits"] / totals["samples"])}


def test_a_points_user_metric_is_recorded_in_mlflow_and_read_back_by_the_report(tmp_path):
    from mlflow.tracking import MlflowClient

    from sweeper.report.recorded import trials_of
    from sweeper.tracking import Tracker
    from tests.harness import mlflow_store

    spec = point_spec(GridPoint(16, 1, 1), ModelConfig(name="mlp", depth=2, width=32, input_shape=[1, 8, 8]),
                      DataConfig(name="digits"), lr=0.1, steps=6, train=TrainConfig(epochs=1),
                      measure=MeasureConfig(warmup_steps=2, windows=2, stable_windows=2, stability_tolerance=0.5,
                                            flops=False, memory_breakdown=False),
                      eval=EvalConfig(batch_size=50, metrics_fn=f"{HERE}.HitRate"))
    result = run_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    figures = result.accuracy
    value, samples = figures.val_metrics["hit_rate"], figures.val_samples
    assert value == pytest.approx(figures.val_accuracy, abs=1e-12) and figures.eval_batch_size == 50
    assert figures.val_metrics_se["hit_rate"] == pytest.approx(math.sqrt(value * (1 - value) / samples), rel=0.2)
    tracker = Tracker(mlflow_store(tmp_path), "metrics")
    parent = tracker.start_sweep("sweep-metrics", {}, "")
    layout = dict(micro_batch_size=16, accumulation_steps=1, num_workers=1, global_batch_size=16)
    run_id = tracker.log_point(spec.point, layout, result)
    recorded = MlflowClient(tracker.store.uri).get_run(run_id).data
    assert recorded.metrics["val_metric/hit_rate"] == value and "val_metric_se/hit_rate" in recorded.metrics
    assert recorded.tags["sweeper.metric_directions"] == "hit_rate=higher"
    read = trials_of(tracker.reader.load())
    assert [t.metric("hit_rate")[::2] for t in read] == [(value, True)]
