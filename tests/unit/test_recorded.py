"""A recorded point read back as the report's Trial (sweeper/report/recorded.py): every Trial field comes
back from a real SQLite store under its own recorded name (a param, a metric, the schema's tag name), as its
declared type; older records and runs without a status read as they always did."""

import dataclasses

import pytest

from sweeper.plan import GridPoint
from sweeper.report.recorded import trial_of, trials_of
from sweeper.report.trials import Trial
from sweeper.schema import PointResult
from sweeper.tracking import SweepReader, Tracker
from tests.harness import mlflow_store

POINT = GridPoint(16, 2, 1, precision="bf16", checkpointing="blocks", lr_multiplier=2.0, seed=3, context=64)
# What the driver records of a point's run: its params (MLflow keeps them as text) ...
PARAMS = {"point": POINT.point_key, "micro_batch_size": 16, "accumulation_steps": 2, "num_workers": 1,
          "global_batch_size": 32, "lr": 0.002, "seed": 3, "lr_multiplier": 2.0, "precision": "bf16",
          "parallelism": "ddp", "activation_checkpointing": "blocks", "optimizer": "adamw", "compiled": True,
          "context": 64, "dataset": "digits", "gradient_sync": "final"}
# ... and what its worker measured: every figure the report reads, a diverged run's tags included.
RESULT = {
    "trial_key": POINT.key, "status": "diverged", "error": "loss spiked", "divergence_reason": "spike",
    "diverged_at_step": 7, "samples_per_second": 512.0, "samples_per_second_cv": 0.04, "throughput_stable": False,
    "peak_memory_bytes": 3_000_000, "memory_activations_bytes": 1_048_576, "val_accuracy": 0.75,
    "val_samples": 360, "val_loss": 0.9, "val_loss_se": 0.05, "val_bits_per_byte": 1.5, "num_classes": 10,
    "train_unigram_entropy_bits": 4.25, "train_loss": [2.5, 1.75, 1.25], "train_seconds": 8.0,
    "samples_seen": 4096, "steps_to_target": 96, "samples_to_target": 3072, "time_to_target_seconds": 6.5,
    "reached_target": 1, "throughput_emulated": "bf16 emulated: no avx512_bf16",
    "eval_error": "OutOfMemoryError: evaluation", "memory_predicted_bytes": 2_500_000,
    "communication_bytes_per_step": 65_536, "gns_b_simple": 40.0, "gns_b_simple_train_avg": 36.0,
    "tokens_per_second": 32768.0, "data_seconds_per_step": 0.01, "memory_parameters_bytes": 400_000,
    "evaluations": 3, "eval_seconds": 1.5, "checkpoint_write_seconds": 0.25,
}
# Trial fields whose figures other branches add to the schema (data_wait_fraction: the streaming data's); read
# under those names once recorded.
NOT_YET_IN_THE_SCHEMA = {"data_wait_fraction"}


def test_every_trial_field_comes_back_from_a_real_store_under_its_recorded_name(tmp_path):
    tracker = Tracker(mlflow_store(tmp_path), "recorded")
    parent = tracker.start_sweep("sweep-recorded", {"dataset": "digits"}, "a: 1\n")
    tracker.log_point(POINT, PARAMS, PointResult.from_flat(RESULT))
    (got,) = trials_of(SweepReader(tracker.store, parent).load())
    assert got == Trial(
        key=POINT.key, micro_batch_size=16, accumulation_steps=2, num_workers=1, global_batch_size=32,
        status="diverged", lr=0.002, samples_per_second=512.0, samples_per_second_cv=0.04, throughput_stable=False,
        peak_memory_bytes=3_000_000.0, val_accuracy=0.75, train_seconds=8.0, samples_seen=4096.0,
        point_key=POINT.point_key, seed=3, lr_multiplier=2.0, precision="bf16", parallelism="ddp",
        activation_checkpointing="blocks", optimizer="adamw", compiled=True, error="loss spiked",
        throughput_emulated="bf16 emulated: no avx512_bf16", eval_error="OutOfMemoryError: evaluation",
        diverged_reason="spike", diverged_at_step=7, val_loss=0.9, val_samples=360,
        train_loss=1.25,  # the series' last step: MLflow's latest value
        steps_to_target=96.0, samples_to_target=3072.0, time_to_target_seconds=6.5, reached_target=True,
        gns_b_simple=40.0, gns_b_simple_train_avg=36.0, num_classes=10, tokens_per_second=32768.0, val_loss_se=0.05,
        val_bits_per_byte=1.5, train_unigram_entropy_bits=4.25, context=64, memory_activations_bytes=1_048_576.0,
        gradient_sync="final", memory_predicted_bytes=2_500_000.0, communication_bytes_per_step=65_536.0,
        data_seconds_per_step=0.01, memory_parameters_bytes=400_000.0, evaluations=3, eval_seconds=1.5,
        checkpoint_write_seconds=0.25,
    )
    # A Trial field with no recorded name to read it from would come back None here: give it one
    # (its name, or `recorded_as`) and record it in the test above.
    assert [f.name for f in dataclasses.fields(Trial) if getattr(got, f.name) is None
            and f.name not in NOT_YET_IN_THE_SCHEMA] == []


def test_an_older_record_reads_its_point_from_the_tag_and_leaves_what_it_lacks_unset():
    row = {"key": "mb8-acc1-w1-s0", "sweeper.point": "mb8-acc1-w1", "micro_batch_size": "8",
           "accumulation_steps": "1", "num_workers": "1", "global_batch_size": "8", "status": "ok",
           "precision": "None", "sweeper.throughput_stable": "true", "reached_target": 0.0, "compiled": "False"}
    got = trial_of(row)
    assert (got.point_key, got.precision, got.seed) == ("mb8-acc1-w1", None, None)
    assert (got.throughput_stable, got.reached_target, got.compiled) == (True, False, False)
    # A run without a status is a failed one; without its layout it is no record at all.
    assert trial_of({**row, "status": ""}).status == "failed"
    with pytest.raises(KeyError, match="global_batch_size"):
        trial_of({k: v for k, v in row.items() if k != "global_batch_size"})
