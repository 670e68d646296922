"""Clusters and what they do to a sweep, for real: a 2-node Ray cluster on this machine, a worker
process killed with SIGKILL mid-point, the sweep's driver killed, interrupted (SIGINT, SIGTERM) and
resumed, a tracking server that goes away mid-sweep, and a rank that stalls forever. After each:
nothing recorded twice, nothing lost, no run left RUNNING."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.harness import SESSION_RAY, joined_process, recorded, run_cli, seed_default_store
from tests.helpers import REPO

# Tests of a Ray the sweep started itself start their own (marked own_ray): a two-node cluster, signals
# to a driver that must also stop its Ray (SIGTERM, a second Ctrl-C, the frontier and inference
# sweeps). A worker killed under a sweep, a killed or interrupted driver on a cluster it joined, and an
# MLflow server that goes away, join the session's Ray, as does what follows every fault (a resume, a
# refusal), as a user resuming on their cluster does.
pytestmark = pytest.mark.e2e

# Ray's workers import the slow test model from this repository.
ENV = {"PYTHONPATH": str(REPO)}
# A model whose forward takes 20 ms per micro-batch, so a point lasts a few seconds: long enough to
# be interrupted in the middle.
SLEEPY = ["model=custom", "model._target_=tests.unit.test_training.Sleepy", "model.input_shape=[1,8,8]"]
TINY_MLP = ["model=mlp", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]"]
COMMON = ["optim=sgd", "data=digits", "train.epochs=1", "measure.flops=false", "cluster.include_dashboard=false"]
THREE_POINTS = ["sweep.micro_batch_sizes=[8,16,32]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]"]


def _runs(tmp_path, uri=None):
    """The sweeps' parent runs and their complete points (a half-written run is not a point)."""
    db = tmp_path / "mlflow.db"
    if uri is None and not db.exists():
        return [], []
    client = MlflowClient(uri or f"sqlite:///{db}")
    exp = client.get_experiment_by_name("sweeper")
    if exp is None:
        return [], []
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweeper.role") == "sweep"]
    points = [r for r in runs if r.data.tags.get("sweeper.role") == "trial" and "sweeper.trial_key" in r.data.tags]
    return parents, points


