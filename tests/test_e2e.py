"""The real thing: the CLI with a local Ray and a SQLite MLflow store, read back afterwards."""

import math

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

TINY_MLP = ["model=mlp", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]"]
TRAIN = ["train.epochs=1", "train.lr=0.1", "train.warmup_steps=1", "train.timing_windows=2"]


def _runs(tmp_path, experiment="sweeper"):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweeper.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("sweeper.role") == "trial"]
    return client, parents, children


def test_equal_global_batch_layouts_give_one_loss_curve_through_the_cli(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    result = run_cli(
        *TINY_MLP, "data=digits", *TRAIN,
        "sweep.micro_batch_sizes=[8,16]", "sweep.accumulation_steps=[1,2,4]",
        "sweep.num_workers=[1,2]", "sweep.global_batch_sizes=[32]",
        cwd=tmp_path, env={"HOME": str(home)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "mlflow ui --backend-store-uri sqlite:///" in result.stdout
    assert "Ray dashboard:" in result.stdout

    client, parents, children = _runs(tmp_path)
    assert len(parents) == 1
    parent = parents[0]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"config.yaml"}
    layouts = {(r.data.params["micro_batch_size"], r.data.params["accumulation_steps"], r.data.params["num_workers"])
               for r in children}
    assert layouts == {("8", "4", "1"), ("16", "2", "1"), ("8", "2", "2"), ("16", "1", "2")}

    curves = []
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["sweeper.status"] == "ok"
        p, m = run.data.params, run.data.metrics
        assert set(p) >= {"model", "dataset", "micro_batch_size", "accumulation_steps", "num_workers",
                          "global_batch_size", "lr"}
        assert p["global_batch_size"] == "32" and p["model"] == "mlp" and p["dataset"] == "digits"
        assert m["samples_per_second"] > 0 and m["step_time_seconds"] > 0 and m["peak_memory_bytes"] > 0
        assert 0.0 <= m["val_accuracy"] <= 1.0
        assert m["startup_seconds"] > 0
        history = sorted(client.get_metric_history(run.info.run_id, "train_loss"), key=lambda x: x.step)
        assert [h.step for h in history] == list(range(1437 // 32))
        curves.append(torch.tensor([h.value for h in history]))
    for curve in curves[1:]:
        torch.testing.assert_close(curve, curves[0], rtol=1e-4, atol=1e-5)

    # Ray's files stay in the configured directory, not in the user's home.
    assert (tmp_path / ".sweeper" / "ray" / "auth_token").exists()
    assert (tmp_path / ".sweeper" / "ray" / "results").is_dir()
    assert not (home / ".ray").exists() and not (home / "ray_results").exists()


def test_own_model_factory_on_synthetic_data_reports_no_accuracy(tmp_path):
    result = run_cli(
        "model=custom", "model._target_=torchvision.models.mobilenet_v3_small", "model.input_shape=[3,32,32]",
        "data=synthetic", "data.num_samples=256", *TRAIN,
        "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[2]", "sweep.num_workers=[1]",
        "tracking.experiment_name=custom",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "synthetic data has random labels" in result.stdout
    _, parents, children = _runs(tmp_path, "custom")
    assert len(parents) == 1 and len(children) == 1
    run = children[0]
    assert run.data.tags["sweeper.status"] == "ok"
    assert "val_accuracy" not in run.data.metrics
    assert "random labels" in run.data.tags["sweeper.accuracy"]
    assert math.isfinite(run.data.metrics["train_loss"])


def test_a_trial_that_raises_is_recorded_failed_and_the_exit_status_says_so(tmp_path):
    # Bad model code: Identity returns the image, so the loss raises inside the worker.
    result = run_cli(
        "model=custom", "model._target_=torch.nn.Identity", *TRAIN,
        "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout
    client, parents, children = _runs(tmp_path)
    assert len(children) == 1
    run = children[0]
    assert run.data.tags["sweeper.status"] == "failed"
    assert run.info.status == "FAILED"
    assert run.data.tags["sweeper.error"]  # the worker's error, in one line
    assert client.get_run(parents[0].info.run_id).info.status == "FAILED"
