"""The record never says more than happened and loses nothing: a point counts once its identity is
written (last), a driver killed between any two writes leaves nothing half-claimed, writes the store
refuses wait in a journal, and a fresh SQLite store survives two processes creating it at once."""

import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

from sweeper.plan import GridPoint
from sweeper.schema import PointResult, SweepSummary
from sweeper.tracking import Tracker, redact
from tests.harness import mlflow_store

POINT = GridPoint(8, 2, 1)
RESULT = {"trial_key": POINT.key, "status": "ok", "samples_per_second": 10.0, "train_loss": [2.0, 1.0],
          "val_accuracy": 0.5, "started_at": 1_795_000_000.0, "trial_seconds": 3.0, "throughput_stable": True}
# A point's writes, in order: create the run, its params, its metrics, its identity and status, its end.
POINT_WRITES = 5

KILLED_DRIVER = textwrap.dedent("""
    import os, signal, sys
    from sweeper.plan import GridPoint
    from sweeper.schema import PointResult
    from sweeper.tracking import Tracker
    uri, kill_after, result = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
    tracker = Tracker(uri, "faults")
    print(tracker.start_sweep("sweep-killed", {"model": "mlp"}, "a: 1\\n"), flush=True)
    client, writes = tracker.store.client, [0]
    def counted(method):
        def call(*args, **kwargs):
            out = method(*args, **kwargs)
            writes[0] += 1
            if writes[0] == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)  # the driver dies right after this write
            return out
        return call
    for name in ("create_run", "log_batch", "log_artifacts", "set_terminated"):
        setattr(client, name, counted(getattr(client, name)))
    tracker.log_point(GridPoint(8, 2, 1), {"micro_batch_size": 8}, PointResult.from_flat(result))
""")


