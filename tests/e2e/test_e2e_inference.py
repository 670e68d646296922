"""The inference sweep for real: the CLI with a local Ray and a SQLite MLflow store, read back."""

import pytest
from mlflow.tracking import MlflowClient

from tests.harness import run_cli

pytestmark = pytest.mark.e2e


@pytest.mark.own_ray
def test_inference_batch_sweep_records_latency_per_batch_and_both_knees(tmp_path):
    result = run_cli(
        "+experiment=mlp_knee", "inference.mlp_widths=[64,256]", "model.depth=2", "inference.batch_sizes=[1,4,16,64]",
        "inference.timed_runs=10", "inference.min_timed_seconds=0.05", "cluster.include_dashboard=false",
        cwd=tmp_path, own_ray=True,  # the inference sweep's default path: a local Ray it starts itself
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


def test_decode_sweep_records_prefill_decode_and_the_kv_cache_per_batch_and_context(tmp_path):
    """+experiment=gpt_decode, shrunk: each batch of concurrent sequences at each context is a child run
    with its decode step's latency, prefill and KV cache; the parent has the KV cache per sequence
    measured from the peak memory's growth against the formula, both knees and the largest batch under
    the budget."""
    result = run_cli(
        "+experiment=gpt_decode", "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.context=64",
        "inference.batch_sizes=[1,4,16]", "inference.contexts=[16,64]", "inference.timed_runs=5",
        "inference.min_timed_seconds=0", "inference.warmup_runs=2", "device.memory_budget_gb=0.0625",
        "cluster.include_dashboard=false", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "decode step p50" in result.stdout and "KV cache's tensors hold" in result.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeper")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get("sweeper.role") == "sweep")
    points = [r for r in runs if r.data.tags.get("sweeper.role") == "inference"]
    assert sorted(r.data.tags["sweeper.trial_key"] for r in points) == sorted(
        f"bs{b}-ctx{c}" for b in (1, 4, 16) for c in (16, 64))
    for run in points:
        m, context = run.data.metrics, int(run.data.params["context"])
        assert run.data.tags["sweeper.status"] == "ok" and m["context"] == context
        # measured from the cache's tensors, against the formula written out (1 layer, d_model 32, fp32)
        assert m["kv_cache_bytes"] == m["batch_size"] * 2 * 1 * 32 * context * 4
        assert m["peak_memory_bytes"] == m["weight_bytes"] + m["kv_cache_bytes"] + m["decode_activation_peak_bytes"]
        assert m["decode_flops_per_token"] == m["decode_flops_formula_per_token"]
        assert m["tokens_per_second"] == pytest.approx(m["batch_size"] / m["latency_p50_seconds"])
        assert m["prefill_tokens"] == context - 1 and m["prefill_p50_seconds"] > 0
    pm = parent.data.metrics
    for context in (16, 64):
        name = f"gpt-ctx{context}"
        measured = pm[f"kv_cache_measured_bytes_per_sequence_{name}"]
        formula = pm[f"kv_cache_formula_bytes_per_sequence_{name}"]
        # The cache's tensors, exactly; beyond them one more sequence holds its decode step's activations
        # (~1.5 KiB for this tiny model), named apart, and the peak's slope is their sum.
        assert measured == pytest.approx(formula, rel=1e-9)
        step = pm[f"decode_activation_peak_bytes_per_sequence_{name}"]
        assert 0 < step < 3 * 1024
        assert pm[f"peak_memory_bytes_per_sequence_{name}"] == pytest.approx(measured + step, rel=1e-6)
        assert f"knee_measured_batch_size_{name}" in pm and pm[f"largest_decode_batch_measured_{name}"] == 16
