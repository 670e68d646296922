"""A sweep on its default path, a local Ray it starts itself as a new user runs it, stopped three ways
and resumed each time, under one run: SIGTERM while its first point trains, Ctrl-C mid-grid, its driver
killed with SIGKILL (a lost laptop session, the OOM-killer), then the resume that finishes it. Every
resume starts a local Ray again, its token set before the resume's check imports Ray Tune (issue 44).

One sweep whose record every test here reads (the module fixture `stopped_three_ways`, built once:
tests/scheduling.py keeps this file on one worker); each test checks what its stop must leave and that
the resume after it went on. Three sweeps of their own, each stopped once and resumed, took 170 s here;
the one sweep stopped three times takes about 100 s.
"""

import signal
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import pytest

from tests.harness import (end_processes_in, nothing_running, recorded, run_cli, sleepy_model, start_sweep,
                           sweep_runs, wait_while_running)
from tests.helpers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]

COMMON = ["optim=sgd", "data=digits", "train.epochs=1", "measure.flops=false", "cluster.include_dashboard=false"]
# Four points of ~180 forwards of 20 ms each (1437 digits at micro-batch 8): ~4 s apiece, long enough for
# each stop to land inside a point, and enough of them for a point to be left after each stop.
POINTS = ["sweep.micro_batch_sizes=[8]", "sweep.accumulation_steps=[1,2,4,8]", "sweep.num_workers=[1]"]
POINT_KEYS = Counter({f"mb8-acc{a}-w1": 1 for a in (1, 2, 4, 8)})


@dataclass
class Stop:
    """One stop of the sweep: the driver's exit status and output, and the store right after it."""

    status: int
    output: str
    parents: list
    points: list
    nothing_running: Optional[bool]


def _stop(folder, overrides, env, signum, after_points: int) -> Stop:
    """Start (or resume) the sweep and send `signum` to its driver once `after_points` points are
    recorded, or with 0 once its first point trains."""
    db = folder / "mlflow.db"

    def due():
        return recorded(db, "mb") >= after_points if after_points else (folder / "started").exists()

    proc = start_sweep(folder, *overrides, env=env)
    try:
        wait_while_running(proc, due, f"{after_points} recorded point(s) or a training one", every=0.2)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    parents, points = sweep_runs(folder)
    # A killed driver leaves its runs as they were (the resume ends them): nothing to check there.
    return Stop(proc.returncode, output, parents, points, None if signum == signal.SIGKILL else nothing_running(folder))


@pytest.fixture(scope="module")
def stopped_three_ways(tmp_path_factory):
    """The sweep's record after each stop and each resume, run once for every test of this file."""
    folder = tmp_path_factory.mktemp("resumed")
    home = folder / "home"
    home.mkdir()
    env = {"PYTHONPATH": str(REPO), "HOME": str(home)}  # Ray's workers import Sleepy; nothing may land in $HOME
    overrides = [*sleepy_model(folder / "started"), *COMMON, *POINTS]
    resume = [*overrides, "sweep.resume=true"]
    record = {}
    try:
        record["sigterm"] = _stop(folder, overrides, env, signal.SIGTERM, 0)
        record["ctrl_c"] = _stop(folder, resume, env, signal.SIGINT, 1)
        # Another experiment is refused before anything is touched.
        record["other"] = run_cli(*overrides, "optim.lr=0.2", "sweep.resume=true", cwd=folder, env=env, timeout=300,
                                  own_ray=True)
        record["after_other"] = sweep_runs(folder)
        # Killed once the resume has recorded a point of its own.
        record["sigkill"] = _stop(folder, resume, env, signal.SIGKILL, len(record["ctrl_c"].points) + 1)
        record["finished"] = run_cli(*resume, cwd=folder, env=env, own_ray=True)
        record["end"] = (*sweep_runs(folder), nothing_running(folder))
        record["again"] = run_cli(*resume, cwd=folder, env=env, timeout=300, own_ray=True)
        record["home"] = sorted(p.name for p in home.iterdir())
    finally:
        end_processes_in(folder)  # Ray's agents outlive a killed driver for a while
    return record


def _keys(points) -> Counter:
    return Counter(t.data.tags["sweeper.trial_key"] for t in points)


def test_sigterm_at_the_first_point_ends_the_sweep_killed_and_it_resumes(stopped_three_ways):
    stop = stopped_three_ways["sigterm"]
    assert stop.status == 143 and "Traceback" not in stop.output, stop.output[-3000:]
    (parent,) = stop.parents
    assert parent.info.status == "KILLED" and stop.points == [] and stop.nothing_running
    # The resume after it took the same run up again.
    assert "resuming sweep-" in stopped_three_ways["ctrl_c"].output
    assert [p.info.run_id for p in stopped_three_ways["ctrl_c"].parents] == [parent.info.run_id]


def test_an_interrupted_sweep_ends_killed_and_its_resume_loses_and_repeats_nothing(stopped_three_ways):
    stop = stopped_three_ways["ctrl_c"]
    assert stop.status == 130, stop.output[-3000:]
    assert "sweep.resume=true" in stop.output and "Traceback" not in stop.output
    (killed,) = stop.parents
    assert killed.info.status == "KILLED" and 1 <= len(stop.points) < 4 and stop.nothing_running
    assert "sweeper.recommendation" not in killed.data.tags  # no answer claimed for a grid that did not finish
    # Another experiment is refused before anything is touched, naming what differs.
    other = stopped_three_ways["other"]
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "optim.lr: 0.05 -> 0.2" in other.stderr  # the differing key named, values both ways
    (still,), _ = stopped_three_ways["after_other"]
    assert still.info.status == "KILLED" and still.data.metrics == killed.data.metrics
    # A FINISHED sweep is never reopened.
    again = stopped_three_ways["again"]
    assert again.returncode == 2 and "finished" in again.stderr


def test_a_killed_sweep_resumes_under_the_same_run_without_rerunning_what_was_recorded(stopped_three_ways):
    stop = stopped_three_ways["sigkill"]
    assert stop.status == -signal.SIGKILL
    (parent,) = stop.parents
    assert len(stopped_three_ways["ctrl_c"].points) < len(stop.points) < 4
    finished = stopped_three_ways["finished"]
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "resuming sweep-" in finished.stdout
    parents, points, _ = stopped_three_ways["end"]
    assert [p.info.run_id for p in parents] == [parent.info.run_id]
    assert all(t.data.tags["mlflow.parentRunId"] == parent.info.run_id for t in points)
    now = {t.data.tags["sweeper.trial_key"]: t.info.run_id for t in points}
    for before in stop.points:  # what was recorded before the kill is the same run, kept
        assert now[before.data.tags["sweeper.trial_key"]] == before.info.run_id
    assert stopped_three_ways["home"] == []  # no token or results in the user's home


def test_the_last_resume_finishes_the_sweep_with_every_point_once(stopped_three_ways):
    parents, points, nothing_left = stopped_three_ways["end"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert _keys(points) == POINT_KEYS and all(t.data.tags["sweeper.status"] == "ok" for t in points)
    assert parents[0].data.metrics["num_trials_ok"] == 4 and nothing_left
