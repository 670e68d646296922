"""Your training as it is, through the CLI on the session's Ray, read back from MLflow: the Ray Train-style loop of
docs/your-training.md (tests/your_loop.py) swept over four layouts of one global batch, one and two workers, with
the built-in loop's figures and one loss curve; a LightningModule and its DataModule written as Lightning's docs
write them (tests/your_lightning.py), fitted unchanged by Lightning's Trainer over two layouts."""

import pytest
from mlflow.tracking import MlflowClient

from tests.harness import run_cli

pytestmark = pytest.mark.e2e

GRID = ("train.samples=256", "sweep.global_batch_sizes=[16]", "measure.warmup_steps=3", "measure.windows=3",
        "measure.stable_windows=2", "optim=sgd", "optim.lr=0.05")


def _trials(tmp_path, experiment):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    runs = [r for r in client.search_runs([found.experiment_id]) if r.data.tags.get("sweeper.role") == "trial"]
    curves = {r.data.tags["sweeper.trial_key"]: [m.value for m in sorted(
        client.get_metric_history(r.info.run_id, "train_loss"), key=lambda m: m.step)] for r in runs}
    return {r.data.tags["sweeper.trial_key"]: r for r in runs}, curves


def _built_in():
    """The MLflow metrics the built-in loop records for the same point (trained here, in-process), and its
    losses."""
    from sweeper.config import DataConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
    from sweeper.plan import GridPoint
    from sweeper.worker.spec import WorkerContext
    from sweeper.worker.train import train_point
    from tests.helpers import point_spec

    spec = point_spec(GridPoint(8, 2, 1), ModelConfig(name="custom", _target_="tests.your_loop.block_net",
                                                      input_shape=[8]),
                      DataConfig(name="custom", _target_="tests.your_loop.blob_data", num_classes=4), lr=0.05,
                      steps=16, train=TrainConfig(samples=256),
                      measure=MeasureConfig(warmup_steps=3, windows=3, stable_windows=2),
                      optim=OptimConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=0.0))
    result = train_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    return set(result.metrics()) | set(result.series()), result.train_loss


def test_a_ray_train_style_loop_sweeps_four_layouts_with_the_built_in_loops_records(tmp_path):
    result = run_cli("loop.fn=tests.your_loop.train_loop_per_worker", "+loop.metrics.hit_rate=higher", *GRID,
                     "sweep.micro_batch_sizes=[4,8,16]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1,2]",
                     "tracking.experiment_name=loop", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FLOPs (MFU) and the fake-tensor memory estimate are skipped: the training is yours" in result.stdout
    runs, curves = _trials(tmp_path, "loop")
    assert sorted(runs) == ["mb16-acc1-w1", "mb4-acc2-w2", "mb8-acc1-w2", "mb8-acc2-w1"]
    # what only sweeper's own evaluation knows (the split's size and classes, its loss's spread, its batch size)
    # and what only the built-in step counts (its collectives: your loop's backward is not counted yet)
    fields, built_in_losses = _built_in()
    expected = fields - {"val_loss_se", "val_samples", "num_classes", "eval_batch_size",
                         "communication_bytes_per_step", "communication_collectives_per_step"}
    for key, run in runs.items():
        assert run.data.tags["sweeper.status"] == "ok", (key, run.data.tags.get("sweeper.error"))
        assert run.data.params["loop_fn"] == "tests.your_loop.train_loop_per_worker"
        metrics = run.data.metrics
        if key == "mb8-acc2-w1":  # the built-in's layout: a one-micro-batch step (mb16-acc1-w1) measures no GNS
            assert expected - set(metrics) == set(), key
        assert metrics["samples_per_second"] > 0 and metrics["peak_memory_bytes"] > 0
        assert metrics["val_metric/hit_rate"] == metrics["val_accuracy"] > 0.25  # better than a guess of 4 classes
        assert run.data.tags["sweeper.metric_directions"] == "hit_rate=higher"
    first = curves["mb16-acc1-w1"]
    assert len(first) == 16
    assert first == pytest.approx(built_in_losses, abs=1e-5)  # the built-in loop's, at the same global batch
    for key, curve in curves.items():
        assert curve == pytest.approx(first, abs=1e-5), key


def test_a_lightning_module_and_datamodule_sweep_unchanged_over_two_layouts(tmp_path):
    result = run_cli("model=lightning", "model.module=tests.your_lightning.LitClassifier", "data=lightning",
                     "data.datamodule=tests.your_lightning.BlobDataModule", *GRID, "sweep.micro_batch_sizes=[8]",
                     "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1,2]", "tracking.experiment_name=lit",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs, curves = _trials(tmp_path, "lit")
    assert sorted(runs) == ["mb8-acc1-w2", "mb8-acc2-w1"]
    for key, run in runs.items():
        assert run.data.tags["sweeper.status"] == "ok", (key, run.data.tags.get("sweeper.error"))
        assert run.data.params["lightning_module"] == "tests.your_lightning.LitClassifier"
        metrics = run.data.metrics
        assert metrics["samples_per_second"] > 0 and metrics["memory_tracked_peak_bytes"] > 0
        assert metrics["val_accuracy"] > 0.25 and metrics["val_loss"] > 0  # validation_step's val_acc, val_loss
    assert len(curves["mb8-acc2-w1"]) == 16
    assert curves["mb8-acc1-w2"] == pytest.approx(curves["mb8-acc2-w1"], abs=1e-5)