def _nothing_running(tmp_path, uri=None):
    client = MlflowClient(uri or f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeper")
    return [r.info.run_name for r in client.search_runs([exp.experiment_id], max_results=1000)
            if r.info.status == "RUNNING"] == []


def _start(tmp_path, *overrides, own_ray=True, env=None):
    """The sweep as a process of its own, to signal or kill. Its own Ray by default (these tests signal
    a driver that must also stop the Ray it started); own_ray=False joins the session's."""
    if not own_ray:
        return joined_process(overrides, tmp_path, env or ENV)
    args, env = list(overrides), {**os.environ, **(env or ENV)}
    seed_default_store(args, tmp_path)
    return subprocess.Popen(
        [sys.executable, "-m", "sweeper", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _end_processes_in(folder):
    """End what a killed driver left running (Ray's agents, which outlive their raylet for a while):
    the processes whose working folder is the test's, by id, never `ray stop` (it would end every Ray
    on the machine)."""
    mine = []
    for process in psutil.process_iter(["pid", "cwd"]):
        cwd = process.info.get("cwd") or ""
        if process.pid != os.getpid() and (cwd == str(folder) or cwd.startswith(f"{folder}{os.sep}")):
            mine.append(process)
    for process in mine:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(mine, timeout=10)


def _wait_until(proc, done, what, timeout=300, every=1.0):
    """Until done() is true; fails if the sweep ends first or `timeout` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if done():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _wait_for_trials(tmp_path, proc, count, timeout=300):
    # complete points of the grid
    _wait_until(proc, lambda: recorded(tmp_path / "mlflow.db", "mb") >= count, "a recorded trial", timeout)


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
    _, trials = _runs(tmp_path)
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
    proc = _start(tmp_path, *SLEEPY, *COMMON, *points, own_ray=False)
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
    _, trials = _runs(tmp_path)
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


@pytest.mark.own_ray
def test_a_killed_sweep_resumes_under_the_same_run_without_rerunning_what_was_recorded(tmp_path):
    # The default path: a local Ray the sweep starts itself (its token in .sweeper/ray), killed with its
    # driver and started again by the resume. Ray's dashboard and runtime-env agents outlive a killed
    # driver for a while; the resume's Ray starts beside them, and they are ended by id at the end.
    overrides = [*SLEEPY, *COMMON, *THREE_POINTS]
    home = tmp_path / "home"
    home.mkdir()
    env = {**ENV, "HOME": str(home)}
    proc = _start(tmp_path, *overrides, env=env)
    try:
        _wait_for_trials(tmp_path, proc, 1)
        proc.send_signal(signal.SIGKILL)  # the driver, as a lost laptop session or an OOM-killer would
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        _killed_then_resumed(tmp_path, overrides, env)
    finally:
        _end_processes_in(tmp_path)
    assert list(home.iterdir()) == []  # no token or results in the user's home


def _killed_then_resumed(tmp_path, overrides, env):
    parents, before = _runs(tmp_path)
    assert len(parents) == 1 and 1 <= len(before) < 3
    first = {t.data.tags["sweeper.trial_key"]: t.info.run_id for t in before}
    result, parents, trials = _resumed_to_the_end(tmp_path, overrides, env)
    assert "resuming sweep-" in result.stdout
    assert all(t.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for t in trials)
    for key, run_id in first.items():  # what was recorded before the kill is the same run, kept
        assert {t.data.tags["sweeper.trial_key"]: t.info.run_id for t in trials}[key] == run_id


def test_resume_with_nothing_to_resume_is_a_clean_error_before_ray_starts(tmp_path):
    # Without cluster.address: the sweep would start a local Ray of its own, in .sweeper/ray.
    result = run_cli(*TINY_MLP, *COMMON, "sweep.resume=true", cwd=tmp_path, timeout=300, own_ray=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: sweep.resume=true: no unfinished sweep")
    assert not (tmp_path / ".sweeper" / "ray").exists()  # refused before Ray started


POINT_KEYS = Counter({"mb8-acc1-w1": 1, "mb16-acc1-w1": 1, "mb32-acc1-w1": 1})


def _interrupt(tmp_path, overrides, signum, after_points, own_ray=True):
    """Start a sweep, send `signum` to its driver once `after_points` points are recorded (0: as
    soon as it has started measuring); its output and exit status."""
    proc = _start(tmp_path, *overrides, own_ray=own_ray)
    try:
        if after_points:
            _wait_for_trials(tmp_path, proc, after_points)
        else:
            _wait_for_output_dir(tmp_path, proc)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return output, proc.returncode


def _wait_for_output_dir(tmp_path, proc, timeout=300):
    """Until the sweep's worker groups have started (Ray Tune made its experiment folder)."""
    results = tmp_path / ".sweeper" / "ray" / "results"
    _wait_until(proc, lambda: results.exists() and any(results.iterdir()), "the sweep to start", timeout, every=0.5)
    time.sleep(3)  # into its first point


@pytest.mark.own_ray
def test_an_interrupted_sweep_ends_killed_and_its_resume_loses_and_repeats_nothing(tmp_path):
    # The default path: Ctrl-C to a sweep that started its own local Ray, then the README's resume,
    # which starts a local Ray again (its token set before a resume's check imports Ray Tune).
    overrides = [*SLEEPY, *COMMON, *THREE_POINTS]
    output, status = _interrupt(tmp_path, overrides, signal.SIGINT, 1)  # mid-grid
    assert status == 130, output[-3000:]
    assert "sweep.resume=true" in output and "Traceback" not in output
    (killed,), before = _runs(tmp_path)
    assert killed.info.status == "KILLED" and len(before) < 3
    assert "sweeper.recommendation" not in killed.data.tags  # no answer claimed for a grid that did not finish
    assert _nothing_running(tmp_path)

    # Another experiment is refused before anything is touched, naming what differs.
    other = run_cli(*overrides, "optim.lr=0.2", "sweep.resume=true", cwd=tmp_path, env=ENV, timeout=300,
                    own_ray=True)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "optim.lr: 0.05 -> 0.2" in other.stderr  # the differing key named, values both ways
    (still,), _ = _runs(tmp_path)
    assert still.info.status == "KILLED" and still.data.metrics == killed.data.metrics

    _resumed_to_the_end(tmp_path, overrides)
    again = run_cli(*overrides, "sweep.resume=true", cwd=tmp_path, env=ENV, timeout=300, own_ray=True)
    assert again.returncode == 2 and "finished" in again.stderr  # a FINISHED sweep is never reopened


def _resumed_to_the_end(tmp_path, overrides, env=ENV):
    """sweep.resume=true on a local Ray finishes the sweep: every point once, nothing RUNNING. The
    resume's result, the sweep's parent runs and its points."""
    result = run_cli(*overrides, "sweep.resume=true", cwd=tmp_path, env=env, own_ray=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    parents, points = _runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert Counter(t.data.tags["sweeper.trial_key"] for t in points) == POINT_KEYS
    assert all(t.data.tags["sweeper.status"] == "ok" for t in points)
    assert parents[0].data.metrics["num_trials_ok"] == 3 and _nothing_running(tmp_path)
    return result, parents, points


@pytest.mark.own_ray
def test_sigterm_at_the_first_point_ends_the_sweep_killed_and_it_resumes(tmp_path):
    overrides = [*SLEEPY, *COMMON, *THREE_POINTS]
    output, status = _interrupt(tmp_path, overrides, signal.SIGTERM, 0)
    assert status == 143 and "Traceback" not in output, output[-3000:]
    (parent,), _ = _runs(tmp_path)
    assert parent.info.status == "KILLED" and _nothing_running(tmp_path)
    _resumed_to_the_end(tmp_path, overrides)


@pytest.mark.own_ray
def test_interrupting_the_frontier_search_or_an_inference_sweep_ends_it_killed(tmp_path):
    frontier = tmp_path / "frontier"
    frontier.mkdir()
    output, status = _interrupt(frontier, [*TINY_MLP, *COMMON, "sweep.micro_batch_sizes=auto",
                                           "device.memory_budget_gb=0.01"], signal.SIGINT, 0)
    assert status == 130 and "Traceback" not in output, output[-3000:]
    (parent,), _ = _runs(frontier)
    assert parent.info.status == "KILLED" and _nothing_running(frontier)

    inference = tmp_path / "inference"
    inference.mkdir()
    output, status = _interrupt(inference, ["+experiment=inference_batch", "model.depth=2", "model.width=64",
                                            "inference.batch_sizes=[1,2,4,8,16,32,64,128]", "inference.timed_runs=2000",
                                            "cluster.include_dashboard=false"], signal.SIGTERM, 0)
    assert status == 143 and "Traceback" not in output, output[-3000:]
    (parent,), _ = _runs(inference)
    assert parent.info.status == "KILLED" and _nothing_running(inference)


@pytest.mark.own_ray
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    proc = _start(tmp_path, *SLEEPY, *COMMON, *THREE_POINTS)
    try:
        _wait_for_output_dir(tmp_path, proc)
        proc.send_signal(signal.SIGINT)
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
    parents, points = _runs(tmp_path)
    status = {t.data.tags["sweeper.trial_key"]: t.data.tags["sweeper.status"] for t in points}
    assert status == {"mb8-acc1-w1": "ok", "mb16-acc1-w1": "failed", "mb32-acc1-w1": "ok"}
    error = next(t.data.tags["sweeper.error"] for t in points if t.data.tags["sweeper.trial_key"] == "mb16-acc1-w1")
    assert "ended its worker group 2 times" in error
    assert parents[0].info.status == "FAILED" and _nothing_running(tmp_path)


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
    overrides = [*SLEEPY, *COMMON, *THREE_POINTS, f"tracking.uri={uri}"]
    server = _mlflow_server(tmp_path, port)
    journal = tmp_path / ".sweeper" / "journal"
    try:
        _wait_healthy(uri)
        proc = _start(tmp_path, *overrides, own_ray=False)  # the MLflow server goes away, not Ray
        try:
            _wait_for_output_dir(tmp_path, proc)
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
        parents, points = _runs(tmp_path, uri)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert Counter(t.data.tags["sweeper.trial_key"] for t in points) == POINT_KEYS
        assert _nothing_running(tmp_path, uri) and not any(journal.iterdir())
    finally:
        if server.poll() is None:
            _stop(server)
