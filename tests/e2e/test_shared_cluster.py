"""Two sweeps, one cluster, one tracking store, for real: two sweeps of the same model and data started
together against one `ray start --head` (cluster.address), one cluster.ray_dir and one MLflow store. The
first to hold the cluster is interrupted (Ctrl-C) once it recorded a point; the other, which waited for
the cluster and said so, then runs and finishes. Names never collide, every point is recorded once under
its own sweep, nothing is left RUNNING, and no placement group is left (Ray's state API)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.test_faults import COMMON, ENV
from tests.harness import mlflow_store, sleepy_model, start_head, stop_block

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]

POINTS = ["sweep.micro_batch_sizes=[8,16]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]"]


def _points_by_sweep(uri: str) -> dict:
    """{parent run name: (its status, [its complete points' keys], its optim.lr)} of the store."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sweeper")
    if exp is None:
        return {}
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.info.run_id: r for r in runs if r.data.tags.get("sweeper.role") == "sweep"}
    out = {r.info.run_name: (r.info.status, [], float(r.data.params["base_lr"])) for r in parents.values()}
    for r in runs:
        parent = parents.get(r.data.tags.get("mlflow.parentRunId"))
        if parent is not None and "sweeper.trial_key" in r.data.tags:
            out[parent.info.run_name][1].append(r.data.tags["sweeper.trial_key"])
    return out


def test_two_sweeps_share_a_cluster_and_a_store_and_ctrl_c_on_one_leaves_the_other(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="sws-"))  # short: Ray's socket paths have a length limit
    head_proc, head = start_head(folder, num_cpus=2)
    sweeps = []
    try:
        uri = mlflow_store(tmp_path)
        shared = [*sleepy_model(), *COMMON, *POINTS, f"cluster.address={head.address}", f"tracking.uri={uri}",
                  f"cluster.ray_dir={tmp_path / 'ray'}"]
        # Two people's folders and experiments (their optim.lr tells them apart), one cluster, one Ray folder,
        # one store.
        for who, lr in (("a", 0.05), ("b", 0.06)):
            (tmp_path / who).mkdir()
            with open(tmp_path / f"{who}.log", "w") as out:
                sweeps.append(subprocess.Popen([sys.executable, "-m", "sweeper", *shared, f"optim.lr={lr}"],
                                               cwd=tmp_path / who,
                                               env={**os.environ, **ENV, **head.env}, stdout=out,
                                               stderr=subprocess.STDOUT))
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        deadline = time.time() + 300
        while True:  # the sweep that holds the cluster first records a point
            by_sweep = _points_by_sweep(uri)
            running = [name for name, (_, keys, _) in by_sweep.items() if keys]
            if running:
                break
            assert all(s.poll() is None for s in sweeps), [log.read_text()[-2000:] for log in logs]
            assert time.time() < deadline, [log.read_text()[-2000:] for log in logs]
            time.sleep(0.5)
        first = [0.05, 0.06].index(by_sweep[running[0]][2])
        sweeps[first].send_signal(signal.SIGINT)
        stopped_at = time.time()
        statuses = [s.wait(timeout=400) for s in sweeps]
        outputs = [log.read_text() for log in logs]
        other = 1 - first
        assert statuses[first] == 130 and statuses[other] == 0, [o[-3000:] for o in outputs]
        by_sweep = _points_by_sweep(uri)
        assert len(by_sweep) == 2  # two parent runs, two names: neither sweep wrote into the other's
        stopped, finished = by_sweep[running[0]], next(v for k, v in by_sweep.items() if k != running[0])
        assert stopped[0] == "KILLED" and finished[0] == "FINISHED"
        assert Counter(finished[1]) == Counter({"mb8-acc1-w1": 1, "mb16-acc1-w1": 1})
        assert len(set(stopped[1])) == len(stopped[1]) >= 1
        # The one that waited said so (when it planned, or while its worker group waited to be placed), when it
        # was up 10 s before the other stopped (on a loaded machine its start can come after the stop).
        began = MlflowClient(uri).search_runs(
            [MlflowClient(uri).get_experiment_by_name("sweeper").experiment_id],
            filter_string="tags.`sweeper.role` = 'sweep'", max_results=10)
        began = {r.info.run_name: r.info.start_time / 1000 for r in began}
        survivor = next(k for k in by_sweep if k != running[0])
        if began[survivor] < stopped_at - 15:
            said = ("the Ray cluster is busy", "for the Ray cluster: other work holds")
            assert any(line in outputs[other] for line in said), outputs[other][-3000:]
        experiments = sorted(p.name for p in (tmp_path / "ray" / "results").iterdir() if p.is_dir())
        assert experiments == sorted(by_sweep)  # one Tune experiment folder each
        assert not any(status == "RUNNING" for status, _, _ in by_sweep.values())
        assert head.placement_groups() == []
    finally:
        for s in sweeps:
            if s.poll() is None:
                s.kill()
        stop_block(head_proc)
        shutil.rmtree(folder, ignore_errors=True)
