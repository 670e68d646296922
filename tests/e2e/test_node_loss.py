"""A node lost mid-point, for real: a Ray cluster of three `ray start` nodes on this machine (a head with
no CPUs for tasks, as KubeRay's, and two worker nodes of one CPU each), the node holding a point's worker
group killed (its raylet, object store and every process on it: the node's process group) while the
point trains. The point is retried on the surviving node and goes on from its last save on the way
(cluster.checkpoint_every_steps, in a folder both nodes read); the record holds every point once, nothing
RUNNING, and no placement group is left (Ray's state API)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_faults import COMMON, ENV
from tests.harness import mlflow_store, nothing_running, recorded, sleepy_model, start_head, stop_block, sweep_runs

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]

# The GCS declares a node dead after its health checks fail: Ray's defaults (every 3 s, 5 failures) take
# ~15 s; a test's cluster checks every 0.5 s.
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "1000",
                   "RAY_health_check_failure_threshold": "3"}
POINTS = ["sweep.micro_batch_sizes=[8,16]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
          "train.epochs=2", "cluster.checkpoint_every_steps=20"]
LOST = "mb16-acc1-w1"  # the second point: lost mid-way, after the first was recorded


def _start_nodes(folder: Path, head, count: int) -> list:
    nodes = []
    for i in range(count):
        node_folder = folder / f"n{i}"
        node_folder.mkdir()
        log = open(node_folder / "ray-start.log", "w")
        nodes.append(subprocess.Popen(head.node_command(node_folder, 1), env={**os.environ, **head.env},
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.time() + 180
    while head.alive_nodes() < count + 1:
        assert time.time() < deadline and all(n.poll() is None for n in nodes), "the worker nodes did not join"
        time.sleep(1)
    return nodes


def _node_holding(nodes: list, process: str):
    """The node (its `ray start` process) that started a process named `process`: one of its ancestors
    (the node's raylet) is in the node's process group."""
    groups = {node.pid: node for node in nodes}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if process in " ".join(p.info["cmdline"] or []):
                for ancestor in [p, *p.parents()]:
                    if os.getpgid(ancestor.pid) in groups:
                        return groups[os.getpgid(ancestor.pid)]
        except (psutil.Error, ProcessLookupError):
            pass
    return None


def _saves(results: Path) -> list:
    return sorted(results.glob(f"*/resume/{LOST}/s*/meta.json"), key=lambda p: int(p.parent.name[1:]))


def test_a_node_lost_mid_point_is_retried_on_the_survivor_from_its_last_save(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="swn-"))  # short: Ray's socket paths have a length limit
    head_proc, head = start_head(folder, num_cpus=0, env=FAST_NODE_DEATH)
    nodes = []
    try:
        nodes = _start_nodes(folder, head, 2)
        results = tmp_path / "ray" / "results"
        args = [*sleepy_model(), *COMMON, *POINTS, f"cluster.address={head.address}",
                f"tracking.uri={mlflow_store(tmp_path)}", f"cluster.ray_dir={tmp_path / 'ray'}"]
        log = tmp_path / "sweep.log"
        with open(log, "w") as out:
            sweep = subprocess.Popen([sys.executable, "-m", "sweeper", *args], cwd=tmp_path,
                                     env={**os.environ, **ENV, **head.env}, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 240
            second_began = None  # about when the second point started: the first one recorded
            while recorded(tmp_path / "mlflow.db", "mb") < 1 or not _saves(results):
                second_began = second_began or (time.time() if recorded(tmp_path / "mlflow.db", "mb") else None)
                assert sweep.poll() is None, log.read_text()[-3000:]
                assert time.time() < deadline, f"no save of the second point in time:\n{log.read_text()[-3000:]}"
                time.sleep(0.1)
            lost = _node_holding(nodes, "ray::ImplicitFunc")
            assert lost is not None, "no worker node holds the point's worker group"
            saved = _saves(results)[-1].parent
            # The node: its raylet, object store and agents (its process group), and the processes its raylet
            # started (in groups of their own).
            doomed = [p for p in psutil.Process(lost.pid).children(recursive=True)]
            os.killpg(lost.pid, signal.SIGKILL)
            for p in doomed:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            killed_at = time.time()
            lost.wait(timeout=30)
            sweep.wait(timeout=300)
            retried_after = time.time() - killed_at
            output = log.read_text()
        finally:
            if sweep.poll() is None:
                sweep.kill()
        assert sweep.returncode == 0, output[-3000:]
        parents, points = sweep_runs(tmp_path)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED" and nothing_running(tmp_path)
        assert Counter(t.data.tags["sweeper.trial_key"] for t in points) == Counter({"mb8-acc1-w1": 1, LOST: 1})
        assert all(t.data.tags["sweeper.status"] == "ok" for t in points)
        retried = next(t for t in points if t.data.tags["sweeper.trial_key"] == LOST)
        went_on = retried.data.tags["sweeper.continued_from"]
        # From a save on the way (the last one, or one written after it before the node went).
        assert went_on.startswith(str(saved.parent)) and int(Path(went_on).name[1:]) >= int(saved.name[1:])
        m = retried.data.metrics
        assert m["start_samples"] == int(Path(went_on).name[1:]) and m["worker_group_restarts"] == 1
        # Recorded whole: its steps and samples count from step 0, not from the save.
        assert m["samples_seen"] == 16 * m["optimizer_steps"] and m["optimizer_steps"] > m["start_samples"] // 16
        assert f"{LOST} went on from its save at" in output
        assert not (results / parents[0].info.run_name / "resume" / LOST).exists()  # the saves went with the point
        assert head.placement_groups() == []
        first_try = killed_at - (second_began or killed_at)
        print(f"node lost: the one holding {LOST}'s worker group, ~{first_try:.1f} s into the point; its last "
              f"save {saved.name}; retried from {Path(went_on).name} ({m['start_samples']:.0f} of "
              f"{m['samples_seen']:.0f} samples); recorded {retried_after:.1f} s after the loss; the retry's own "
              f"point time {m['trial_seconds']:.1f} s")
    finally:
        for node in nodes:
            stop_block(node)
        stop_block(head_proc)
        shutil.rmtree(folder, ignore_errors=True)
