"""Your step and your batches through the CLI, on the session's Ray, read back from MLflow: token sequences padded
per batch by your collate, your step's summed loss over the tokens that are not padding, a cosine schedule and
clipping; two layouts of one global batch record one loss curve, the recipe as params and your step's figure.
(The Hugging Face sequence classifier with its evaluation is the lead's e2e test, after issue 54's parts merge.)"""

import pytest
from mlflow.tracking import MlflowClient

from tests.harness import run_cli

pytestmark = pytest.mark.e2e


def test_your_step_and_padded_batches_train_one_curve_per_global_batch_through_the_cli(tmp_path):
    result = run_cli(
        "model=custom", "model._target_=tests.your_training.token_net", "model.checkpoint_modules=[Block]",
        "data=custom", "data._target_=tests.your_training.token_data", "data.num_classes=16",
        "data.collate_fn=tests.your_training.pad_collate", "train.step_fn=tests.your_training.token_step_counted",
        "train.lr_schedule=cosine", "train.min_lr_ratio=0.1", "train.warmup_steps=2", "train.grad_clip_norm=1.02",
        "train.samples=256", "optim=adamw", "optim.lr=0.01", "sweep.micro_batch_sizes=[8,16]",
        "sweep.accumulation_steps=[1,2]", "sweep.global_batch_sizes=[16]", "measure.warmup_steps=2",
        "measure.windows=3", "tracking.experiment_name=yours", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FLOPs (MFU) and the fake-tensor memory estimate are skipped: the loss is your step's" in result.stdout
    assert "could not be built" not in result.stdout and "warning: FLOPs not counted" not in result.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("yours")
    runs = [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("sweeper.role") == "trial"]
    assert sorted(r.data.tags["sweeper.trial_key"] for r in runs) == ["mb16-acc1-w1", "mb8-acc2-w1"]
    curves = []
    for run in runs:
        assert run.data.tags["sweeper.status"] == "ok", run.data.tags.get("sweeper.error")
        params, metrics = run.data.params, run.data.metrics
        assert {k: params[k] for k in ("lr_schedule", "min_lr_ratio", "warmup_steps", "grad_clip_norm", "no_decay",
                                       "betas", "eps", "weight_decay", "step_fn", "collate_fn")} == {
            "lr_schedule": "cosine", "min_lr_ratio": "0.1", "warmup_steps": "2", "grad_clip_norm": "1.02",
            "no_decay": "bias,norm", "betas": "0.9,0.999", "eps": "1e-08", "weight_decay": "0.01",
            "step_fn": "tests.your_training.token_step_counted", "collate_fn": "tests.your_training.pad_collate"}
        assert "momentum" not in params  # AdamW's recipe has none
        assert 0 <= metrics["step_metric_accuracy"] <= 1 and metrics["items_per_second"] > 0
        assert 0 < metrics["grad_clipped_steps"] < 16
        curves.append([m.value for m in sorted(client.get_metric_history(run.info.run_id, "train_loss"),
                                               key=lambda m: m.step)])
    assert runs[0].data.metrics["items_seen"] == runs[1].data.metrics["items_seen"]
    assert len(curves[0]) == 16 and curves[0] == pytest.approx(curves[1], abs=1e-5)