@pytest.mark.parametrize("kill_after", range(1, POINT_WRITES + 1))
def test_a_driver_killed_after_any_write_of_a_point_leaves_it_recorded_once_after_resume(tmp_path, kill_after):
    uri = mlflow_store(tmp_path)
    killed = subprocess.run([sys.executable, "-c", KILLED_DRIVER, uri, str(kill_after), repr(RESULT)],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    parent = killed.stdout.split()[0]

    tracker = Tracker(uri, "faults")
    _, half_written = tracker.resume_sweep(parent)
    complete = kill_after >= POINT_WRITES - 1  # the identity (write 4) makes it a record
    assert half_written == (0 if complete else 1)
    assert tracker.reader.recorded_keys() == ([POINT.key] if complete else [])
    # Resume measures what is not recorded; a re-delivered result is never recorded twice.
    tracker.log_point(POINT, {"micro_batch_size": 8}, PointResult.from_flat(RESULT))
    tracker.log_point(POINT, {"micro_batch_size": 8}, PointResult.from_flat(RESULT))
    tracker.end_sweep(SweepSummary(num_trials_ok=1), "FINISHED")

    runs = MlflowClient(uri).search_runs([tracker.store.experiment_id], max_results=100)
    assert [r.info.status for r in runs if r.info.status == "RUNNING"] == []
    points = tracker.reader.load().children
    assert [p["key"] for p in points] == [POINT.key] and points[0]["samples_per_second"] == 10.0
    killed_runs = [r for r in runs if r.info.status == "KILLED"]
    assert len(killed_runs) == (0 if complete else 1)  # the half-written run is kept, marked, not counted
    assert all(r.data.tags.get("sweeper.incomplete") == "true" for r in killed_runs)


def test_writes_the_store_refuses_wait_in_the_journal_and_are_recorded_once_it_is_back_simulated(tmp_path):
    uri = mlflow_store(tmp_path)
    tracker = Tracker(uri, "outage")
    parent = tracker.start_sweep("sweep-outage", {}, "")
    real = tracker.store.client.create_run

    def store_down(*args, **kwargs):  # what a tracking server that went away raises, simulated
        raise ConnectionError("simulated: the tracking server went away")

    tracker.store.client.create_run = store_down
    assert tracker.log_point(POINT, {"micro_batch_size": 8}, PointResult.from_flat(RESULT)) is None
    other = GridPoint(16, 1, 1)
    tracker.log_point(other, {"micro_batch_size": 16}, PointResult.from_flat({**RESULT, "trial_key": other.key}))
    assert tracker.pending == 2 and "simulated" in tracker.journal.last_error
    # Still down at the end: the parent is not ended; the writes stay for a resume.
    replayed, pending = tracker.end_sweep(SweepSummary(num_trials_ok=2), "FINISHED")
    assert (replayed, pending) == (0, 3)
    assert MlflowClient(uri).get_run(parent).info.status == "RUNNING"

    tracker.store.client.create_run = real
    again = Tracker(uri, "outage")
    replayed, half = again.resume_sweep(parent)
    assert (replayed, half, again.pending) == (3, 0, 0)
    assert sorted(again.reader.recorded_keys()) == sorted([POINT.key, other.key])
    assert MlflowClient(uri).get_run(parent).info.status == "FINISHED"  # the journal's own end, replayed


def test_retrying_a_failed_point_keeps_the_old_run_superseded_and_counts_the_point_once(tmp_path):
    uri = mlflow_store(tmp_path)
    tracker = Tracker(uri, "retry")
    tracker.start_sweep("sweep-retry", {}, "")
    tracker.log_point(POINT, {}, PointResult(trial_key=POINT.key, status="failed", error="RuntimeError: flaky node"))
    assert tracker.reader.failed_keys() == [POINT.key]
    assert tracker.log_point(POINT, {}, PointResult.from_flat(RESULT)) is None  # without retry: kept as it was
    assert tracker.log_point(POINT, {}, PointResult.from_flat(RESULT), replace_failed=True) is not None
    points = tracker.reader.load().children
    assert [(p["key"], p["status"]) for p in points] == [(POINT.key, "ok")]
    roles = sorted(r.data.tags["sweeper.role"] for r in tracker.reader.children())
    assert roles == ["superseded", "trial"]


CREATE = "import sys; from sweeper.tracking import Tracker; Tracker(sys.argv[1], 'race')"


def test_two_processes_creating_a_fresh_sqlite_store_at_once_both_succeed(tmp_path):
    for attempt in range(3):
        uri = f"sqlite:///{tmp_path / f'race{attempt}.db'}"
        procs = [subprocess.Popen([sys.executable, "-c", CREATE, uri], stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-2000:]


def test_credentials_in_a_tracking_uri_are_never_printed():
    assert redact("http://alice:s3cret@mlflow.internal:5000/") == "http://alice:***@mlflow.internal:5000/"
    assert redact("sqlite:////tmp/x/mlflow.db") == "sqlite:////tmp/x/mlflow.db"
    assert "s3cret" not in redact("https://bob:s3cret@host")


@pytest.mark.parametrize("name", ["../../x", "/etc/evil", "..", "a/../../b", ".hidden", ""])
def test_a_planted_run_name_cannot_place_a_report_outside_the_reports_folder(tmp_path, name):
    import os

    from sweeper.report.folders import default_folder

    reports = os.path.realpath(tmp_path / "reports") + os.sep
    for folder in (default_folder(f"sqlite:///{tmp_path}/mlflow.db", name),
                   default_folder(f"sqlite:///{tmp_path}/mlflow.db", "sweep", variant_name=name)):
        assert os.path.realpath(folder).startswith(reports), folder


def test_a_password_in_the_tracking_uri_is_in_no_output_hydra_file_or_error(tmp_path):
    from tests.harness import free_port, run_cli

    secret = "pa55-w0rd-xyz"
    result = run_cli(f"tracking.uri=http://alice:{secret}@127.0.0.1:{free_port()}", "cluster.include_dashboard=false",
                     cwd=tmp_path, env={"HOME": str(tmp_path)}, timeout=300, own_ray=True)  # refused before Ray
    assert result.returncode == 2 and "tracking.uri='http://127.0.0.1:" in result.stderr  # no credentials left
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "overrides.yaml" for p in written)  # Hydra wrote its copies, then they were redacted
    for path in written:
        assert secret not in path.read_text(errors="replace"), path
    assert secret not in result.stdout + result.stderr
