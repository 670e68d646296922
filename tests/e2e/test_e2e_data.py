"""Streamed data through the CLI on the session's Ray: a team's own IterableDataset over shard files swept
over layouts of one global batch, on one worker and two, with a loader worker, each point in a fresh worker
group; the data factory runs once (in the driver: every group fetches its copy), every layout trains the same
loss curve (the same samples at every step, across the epoch boundary), and every point records its
data_wait_fraction."""

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.harness import run_cli
from tests.unit.test_streaming import ShardFiles, write_shards

pytestmark = pytest.mark.e2e


def counted_stream(folder: str, log: str):
    """The data factory: the team's stream, each call a line in `log` (driver and workers alike write it)."""
    with open(log, "a") as f:
        f.write("called\n")
    return ShardFiles(folder), None


def test_a_streamed_dataset_is_swept_built_once_and_trains_alike_at_every_layout(tmp_path):
    folder, log = write_shards(tmp_path / "shards"), tmp_path / "factory_calls"
    result = run_cli(
        "model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]", "optim=sgd", "optim.lr=0.01",
        "data=custom", "data._target_=tests.e2e.test_e2e_data.counted_stream", f"+data.kwargs.folder={folder}",
        f"+data.kwargs.log={log}", "data.loader_workers=1", "train.samples=2400", "measure.warmup_steps=3",
        "measure.windows=3", "sweep.micro_batch_sizes=[4,8]", "sweep.accumulation_steps=[1,2]",
        "sweep.num_workers=[1,2]", "sweep.global_batch_sizes=[8]", "sweep.points_per_worker_group=1",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert log.read_text().splitlines() == ["called"]  # the check's call; preflight and 3 groups reused it
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweeper").experiment_id], max_results=100)
    children = [r for r in runs if r.data.tags.get("sweeper.role") == "trial"]
    assert {r.data.params["point"] for r in children} == {"mb8-acc1-w1", "mb4-acc2-w1", "mb4-acc1-w2"}
    curves = {}
    for run in children:
        assert run.data.tags["sweeper.status"] == "ok" and 0 <= run.data.metrics["data_wait_fraction"] < 1
        history = sorted(client.get_metric_history(run.info.run_id, "train_loss"), key=lambda m: m.step)
        curves[run.data.params["point"]] = torch.tensor([m.value for m in history], dtype=torch.float64)
    assert len(curves["mb8-acc1-w1"]) == 300  # 2,400 samples: past the 2,000 of the first epoch
    for key, curve in curves.items():
        torch.testing.assert_close(curve, curves["mb8-acc1-w1"], rtol=1e-5, atol=1e-6, msg=key)
