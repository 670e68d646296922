"""What Ray reads once per process is set before anything imports Ray, on the driver's way to connect(),
for a local Ray and for a joined cluster; the token a joining driver sends; what a failed start or join
says. Fast: subprocesses stop at the first `import ray`, before any Ray starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.cluster import connect, environment
from sweeper.config import ClusterConfig
from tests.harness import mlflow_store

REPO = Path(__file__).resolve().parents[2]

# Stops the CLI at the first `import ray`, recording what Ray would read at that moment and who imported it.
STOP_AT_RAY = r"""
import json, os, sys, traceback

class StopAtRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray":
            with open(os.environ["RECORD"], "w") as f:
                json.dump({key: os.environ.get(key) for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
                          | {"importer": "".join(traceback.format_stack(limit=12))}, f)
            sys.stdout.flush()
            os._exit(0)
        return None

sys.meta_path.insert(0, StopAtRay())
sys.argv = ["sweeper", *json.loads(os.environ["ARGS"])]
from sweeper.__main__ import cli
cli()
"""

TINY = ["model=mlp", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]", "data=digits",
        "train.epochs=1", "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
        "cluster.include_dashboard=false", "measure.flops=false"]


def test_nothing_on_the_drivers_way_to_connect_imports_ray():
    modules = ["sweeper.__main__", "sweeper.driver.train_sweep", "sweeper.driver.inference", "sweeper.driver.resume",
               "sweeper.driver.skeleton", "sweeper.cluster.connect", "sweeper.cluster.environment"]
    code = f"import sys; import {', '.join(modules)}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def _unfinished_sweep(folder: Path) -> None:
    """A sweep interrupted in `folder`: its parent run in MLflow (RUNNING, as a SIGKILL leaves it) and
    its Ray Tune folder, so that sweep.resume=true reaches the check that reads Ray Tune's state."""
    from mlflow.tracking import MlflowClient

    from sweeper import tracking

    name = "sweep-mlp-digits-20260101-000000"
    client = MlflowClient(mlflow_store(folder))
    experiment = client.create_experiment("sweeper")
    client.create_run(experiment, run_name=name, tags={
        "sweeper.role": "sweep", "sweeper.resume_format": tracking.RESUME_FORMAT, "sweeper.ray_experiment": name})
    (folder / ".sweeper" / "ray" / "results" / name).mkdir(parents=True)


def _first_ray_import(folder: Path, *args: str, home: Path) -> dict:
    record = folder / "first_ray_import.json"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")},
           "RECORD": str(record), "ARGS": json.dumps([*TINY, *args]), "HOME": str(home), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", STOP_AT_RAY], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=180)
    assert record.exists(), f"Ray was never imported (exit {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(record.read_text())


def test_a_local_resume_imports_ray_only_after_its_token_is_set(tmp_path):
    _unfinished_sweep(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    seen = _first_ray_import(tmp_path, "sweep.resume=true", home=home)
    assert seen["RAY_AUTH_MODE"] == "token", seen["importer"]
    assert seen["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / ".sweeper" / "ray" / "auth_token"), seen["importer"]
    assert list(home.iterdir()) == []


def test_a_joined_resume_imports_ray_only_after_its_token_is_chosen(tmp_path):
    # `ray start --head` on a machine with ~/.ray/auth_token turns token auth on: the joining driver
    # must send that token, which Ray itself does not do for an explicit address.
    _unfinished_sweep(tmp_path)
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("a" * 64)
    seen = _first_ray_import(tmp_path, "sweep.resume=true", "cluster.address=127.0.0.1:9", home=home)
    assert seen["RAY_AUTH_MODE"] == "token", seen["importer"]


@pytest.fixture
def clean_ray_env(tmp_path):
    """No Ray auth variables and an empty HOME; the process's environment as it was afterwards
    (prepare() sets variables for the rest of a process, as it should in the CLI's)."""
    before = dict(os.environ)
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
        os.environ.pop(key, None)
    os.environ["HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir()
    yield tmp_path
    os.environ.clear()
    os.environ.update(before)


def test_a_local_ray_keeps_its_token_in_its_ray_dir_and_writes_it_only_when_it_starts(clean_ray_env):
    ray_dir = clean_ray_env / "ray"
    env = environment.prepare(ClusterConfig(ray_dir=str(ray_dir)))
    assert env.token_path == str(ray_dir / "auth_token") == os.environ["RAY_AUTH_TOKEN_PATH"]
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert not ray_dir.exists()  # a run refused before Ray starts leaves no file
    environment.write_token(env)
    token = (ray_dir / "auth_token").read_text()
    assert len(token) == 64 and oct((ray_dir / "auth_token").stat().st_mode)[-3:] == "600"
    environment.write_token(env)
    assert (ray_dir / "auth_token").read_text() == token  # kept: a resume's Ray shares it
    assert list((clean_ray_env / "home").iterdir()) == []


def test_joining_sends_the_token_ray_start_uses_and_names_where_it_came_from(clean_ray_env):
    joined = ClusterConfig(address="127.0.0.1:6379")
    none = environment.prepare(joined)
    assert none.token_source == "none" and "RAY_AUTH_MODE" not in os.environ  # Ray's default: no auth
    default = clean_ray_env / "home" / ".ray" / "auth_token"
    default.parent.mkdir()
    default.write_text("b" * 64)
    found = environment.prepare(joined)
    assert found.token_path == str(default) and os.environ["RAY_AUTH_MODE"] == "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(clean_ray_env / "cluster_token")
    chosen = environment.prepare(joined)
    assert chosen.token_path == str(clean_ray_env / "cluster_token") and chosen.token_source == "RAY_AUTH_TOKEN_PATH"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    assert environment.prepare(joined).token_source == "none"  # the user's word on auth is kept


REFUSED = RuntimeError("Failed to connect to GCS. ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: "
                       "Authentication token is missing or incorrect")


def test_a_refused_join_names_the_token_file_used_and_how_to_point_at_the_right_one():
    joined = ClusterConfig(address="127.0.0.1:6391")
    stale = environment.RayEnvironment("/home/u/.ray/auth_token", "~/.ray/auth_token, Ray's default", "token")
    wrapped = ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6391")
    wrapped.__cause__ = REFUSED
    line = connect.start_problem(joined, stale, wrapped)
    assert "/home/u/.ray/auth_token" in line and "RAY_AUTH_TOKEN_PATH" in line and "\n" not in line
    assert "cluster.address=null" not in line and "ray start --head" not in line
    pointed = environment.RayEnvironment("/tmp/t", "RAY_AUTH_TOKEN_PATH", "token")
    assert "cluster's token file instead" in connect.start_problem(joined, pointed, wrapped)
    nothing = environment.RayEnvironment(None, "none", None)
    assert "no token was sent" in connect.start_problem(joined, nothing, wrapped)


def test_a_failed_local_start_never_advises_the_value_already_set():
    local = ClusterConfig(dashboard_port=8265)
    env = environment.RayEnvironment("/w/.sweeper/ray/auth_token", "cluster.ray_dir", "token")
    line = connect.start_problem(local, env, RuntimeError("Failed to start GCS.  Last 0 lines of error files:"))
    assert line.startswith("cannot start a local Ray") and "cluster.address=null for a local Ray" not in line
    assert "cluster.address=None" not in line and "join" not in line
    port = connect.start_problem(local, env, ValueError("Port 8265 is already occupied"))
    assert port.startswith("cluster.dashboard_port=8265 is in use") and "cluster.dashboard_port=8266" in port
    token = connect.start_problem(local, env, REFUSED)
    assert "/w/.sweeper/ray/auth_token" in token and "refused its own token" in token
    joined = connect.start_problem(ClusterConfig(address="10.0.0.1:6379"), env, ConnectionError("timed out"))
    assert joined.startswith("cluster.address='10.0.0.1:6379': cannot join") and "ray status --address" in joined


@pytest.mark.parametrize("entrypoint, shell", [("{python} -c '{probe}'; true", "sh"),
                                               ("exec {python} -c '{probe}'", "None")])
def test_a_ray_job_started_through_a_shell_is_told_to_exec(entrypoint, shell):
    # What Ray's job supervisor does: `sh -c <entrypoint>` with its job config in the environment. Through a
    # shell, `ray job stop` orphans the driver and then waits for its zombie: the console says to use exec.
    probe = "from sweeper.cluster import environment; print(environment.job_shell())"
    run = subprocess.run(["sh", "-c", entrypoint.format(python=sys.executable, probe=probe)], capture_output=True,
                         text=True, env={**os.environ, environment.JOB_CONFIG: "{}"}, cwd=REPO)
    assert run.stdout.strip() == shell, run.stderr
    alone = subprocess.run(["sh", "-c", f"{sys.executable} -c '{probe}'; true"], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != environment.JOB_CONFIG}, cwd=REPO)
    assert alone.stdout.strip() == "None"  # not a Ray job: a shell is no matter
