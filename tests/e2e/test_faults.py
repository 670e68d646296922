"""Clusters and what they do to a sweep, for real: a 2-node Ray cluster on this machine, a worker
process killed with SIGKILL mid-point, the frontier search and an inference sweep interrupted, a second
Ctrl-C, a tracking server that goes away mid-sweep, and a rank that stalls forever. After each:
nothing recorded twice, nothing lost, no run left RUNNING. A sweep on its default path stopped by
SIGTERM, Ctrl-C and SIGKILL and resumed each time is tests/e2e/test_resume.py."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest
import torch

from tests.harness import (SESSION_RAY, nothing_running, recorded, run_cli, sleepy_model,
                           start_sweep, sweep_runs, wait_while_running)
from tests.helpers import REPO

# Tests of a Ray the sweep started itself start their own (marked own_ray): a two-node cluster, signals
# to a driver that must also stop its Ray (a second Ctrl-C, the frontier and inference sweeps). A worker
# killed under a sweep and an MLflow server that goes away join the session's Ray, as does what follows
# (a resume), as a user resuming on their cluster does.
pytestmark = pytest.mark.e2e

# Ray's workers import the slow test model from this repository.
ENV = {"PYTHONPATH": str(REPO)}
TINY_MLP = ["model=mlp", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]"]
COMMON = ["optim=sgd", "data=digits", "train.epochs=1", "measure.flops=false", "cluster.include_dashboard=false"]
THREE_POINTS = ["sweep.micro_batch_sizes=[8,16,32]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]"]


def _wait_for_trials(tmp_path, proc, count, timeout=300):
    # complete points of the grid
    wait_while_running(proc, lambda: recorded(tmp_path / "mlflow.db", "mb") >= count, "a recorded trial", timeout,
                       every=0.2)


@pytest.mark.own_ray
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
        # With a cluster running here, cluster.address=null still starts a Ray of its own (ray.init
        # with no address would join the running one, and then refuse num_cpus).
        local = subprocess.run(
            [sys.executable, "-c", "import sys; from sweeper.cluster import connect; "
             "from sweeper.config import ClusterConfig; "
             "c = connect.connect(ClusterConfig(num_cpus=1, include_dashboard=False, ray_dir=sys.argv[1])); "
             "print(c.address); connect.shutdown()", str(tmp_path / "local")],
            capture_output=True, text=True, timeout=120, env={**os.environ, **ENV},
        )
    finally:
        cluster.shutdown()
    assert local.returncode == 0 and local.stdout.split()[-1] != cluster.address, local.stdout + local.stderr[-2000:]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _, trials = sweep_runs(tmp_path)
    assert len(trials) == 1
    m = trials[0].data.metrics
    assert trials[0].data.tags["sweeper.status"] == "ok"
    assert m["num_nodes"] == 2  # one worker on each node
    assert m["samples_per_second"] > 0 and "val_accuracy" in m


# A group of one worker runs in its Tune trial's process (Tune restarts it); a larger one is a Ray Train
# worker group (Ray Train restarts it). Both go on from the points they had reported. Two workers
# take half the micro-batch, so the points last as long (a few seconds: the kill lands mid-point).
KILLED_WORKER = {1: ("ray::ImplicitFunc", [8, 16, 32]), 2: ("RayTrainWorker", [4, 8, 16])}


def _workers_started_since(process: str, since: float) -> list:
    """The session Ray's processes named `process` started since `since`: this sweep's, not those of
    an earlier sweep still being cleaned up, nor any other Ray's on the machine."""
    found = []
    for p in SESSION_RAY.processes():
        try:
            if process in " ".join(p.cmdline()) and p.create_time() >= since:
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.parametrize("workers", sorted(KILLED_WORKER))
def test_a_worker_killed_mid_trial_is_restarted_and_each_point_recorded_once(tmp_path, workers):
    process, sizes = KILLED_WORKER[workers]
    points = [f"sweep.micro_batch_sizes={sizes}".replace(" ", ""), "sweep.accumulation_steps=[1]",
              f"sweep.num_workers=[{workers}]"]
    # On the session's Ray, as on a user's cluster: Ray's worker processes are the raylet's, not the
    # driver's, so the sweep's own are those started after it.
    proc = start_sweep(tmp_path, *sleepy_model(), *COMMON, *points, own_ray=False)
    since = time.time() - 1  # psutil's create_time is rounded to the clock tick
    try:
        _wait_for_trials(tmp_path, proc, 1)  # the first point is recorded: the group is on the second
        found = _workers_started_since(process, since)
        assert len(found) == workers, f"{workers} worker process(es) expected, found {found}"
        for worker in found:
            worker.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    _, trials = sweep_runs(tmp_path)
    first, running, last = (f"mb{m}-acc1-w{workers}" for m in sizes)
    keys = Counter(t.data.tags["sweeper.trial_key"] for t in trials)
    assert keys == Counter({first: 1, running: 1, last: 1})  # none twice, none lost
    by_key = {t.data.tags["sweeper.trial_key"]: t for t in trials}
    assert all(t.data.tags["sweeper.status"] == "ok" for t in trials)
    assert by_key[first].data.metrics["worker_group_restarts"] == 0
    # The point that was running when its worker died was measured again after the restart.
    assert by_key[running].data.metrics["worker_group_restarts"] == 1
    assert by_key[last].data.metrics["worker_group_restarts"] == 1
    assert SESSION_RAY.head.placement_groups(of_ended_jobs=True) == []  # the restarted group's too


