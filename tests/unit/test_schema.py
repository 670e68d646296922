"""The recorded schema has one home (sweeper/schema.py): what a point produces is what MLflow holds,
and what docs/mlflow.md names is what the code records."""

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.measure import flops
from sweeper.plan import GridPoint
from sweeper.schema import METRIC, FrontierResult, InferenceResult, PointResult, SearchFound, recorded_metric_names
from sweeper.tracking import Tracker
from sweeper.worker.points import run_point
from sweeper.worker.spec import GroupFacts, PointSpec, WorkerContext
from sweeper.workloads.samples import Samples
from tests.harness import mlflow_store

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mlflow.md"
# Figures a one-process CPU point cannot have: a GPU's, a worker group's (its first point or a later
# one, restarts, nodes), a budget's and an estimate's (not asked for here).
LANGUAGE_MODEL_ONLY = {
    "tokens_per_second", "tokens_seen", "flops_per_token_train", "val_tokens", "val_perplexity", "val_bits_per_byte",
    "train_unigram_entropy_bits",
}
NOT_ON_ONE_CPU_POINT = LANGUAGE_MODEL_ONLY | {
    "cuda_max_memory_allocated_bytes", "cuda_max_memory_reserved_bytes", "gpu_device_memory_used_bytes_max",
    "gpu_utilization_percent_mean", "gpu_utilization_percent_max", "worker_group_startup_seconds",
    "worker_group_launch_seconds", "worker_group_init_seconds", "worker_group_setup_seconds",
    "between_points_seconds", "worker_group_points", "worker_group_restarts", "num_nodes", "memory_budget_bytes",
    "memory_estimated_peak_bytes", "memory_estimate_error",
    # a sweep with a sharded parallelism's prediction (test_parallelism, test_e2e_parallelism)
    "memory_predicted_bytes", "memory_prediction_error",
    "communication_predicted_bytes_per_step", "communication_prediction_error",
    # a zero1 or hsdp point's communication per step (test_hybrid_sharding, test_e2e_hybrid)
    "communication_within_node_bytes_per_step", "communication_across_nodes_bytes_per_step",
    # the recipe's: fp16's loss scaling, checkpointing, compilation, clipping and a loss that counts items
    # (not asked for here: tests/unit/test_your_step.py checks them)
    "grad_scaler_scale", "grad_scaler_skipped_steps", "checkpointed_blocks", "compile_step_seconds",
    "grad_clipped_steps", "grad_clipped_fraction", "items_per_second", "items_seen",
    # a target's and a divergence's (none here)
    "reached_target", "samples_to_target", "steps_to_target", "time_to_target_seconds", "eval_seconds_to_target",
    "diverged_at_step",
    # a loss spike's warning (none here)
    "spike_at_step", "spike_peak_over_mean", "spike_recovered_after_steps",
    # sweep.strategy=smart's: set by the driver on a point whose class successive halving stopped, never
    # by a worker (tests/unit/test_smart.py checks them)
    "stopped_at_rung", "stopped_at_samples",
    # sweep.strategy=branch's: set by the driver on its trunk and branch runs (tests/unit/test_branch.py checks them)
    "branch_checkpoint_samples", "branch_global_batch", "branch_window_samples",
    # a training-state checkpoint's (not asked for here: tests/unit/test_state.py checks them)
    "start_samples", "checkpoint_read_seconds", "checkpoint_samples", "checkpoint_write_seconds", "checkpoint_bytes",
}


def test_a_name_the_schema_lacks_fails_loudly_instead_of_vanishing():
    with pytest.raises(ValueError, match="no field for \\['memory_new_thing_bytes'\\]"):
        PointResult.from_flat({"trial_key": "k", "memory_new_thing_bytes": 1})
    result = PointResult()
    with pytest.raises(ValueError, match="sweeper/schema.py"):
        result.memory.update({"peak_memory_bytes": 1, "memroy_typo_bytes": 2})
    with pytest.raises(ValueError):
        FrontierResult.from_flat({"frontier_new_figure": 3})


