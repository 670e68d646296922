"""Clusters and what they do to a sweep, for real: a 2-node Ray cluster on this machine, a worker
process killed with SIGKILL mid-trial, and the sweep's driver killed mid-sweep then resumed."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
# Ray's workers import the slow test model from this repository.
ENV = {"PYTHONPATH": str(REPO)}
# A model whose forward takes 20 ms per micro-batch, so a point lasts a few seconds: long enough to
# be interrupted in the middle.
SLEEPY = ["model=custom", "model._target_=tests.test_training.Sleepy", "model.input_shape=[1,8,8]"]
TINY_MLP = ["model=mlp", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]"]
COMMON = ["data=digits", "train.epochs=1", "measure.flops=false", "cluster.include_dashboard=false"]
THREE_POINTS = ["sweep.micro_batch_sizes=[8,16,32]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]"]


def _runs(tmp_path):
    db = tmp_path / "mlflow.db"
    if not db.exists():
        return [], []
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("sweeper")
    if exp is None:
        return [], []
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweeper.role") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("sweeper.role") == "trial"]
    return parents, trials


def _start(tmp_path, *overrides):
    return subprocess.Popen(
        [sys.executable, "-m", "sweeper", *overrides],
        cwd=tmp_path,
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _recorded_trials(tmp_path) -> int:
    # Plain SQL, read-only: an MLflow client here would race the sweep's own schema migration.
    try:
        with sqlite3.connect(f"file:{tmp_path / 'mlflow.db'}?mode=ro", uri=True) as db:
            return db.execute("select count(*) from tags where key='sweeper.role' and value='trial'").fetchone()[0]
    except sqlite3.Error:
        return 0


def _wait_for_trials(tmp_path, proc, count, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _recorded_trials(tmp_path) >= count:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(1)
    raise AssertionError("timed out waiting for a recorded trial")


def test_a_two_worker_trial_spans_two_nodes_of_a_ray_cluster(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        result = run_cli(
            *TINY_MLP, *COMMON, "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1]",
            "sweep.num_workers=[2]", f"cluster.address={cluster.address}", "cluster.placement_strategy=SPREAD",
            cwd=tmp_path,
        )
    finally:
        cluster.shutdown()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _, trials = _runs(tmp_path)
    assert len(trials) == 1
    m = trials[0].data.metrics
    assert trials[0].data.tags["sweeper.status"] == "ok"
    assert m["num_nodes"] == 2  # one worker on each node
    assert m["samples_per_second"] > 0 and "val_accuracy" in m


def test_a_worker_killed_mid_trial_is_restarted_and_each_point_recorded_once(tmp_path):
    proc = _start(tmp_path, *SLEEPY, *COMMON, *THREE_POINTS)
    try:
        _wait_for_trials(tmp_path, proc, 1)  # the first point is recorded: the group is on the second
        workers = [p for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])]
        assert workers, "no Ray Train worker process found"
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    _, trials = _runs(tmp_path)
    keys = Counter(t.data.tags["sweeper.trial_key"] for t in trials)
    assert keys == Counter({"mb8-acc1-w1": 1, "mb16-acc1-w1": 1, "mb32-acc1-w1": 1})  # none twice, none lost
    by_key = {t.data.tags["sweeper.trial_key"]: t for t in trials}
    assert all(t.data.tags["sweeper.status"] == "ok" for t in trials)
    assert by_key["mb8-acc1-w1"].data.metrics["worker_group_restarts"] == 0
    # The point that was running when its worker died was measured again after the restart.
    assert by_key["mb16-acc1-w1"].data.metrics["worker_group_restarts"] == 1
    assert by_key["mb32-acc1-w1"].data.metrics["worker_group_restarts"] == 1


def test_a_killed_sweep_resumes_under_the_same_run_without_rerunning_what_was_recorded(tmp_path):
    overrides = [*SLEEPY, *COMMON, *THREE_POINTS]
    proc = _start(tmp_path, *overrides)
    try:
        _wait_for_trials(tmp_path, proc, 1)
        proc.send_signal(signal.SIGKILL)  # the driver, as a lost laptop session or an OOM-killer would
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    parents, before = _runs(tmp_path)
    assert len(parents) == 1 and 1 <= len(before) < 3
    first = {t.data.tags["sweeper.trial_key"]: t.info.run_id for t in before}

    result = run_cli(*overrides, "sweep.resume=true", cwd=tmp_path, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resuming sweep-" in result.stdout
    parents, trials = _runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    keys = Counter(t.data.tags["sweeper.trial_key"] for t in trials)
    assert keys == Counter({"mb8-acc1-w1": 1, "mb16-acc1-w1": 1, "mb32-acc1-w1": 1})
    assert all(t.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for t in trials)
    for key, run_id in first.items():  # what was recorded before the kill is the same run, kept
        assert {t.data.tags["sweeper.trial_key"]: t.info.run_id for t in trials}[key] == run_id
    assert parents[0].data.metrics["num_trials_ok"] == 3


def test_resume_with_nothing_to_resume_is_a_clean_error(tmp_path):
    result = run_cli(*TINY_MLP, *COMMON, "sweep.resume=true", cwd=tmp_path, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: sweep.resume=true: no interrupted sweep")