def test_resume_with_nothing_to_resume_is_a_clean_error_before_ray_starts(tmp_path):
    # Without cluster.address: the sweep would start a local Ray of its own, in .sweeper/ray.
    result = run_cli(*TINY_MLP, *COMMON, "sweep.resume=true", cwd=tmp_path, timeout=300, own_ray=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: sweep.resume=true: no unfinished sweep")
    assert not (tmp_path / ".sweeper" / "ray").exists()  # refused before Ray started


POINT_KEYS = Counter({"mb8-acc1-w1": 1, "mb16-acc1-w1": 1, "mb32-acc1-w1": 1})


def _interrupt(tmp_path, overrides, signum, ready):
    """Start a sweep with a Ray of its own and send `signum` to its driver once `ready(tmp_path)`; its
    output and exit status."""
    proc = start_sweep(tmp_path, *overrides)
    try:
        wait_while_running(proc, lambda: ready(tmp_path), "the sweep to get going", every=0.2)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return output, proc.returncode


def _tune_started(folder):
    """Ray Tune made the sweep's experiment folder: Ray is up, the parent run open, a worker group starting."""
    results = folder / ".sweeper" / "ray" / "results"
    return results.exists() and any(results.iterdir())


def _training(folder):
    """The sweep's first point is training: sleepy_model(folder / "started") made its file."""
    return (folder / "started").exists()


@pytest.mark.own_ray
def test_interrupting_the_frontier_search_or_an_inference_sweep_ends_it_killed(tmp_path):
    frontier = tmp_path / "frontier"
    frontier.mkdir()
    output, status = _interrupt(frontier, [*TINY_MLP, *COMMON, "sweep.micro_batch_sizes=auto",
                                           "device.memory_budget_gb=0.01"], signal.SIGINT, _tune_started)
    assert status == 130 and "Traceback" not in output, output[-3000:]
    (parent,), _ = sweep_runs(frontier)
    assert parent.info.status == "KILLED" and nothing_running(frontier)

    inference = tmp_path / "inference"
    inference.mkdir()
    output, status = _interrupt(inference, ["+experiment=inference_batch", "model.depth=2", "model.width=64",
                                            "inference.batch_sizes=[1,2,4,8,16,32,64,128]", "inference.timed_runs=2000",
                                            "cluster.include_dashboard=false"], signal.SIGTERM, _tune_started)
    assert status == 143 and "Traceback" not in output, output[-3000:]
    (parent,), _ = sweep_runs(inference)
    assert parent.info.status == "KILLED" and nothing_running(inference)


@pytest.mark.own_ray
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    proc = start_sweep(tmp_path, *sleepy_model(tmp_path / "started"), *COMMON, *THREE_POINTS)
    try:
        wait_while_running(proc, lambda: _training(tmp_path), "the first point to train", every=0.2)
        proc.send_signal(signal.SIGINT)
        # A gap between the two, so they stay two signals: not a wait for anything the driver shows.
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)  # no cleanup waited for: it ended within seconds
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130