def test_a_flat_result_round_trips_and_records_only_finite_numbers():
    flat = {"trial_key": "mb8-acc1-w1", "status": "ok", "samples_per_second": 10.0, "throughput_stable": False,
            "train_loss": [2.0, 1.0], "mfu": float("nan"), "error": None}
    result = PointResult.from_flat(flat)
    assert result.throughput.samples_per_second == 10.0 and result["train_loss"] == [2.0, 1.0]
    assert PointResult.from_flat(result.to_flat()) == result
    assert result.metrics() == {"samples_per_second": 10.0}  # a NaN figure is not a measurement
    assert result.tags() == {"sweeper.throughput_stable": "false"}
    assert "mfu" in result and "val_accuracy" not in result  # set (to NaN), but never recorded
    frontier = FrontierResult(trial_key="frontier-w2", memory_budget_bytes=100,
                              plain=SearchFound(micro_batch_size=64, fit_points=3),
                              accumulating=SearchFound(micro_batch_size=48))
    assert FrontierResult.from_flat(frontier.to_flat()) == frontier
    assert frontier.metrics("w2") == {
        "frontier_micro_batch_size_w2": 64.0, "frontier_fit_points_w2": 3.0,
        "frontier_accumulating_micro_batch_size_w2": 48.0, "memory_budget_bytes_w2": 100.0,
    }
    assert set(frontier.metrics("w2-bf16-ckpt")) >= {"frontier_micro_batch_size_w2_bf16_ckpt"}


def test_every_metric_a_cpu_point_can_have_is_produced_and_recorded(tmp_path):
    model = ModelConfig(name="mlp", depth=2, width=32, input_shape=[1, 8, 8])
    spec = PointSpec(
        model=model, data=DataConfig(name="digits"), train=TrainConfig(epochs=1), point=GridPoint(16, 2, 1),
        lr=0.1, steps=8, measure=MeasureConfig(warmup_steps=2, windows=3, stable_windows=2, stability_tolerance=0.5),
        flop_count=flops.count_flops(lambda: __import__("sweeper.workloads.models").workloads.models.build(model, 10),
                                     Samples((1, 8, 8), 10)),
    )
    peak = flops.PeakFlops(1e10, "a test's figure")
    result = run_point(spec, WorkerContext(), facts=GroupFacts(peaks={"fp32": peak}))
    assert result.status == "ok", result.error
    produced = set(result.metrics()) | set(result.series()) | set(result.curves())
    expected = set(PointResult.names(METRIC)) - NOT_ON_ONE_CPU_POINT - {"bn_recalibration_samples"}  # no BatchNorm
    expected |= {"val_accuracy_curve", "val_loss_curve", "grad_norm", "train_loss", "window_samples_per_second"}
    assert expected - produced == set()
    tracker = Tracker(mlflow_store(tmp_path), "schema")
    tracker.start_sweep("sweep-schema", {}, "")
    run_id = tracker.log_point(spec.point, {}, result)
    recorded = MlflowClient(tracker.store.uri).get_run(run_id).data
    assert set(recorded.metrics) == produced
    assert {k: v for k, v in recorded.tags.items() if k in result.tags()} == result.tags()


def test_docs_name_exactly_the_recorded_metrics():
    text = DOCS.read_text()
    quoted = set(re.findall(r"`([a-z][a-z0-9_]*)`", text))
    recorded = set(recorded_metric_names())
    assert recorded - quoted == set(), "recorded but not in docs/mlflow.md"
    point_table = text[text.index("Metrics of a point's run"):text.index("## Frontier probes")]
    documented = set(re.findall(r"`([a-z][a-z0-9_]*)`", point_table))
    assert documented - set(PointResult.names()) == set(), "in docs/mlflow.md's point table but not in the schema"
    inference = set(re.findall(r"`([a-z][a-z0-9_]*)`", text[text.index("## Frontier probes"):]))
    own = set(InferenceResult.names(METRIC)) - set(PointResult.names(METRIC))  # memory: "the metrics above"
    assert own - inference == set()
