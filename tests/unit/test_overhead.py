"""The harness's own cost: a worker group's start-up in its parts and the sweep's wall time in its
phases, against cases with known answers."""

from collections import Counter
from types import SimpleNamespace

import pytest

from sweeper.driver.skeleton import Phases
from sweeper.driver.train_sweep import summary
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.worker.points import startup_split


def test_startup_split_parts_add_up_to_the_group_start_up():
    # Trial starts at 100, the worker process is created at 103, enters the training function at
    # 110 (imports, process group) and is ready to train at 112 (data, peak FLOP/s).
    split = startup_split(group_start=100.0, process_start=103.0, entered=110.0, ready=112.0)
    assert split == pytest.approx({
        "worker_group_startup_seconds": 12.0,
        "worker_group_launch_seconds": 3.0,
        "worker_group_init_seconds": 7.0,
        "worker_group_setup_seconds": 2.0,
    })


def test_startup_split_of_a_process_ray_started_before_the_trial():
    # A pooled worker process older than the trial costs no launch; init runs from the trial's start.
    split = startup_split(group_start=100.0, process_start=50.0, entered=104.0, ready=105.0)
    assert split["worker_group_launch_seconds"] == 0.0
    assert split["worker_group_init_seconds"] == pytest.approx(4.0)
    # Unknown process start: no launch figure, rather than a made-up 0.
    assert "worker_group_launch_seconds" not in startup_split(100.0, None, 104.0, 105.0)


def phases(**seconds):
    out = Phases()
    out.seconds = dict(seconds)
    return out


def test_the_phases_cover_the_clock_from_the_sweeps_start_to_its_last_phase(monkeypatch):
    from sweeper.driver import skeleton

    readings = iter([100.0, 102.5, 107.5, 111.0, 120.0, 121.5, 123.0])
    monkeypatch.setattr(skeleton, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    out = Phases()  # the sweep starts at 100.0
    for name in ("setup", "ray_start", "frontier", "grid", "report", "grid"):
        out(name)
    # Each phase is the span since the one before: setup 102.5 - 100 = 2.5, ray_start 107.5 - 102.5 = 5,
    # frontier 111 - 107.5 = 3.5, report 121.5 - 120 = 1.5; grid twice, 120 - 111 = 9 and 123 - 121.5
    # = 1.5, adds up to 10.5. Nothing is left between them: the wall is 123 - 100 = 23.
    assert out.seconds == {"setup": 2.5, "ray_start": 5.0, "frontier": 3.5, "grid": 10.5, "report": 1.5}
    assert out.wall == 23.0


def test_the_summary_adds_the_phases_and_divides_by_both_point_and_training_time():
    rows = [
        (GridPoint(16, 1, 1), PointResult.from_flat({"trial_seconds": 10.0, "train_seconds": 8.0})),
        (GridPoint(32, 1, 1), PointResult.from_flat({"trial_seconds": 6.0, "train_seconds": 4.0})),
        (GridPoint(64, 1, 1), PointResult(status="failed")),  # a failed point has no time of its own
    ]
    out = summary(rows, phases(setup=2.0, ray_start=5.0, tracking=1.0, grid=22.0, report=2.0),
                  Counter(ok=2, failed=1)).metrics()
    assert out == pytest.approx({
        "num_trials_ok": 2, "num_trials_stopped": 0, "num_trials_did_not_learn": 0, "num_trials_diverged": 0,
        "num_trials_oom": 0, "num_trials_failed": 1,
        "sweep_wall_seconds": 32.0,
        "sweep_setup_seconds": 2.0,
        "sweep_ray_start_seconds": 5.0,
        "sweep_tracking_seconds": 1.0,
        "sweep_grid_seconds": 22.0,
        "sweep_report_seconds": 2.0,
        "sum_trial_seconds": 16.0,
        "sweep_wall_over_trial_seconds": 2.0,
        "sum_train_seconds": 12.0,
        "sweep_wall_over_train_seconds": 32.0 / 12.0,
    })
    # Nothing measured: the ratios are left out instead of dividing by zero.
    assert "sweep_wall_over_trial_seconds" not in summary([], phases(setup=1.0), Counter()).metrics()