class Stalls(torch.nn.Module):
    """A model whose forward never returns on a 16-sample micro-batch: a rank stalled without dying
    (a hung DataLoader, NFS, GPU), simulated."""

    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        while x.shape[0] == 16 and self.training:
            time.sleep(1)
        return self.linear(x.flatten(1))


def test_a_rank_that_stalls_forever_fails_its_point_at_the_deadline_and_the_others_are_measured(tmp_path):
    result = run_cli(
        "model=custom", "model._target_=tests.e2e.test_faults.Stalls", "model.input_shape=[1,8,8]", *COMMON,
        *THREE_POINTS, "measure.memory_breakdown=false", "cluster.point_timeout_seconds=10",
        cwd=tmp_path, env=ENV, timeout=600,
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # a point failed
    parents, points = sweep_runs(tmp_path)
    status = {t.data.tags["sweeper.trial_key"]: t.data.tags["sweeper.status"] for t in points}
    assert status == {"mb8-acc1-w1": "ok", "mb16-acc1-w1": "failed", "mb32-acc1-w1": "ok"}
    error = next(t.data.tags["sweeper.error"] for t in points if t.data.tags["sweeper.trial_key"] == "mb16-acc1-w1")
    assert "ended its worker group 2 times" in error
    assert parents[0].info.status == "FAILED" and nothing_running(tmp_path)


def _mlflow_server(tmp_path, port):
    return subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--default-artifact-root", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # MLflow 3's job runner (six huey consumers, ~1 GB) serves GenAI jobs a sweep never submits.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )


def _wait_healthy(uri, timeout=120):
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError("the mlflow server did not come up")


def _stop(server):
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=60)


def test_a_tracking_server_that_goes_away_mid_sweep_loses_nothing(tmp_path):
    from tests.harness import free_port

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    overrides = [*sleepy_model(tmp_path / "started"), *COMMON, *THREE_POINTS, f"tracking.uri={uri}"]
    server = _mlflow_server(tmp_path, port)
    journal = tmp_path / ".sweeper" / "journal"
    try:
        _wait_healthy(uri)
        proc = start_sweep(tmp_path, *overrides, own_ray=False)  # the MLflow server goes away, not Ray
        try:
            wait_while_running(proc, lambda: _training(tmp_path), "the first point to train", every=0.2)
            _stop(server)  # gone while the first point runs, and for the rest of the sweep
            output, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        # Every point was measured; their writes wait in the journal, and the sweep says so.
        assert proc.returncode == 1 and "Traceback" not in output, output[-3000:]
        assert "kept in" in output and "sweep.resume=true" in output
        assert journal.exists() and any(journal.iterdir())

        server = _mlflow_server(tmp_path, port)
        _wait_healthy(uri)
        result = run_cli(*overrides, "sweep.resume=true", cwd=tmp_path, env=ENV)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "recorded now" in result.stdout  # the journal's writes, replayed
        parents, points = sweep_runs(tmp_path, uri)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert Counter(t.data.tags["sweeper.trial_key"] for t in points) == POINT_KEYS
        assert nothing_running(tmp_path, uri) and not any(journal.iterdir())
    finally:
        if server.poll() is None:
            _stop(server)
