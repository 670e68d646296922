"""A sweep submitted as a Ray job (`ray job submit -- python -m sweeper ... cluster.address=auto`, what a
KubeRay RayJob runs), through the Jobs API against a Ray head this test starts: its console in the job's
logs, its exit status as the job's status, `ray job stop` ending it KILLED and resumable, and no placement
group left behind by the stopped sweep nor by its resume (Ray's state API)."""

import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.harness import mlflow_store, nothing_running, recorded, sleepy_model, start_head, stop_block, sweep_runs
from tests.e2e.test_faults import COMMON, POINT_KEYS, THREE_POINTS

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]


def _supervisor_lines(ray_folder: Path, job_id: str) -> list:
    """What Ray's job supervisor logged about stopping `job_id` (its worker's log, under the head's session
    folder)."""
    found = []
    for log in (ray_folder / "tmp").rglob("*"):
        try:
            if log.is_file() and not log.is_symlink():
                found += [line for line in log.read_text(errors="replace").splitlines()
                          if job_id in line and ("terminate" in line or "force-killed" in line)]
        except OSError:
            pass
    return found


def _wait_for(client, job_id: str, terminal=True, timeout: float = 600):
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout
    while time.time() < deadline:
        info = client.get_job_info(job_id)
        if info.status.is_terminal() if terminal else info.status == JobStatus.RUNNING:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {info.status} after {timeout:.0f} s:\n"
                         f"{client.get_job_logs(job_id)[-3000:]}")


def test_a_sweep_submitted_as_a_ray_job_stops_killed_with_ray_job_stop_and_resumes(tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    # Under /tmp, not pytest's deeper tmp_path: Ray's socket paths under --temp-dir have a length limit.
    ray_folder = Path(tempfile.mkdtemp(prefix="sweeper-jobs-"))
    head_proc, head = start_head(ray_folder)
    try:
        client = JobSubmissionClient(head.dashboard, headers=head.headers())
        # `ray job submit --working-dir .`: the driver runs in a copy of the project Ray unpacks, so the
        # store and Ray Tune's state (what a resume reads) are given absolute paths outside it.
        project = tmp_path / "project"
        project.mkdir()
        (project / "README.md").write_text("a user's project folder, uploaded with the job\n")
        db = tmp_path / "mlflow.db"
        args = [*sleepy_model(), *COMMON, *THREE_POINTS, "cluster.address=auto",
                f"tracking.uri={mlflow_store(tmp_path)}", f"cluster.ray_dir={tmp_path / 'ray'}"]

        def submit(*extra: str) -> str:
            # `exec`, as docs/cluster.md and deploy/kuberay/ give it: the driver is the job supervisor's own
            # child, so `ray job stop` waits for the sweep itself, within Ray's default 3 s.
            entrypoint = "exec " + shlex.join([sys.executable, "-m", "sweeper", *args, *extra])
            return client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": str(project)})

        first = submit()
        _wait_for(client, first, terminal=False)
        deadline = time.time() + 300
        while recorded(db, "mb") < 1:  # mid-grid: a point recorded, the next one running
            assert client.get_job_status(first) == JobStatus.RUNNING, client.get_job_logs(first)[-3000:]
            assert time.time() < deadline, "no point recorded in time"
            time.sleep(0.5)
        # The state API sees the running sweep's placement groups (its Tune trial's): the checks of none below
        # look where groups are.
        assert head.placement_groups(timeout=0) != []
        stop_asked = time.time()
        assert client.stop_job(first)
        stopped = _wait_for(client, first)
        stop_seconds = time.time() - stop_asked
        logs = client.get_job_logs(first)
        assert stopped.status == JobStatus.STOPPED, logs[-3000:]
        # The sweep's console is the job's log: its progress and, on the stop, the line that finishes it.
        assert "points" in logs and "interrupted by SIGTERM" in logs and "sweep.resume=true" in logs, logs[-3000:]
        assert "Traceback" not in logs, logs[-3000:]
        # Ray SIGKILLs a driver still running RAY_JOB_STOP_WAIT_TIME_S (3 s) after its SIGTERM: this one exited.
        said = _supervisor_lines(ray_folder, first)
        assert any("terminated gracefully with SIGTERM" in line for line in said), said
        (killed,), before = sweep_runs(tmp_path)
        assert killed.info.status == "KILLED" and 1 <= len(before) < 3 and nothing_running(tmp_path)
        assert head.placement_groups() == []

        # Another experiment is refused before anything is touched: exit 2, the job FAILED with that status.
        other = submit("optim.lr=0.2", "sweep.resume=true")
        refused = _wait_for(client, other)
        assert refused.status == JobStatus.FAILED and refused.driver_exit_code == 2, client.get_job_logs(other)[-3000:]
        assert "optim.lr: 0.05 -> 0.2" in client.get_job_logs(other)

        resumed = submit("sweep.resume=true")
        done = _wait_for(client, resumed)
        logs = client.get_job_logs(resumed)
        assert done.status == JobStatus.SUCCEEDED and done.driver_exit_code == 0, logs[-3000:]
        assert "resuming sweep-" in logs
        parents, points = sweep_runs(tmp_path)
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert Counter(t.data.tags["sweeper.trial_key"] for t in points) == POINT_KEYS
        assert all(t.data.tags["sweeper.status"] == "ok" for t in points) and nothing_running(tmp_path)
        assert head.placement_groups() == []
        print(f"`ray job stop` to a terminal status: {stop_seconds:.1f} s")
    finally:
        stop_block(head_proc)
        shutil.rmtree(ray_folder, ignore_errors=True)
