"""The inference sweep for real: the CLI with a local Ray and a SQLite MLflow store, read back."""

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_cli

pytestmark = pytest.mark.e2e


def test_inference_batch_sweep_records_latency_per_batch_and_both_knees(tmp_path):
    result = run_cli(
        "+experiment=mlp_knee", "inference.mlp_widths=[64,256]", "model.depth=2", "inference.batch_sizes=[1,4,16,64]",
        "inference.timed_runs=10", "inference.min_timed_seconds=0.05", "cluster.include_dashboard=false",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "measured knee" in result.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeper")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get("sweeper.role") == "sweep")
    points = [r for r in runs if r.data.tags.get("sweeper.role") == "inference"]
    assert parent.data.tags["sweeper.task"] == "inference"
    assert sorted(r.data.tags["sweeper.trial_key"] for r in points) == sorted(
        f"mlp{w}-bs{b}" for w in (64, 256) for b in (1, 4, 16, 64)
    )
    for run in points:
        m = run.data.metrics
        assert run.data.tags["sweeper.status"] == "ok"
        assert 0 < m["latency_p50_seconds"] <= m["latency_p95_seconds"] <= m["latency_p99_seconds"]
        assert m["samples_per_second"] > 0 and m["peak_memory_bytes"] > 0 and m["timed_runs"] >= 10
    pm = parent.data.metrics
    for width in (64, 256):
        assert f"knee_measured_batch_size_mlp{width}" in pm
        assert f"knee_predicted_batch_size_mlp{width}" in pm
        assert pm[f"weight_bytes_mlp{width}"] > 0 and pm[f"ridge_flops_per_byte_mlp{width}"] > 0
    assert pm["bandwidth_bytes_per_second"] > 0
    assert "report/inference_curves.png" in {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
