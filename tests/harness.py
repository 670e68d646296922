"""What the tests share, imported by name (`from tests.harness import run_cli`): a config compose, the CLI
runner, one Ray for the test session that the CLI joins (as a user with a cluster does), one zygote the
joined runs are forked from, and one empty MLflow store a test's store starts as. The fixtures and hooks
are tests/conftest.py's; the xdist scheduling is tests/scheduling.py's."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from hydra import compose, initialize_config_module

from sweeper import config

config.register()

REPO = Path(__file__).resolve().parents[1]


def compose_cfg(*overrides: str, hydra_config: bool = False):
    """The DictConfig `python -m sweeper` composes from `overrides` (Hydra's own section too with
    `hydra_config`)."""
    with initialize_config_module(config_module="sweeper.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)


def typed_cfg(*overrides: str) -> config.SweeperConfig:
    """The typed config of `overrides`, before its checks (config.load would run them and raise)."""
    return config.to_typed(compose_cfg(*overrides))


def free_port() -> int:
    """A TCP port nothing listens on now (for a gloo rendezvous, a server, a dashboard)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SessionRay:
    """One `ray start --head` for the whole test session, started on first use and stopped at exit.

    Starting a Ray costs 4-6 s and ~0.5 GB here (STACK.md); the e2e tests made ~60 of them. Sized as
    the CLI's own local Ray (num_cpus = the machine's cores) so a joining sweep plans the same
    resources it would plan alone. Token auth on, as Ray 2.60 does for any new cluster: a joining
    process needs RAY_AUTH_MODE=token and the token's path (what `env` returns).
    """

    def __init__(self):
        self.address = None
        self.head: Optional[RayHead] = None  # its ports, token and dashboard
        self.folder = None
        self._env = None
        self._probe = None

    def env(self) -> dict:
        if self.address is None:
            self._start()
        return dict(self._env)

    def _start(self, attempts: int = 2) -> None:
        # Ray's own start-up waits are short for a loaded 2-core box (once at load 15: exit 1); retry.
        for attempt in range(attempts):
            try:
                return self._start_once()
            except RuntimeError:
                self.stop(force=True)
                if attempt == attempts - 1:
                    raise

    def _start_once(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sweeper-test-ray-"))
        head = RayHead(self.folder, num_cpus=os.cpu_count())
        self._env = head.env
        started = subprocess.run(head.command(), env={**os.environ, **self._env}, capture_output=True, text=True,
                                 timeout=300)
        if started.returncode != 0:
            raise RuntimeError(f"`ray start --head` for the test session failed:\n{started.stdout[-3000:]}\n"
                               f"{started.stderr[-3000:]}")
        self.address, self.head = head.address, head

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every CPU is free again (a sweep's actors and placement groups gone)."""
        if self.address is None:
            return
        if self._probe is None or self._probe.poll() is not None:
            # One driver kept attached for the session: a fresh `ray.init` per check costs ~4.6 s here.
            self._probe = subprocess.Popen(
                [sys.executable, "-c", IDLE_PROBE, self.address], env={**os.environ, **self._env},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
        deadline = time.time() + timeout
        while time.time() < deadline:
            self._probe.stdin.write("?\n")
            self._probe.stdin.flush()
            if self._probe.stdout.readline().strip() == "idle":
                return
            time.sleep(0.5)
        raise AssertionError(f"the session Ray still holds CPUs {timeout:.0f} s after a sweep ended")

    def processes(self) -> list:
        """This Ray's processes (psutil), and no other Ray's on the machine."""
        import psutil

        if self.folder is None:
            return []
        mine = []
        # Its processes name its folder, or (the Ray client server, orphaned once `ray start` exits)
        # its GCS port.
        gcs = f":{self.address.rsplit(':', 1)[-1]} " if self.address else None
        for proc in psutil.process_iter(["cmdline"]):
            try:
                line = " ".join(proc.info["cmdline"] or []) + " "
                if str(self.folder) in line or (gcs and "ray" in line and gcs in line):
                    mine.append(proc)
            except psutil.Error:
                pass
        # Their children too: the raylet's agents rename themselves (ray::DashboardAgent), so their
        # command lines no longer name the folder, and outlive the raylet when not ended with it.
        for proc in list(mine):
            try:
                mine += [c for c in proc.children(recursive=True) if c not in mine]
            except psutil.Error:
                pass
        return mine

    def stop(self, force: bool = False) -> None:
        """Ends only this Ray's processes (`ray stop` would end every Ray of this user on the machine)."""
        if self.folder is None or (self.address is None and not force):
            return
        import psutil

        if self._probe is not None:
            self._probe.kill()
            self._probe.wait()
        mine = self.processes()
        for proc in mine:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(mine, timeout=10)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)
        self.address = self.head = self.folder = self._probe = None


class RayHead:
    """`ray start --head` as the tests start it, in `folder` (its temporary files and its token): token
    auth on, as Ray 2.60 does for any new cluster (a joining process needs `env`: RAY_AUTH_MODE=token
    and the token's path), a dashboard, and every port its own (other Rays on this machine, other
    sweeps, the tests that start their own, would otherwise meet at 8265, the dashboard agent's 52365
    and friends)."""

    def __init__(self, folder: Path, num_cpus: int):
        self.folder, self.num_cpus = Path(folder), num_cpus
        self.token = self.folder / "auth_token"
        self.token.write_text(os.urandom(32).hex())
        self.token.chmod(0o600)
        self.port, self.dashboard_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
            # Ray's workers import test models (tests.unit.test_training.Sleepy, ...) from this repository.
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def command(self, *extra: str) -> list:
        return [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={self.port}",
                f"--num-cpus={self.num_cpus}", "--num-gpus=0",
                # A dashboard, as a user's cluster has: a joining sweep prints its address first thing.
                "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                f"--metrics-export-port={free_port()}", f"--temp-dir={self.folder / 'tmp'}", "--disable-usage-stats",
                *extra]

    def node_command(self, folder: Path, num_cpus: int) -> list:
        """`ray start --block` of a worker node on this machine joining this head: its own temporary files
        in `folder` (a node's sockets are named by its session folder) and every port its own."""
        return [sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={self.address}",
                f"--num-cpus={num_cpus}", "--num-gpus=0", f"--node-manager-port={free_port()}",
                f"--object-manager-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
                f"--metrics-export-port={free_port()}", f"--temp-dir={folder}", "--disable-usage-stats", "--block"]

    def alive_nodes(self) -> int:
        """How many of the cluster's nodes are ALIVE (Ray's state API)."""
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        client = StateApiClient(self.dashboard, headers=self.headers())
        nodes = client.list(StateResource.NODES, options=ListApiOptions(), raise_on_missing_output=False)
        return sum(n.state == "ALIVE" for n in nodes)

    def headers(self) -> dict:
        """What the dashboard's HTTP APIs (jobs, state) want from a client: the token."""
        return {"Authorization": f"Bearer {self.token.read_text().strip()}"}

    def placement_groups(self, of_ended_jobs: bool = False, timeout: float = 30) -> list:
        """The cluster's placement groups not REMOVED (Ray's state API), once there are none or `timeout`
        passed: the GCS removes a job's groups shortly after its driver exits. `of_ended_jobs`: only those
        of jobs that ended, the ones leaked (a shared Ray's other sweeps hold theirs while they run)."""
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        client = StateApiClient(self.dashboard, headers=self.headers())
        deadline = time.time() + timeout
        while True:
            groups = [g for g in client.list(StateResource.PLACEMENT_GROUPS, options=ListApiOptions(detail=True),
                                             raise_on_missing_output=False) if g.state != "REMOVED"]
            if of_ended_jobs:
                running = {j.job_id for j in client.list(StateResource.JOBS, options=ListApiOptions(),
                                                         raise_on_missing_output=False)
                           if j.status in ("PENDING", "RUNNING")}
                groups = [g for g in groups if g.creator_job_id not in running]
            if not groups or time.time() > deadline:
                return groups
            time.sleep(1)


def start_head(folder: Path, num_cpus: int = 2, env: Optional[dict] = None):
    """`ray start --head --block` in its own process group, its dashboard (the Jobs API) answering:
    (the process, its RayHead). Stopped with `stop_block`, by its process id, never `ray stop` (which
    ends every Ray on the machine). `env`: more of the head's environment (Ray's settings)."""
    from ray.job_submission import JobSubmissionClient

    head = RayHead(folder, num_cpus=num_cpus)
    log = open(folder / "ray-start.log", "w")
    proc = subprocess.Popen(head.command("--block"), env={**os.environ, **head.env, **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while True:
        try:
            JobSubmissionClient(head.dashboard, headers=head.headers()).list_jobs()
            return proc, head
        except Exception:  # noqa: BLE001 - not up yet (refused, 503 until the job agent registers)
            if proc.poll() is not None or time.time() > deadline:
                stop_block(proc)
                said = (folder / "ray-start.log").read_text()[-3000:]
                raise AssertionError(f"the Ray head did not come up:\n{said}") from None
            time.sleep(1)


def stop_block(proc) -> None:
    """SIGTERM to a `ray start --block` started in its own process group, which stops the processes it
    started; its group killed after 30 s."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


IDLE_PROBE = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
for _ in sys.stdin:
    total, free = ray.cluster_resources().get("CPU", 0), ray.available_resources().get("CPU", 0)
    print("idle" if free >= total - 1e-6 else "busy", flush=True)
"""

SESSION_RAY = SessionRay()


class StoreTemplate:
    """An empty MLflow SQLite store, made once per test session, that a test's store starts as.

    MLflow creates a SQLite store by running its schema migrations, ~4 s here for every sweep and
    every tracker on a new path; copying the migrated file takes milliseconds and gives the store
    MLflow itself would have made (same tables, same schema version, the Default experiment). A
    store's creation is still tested where it is the subject: two processes creating one at once
    (test_record), and a newcomer's first run (test_first_run), which start from no file."""

    def __init__(self):
        self.folder = None

    def path(self) -> Path:
        if self.folder is None:
            from mlflow.tracking import MlflowClient

            self.folder = Path(tempfile.mkdtemp(prefix="sweeper-test-store-"))
            MlflowClient(f"sqlite:///{self.folder / 'mlflow.db'}").search_experiments()
        return self.folder / "mlflow.db"

    def copy_to(self, db: Path) -> str:
        """`db` made an empty store (unless a file is there already); its sqlite:/// URI."""
        if not db.exists():
            db.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.path(), db)
        return f"sqlite:///{db}"

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


STORE_TEMPLATE = StoreTemplate()


def mlflow_store(folder: Path, name: str = "mlflow.db") -> str:
    """The URI of an empty MLflow SQLite store at folder/name, copied from the session's template."""
    return STORE_TEMPLATE.copy_to(Path(folder) / name)


def seed_default_store(args, cwd: Path) -> None:
    """A CLI run in `cwd` whose args name no tracking store uses cwd/mlflow.db (config.tracking_uri):
    start it as the session's empty store, as a user's second sweep in a folder finds one."""
    if not any(a.lstrip("+").startswith(("tracking.uri=", "tracking=")) for a in args):
        STORE_TEMPLATE.copy_to(Path(cwd) / "mlflow.db")


def joining_session_ray(args, env=None):
    """(args, env) of a CLI run that joins the session's Ray, for a test that drives the process
    itself (Popen, signals) rather than through run_cli. Waits first until the session's Ray is idle:
    a sweep that ended (or was killed) leaves its actors to Ray's clean-up, and a worker group waiting
    for their CPUs would hang silently (STACK.md)."""
    ray_env = SESSION_RAY.env()
    SESSION_RAY.wait_idle()
    if env and "PYTHONPATH" in env:
        ray_env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], ray_env["PYTHONPATH"]])
    return [*args, f"cluster.address={SESSION_RAY.address}"], {**os.environ, **(env or {}), **ray_env}


def run_cli(
    *args: str, cwd: Path, timeout: float = 600, env=None, own_ray: bool = False, fresh_store: bool = False
) -> subprocess.CompletedProcess:
    """`python -m sweeper *args` in cwd. It joins the session's Ray (cluster.address=...) unless
    own_ray is true or args already name a cluster.address: tests of Ray's start-up, of a two-node
    cluster, of faults that kill Ray's processes and of the dashboard start their own.

    A run that joins the session's Ray is a process forked from the session's ZYGOTE, which has
    imported what the CLI imports (~10 s of every run here) and nothing else: Ray, which reads its
    settings when imported, is imported by the run itself, as in a fresh `python -m sweeper`.

    Its default store (cwd/mlflow.db, when args name none) starts as the session's empty store unless
    fresh_store is true (see StoreTemplate)."""
    merged = {**os.environ, **(env or {})}
    args = list(args)
    if not fresh_store:
        seed_default_store(args, cwd)
    if not own_ray and not any(a.startswith(("cluster.address=", "+cluster.address=")) for a in args):
        args, merged = joining_session_ray(args, env)
        if not os.environ.get("SWEEPER_TEST_NO_ZYGOTE"):
            return ZYGOTE.run(args, cwd, merged, timeout)
    return subprocess.run(
        [sys.executable, "-m", "sweeper", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=merged,
    )


class Zygote:
    """A Python process that has imported the CLI's modules and forks one child per run: the child
    takes the run's working folder, environment, sys.path (as `python -m` builds it) and argv, and
    runs `sweeper.__main__.cli()`, its output in files the caller reads. One thread, no Ray, nothing
    run: what a child inherits is what a fresh interpreter would have after the same imports."""

    def __init__(self):
        self._proc = None
        self._running: Optional[ZygoteChild] = None
        self._folders: list = []

    def run(self, args, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        """`python -m sweeper *args` to its end, as subprocess.run(capture_output=True, text=True)."""
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            child = self.spawn(args, cwd, env, out, err)
            try:
                status = child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                raise
            return subprocess.CompletedProcess(child.args, status, out.read_text(), err.read_text())

    def spawn(self, args, cwd: Path, env: dict, out: Path, err: Optional[Path] = None) -> "ZygoteChild":
        """`python -m sweeper *args` started, its stdout in `out` and its stderr in `err` (None: in
        `out` too, as Popen's stderr=STDOUT); one run at a time (the zygote waits for its child)."""
        import json

        if self._proc is None or self._proc.poll() is not None:
            # The session's environment, not this run's: the zygote's sys.path (PYTHONPATH) is every
            # later child's base, and must not keep one test's folder on it.
            self._proc = subprocess.Popen([sys.executable, "-c", ZYGOTE_SCRIPT], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, cwd=REPO,
                                          env={**os.environ, **SESSION_RAY.env()})
        assert self._running is None or self._running.poll() is not None, "the zygote runs one sweep at a time"
        request = {"args": list(args), "cwd": str(cwd), "env": env, "out": str(out), "err": str(err or out)}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        self._running = ZygoteChild(["python", "-m", "sweeper", *args], self._reply()["pid"], out,
                                    lambda: self._reply()["status"])
        return self._running

    def _reply(self) -> dict:
        """The zygote's next reply (a line of its own; anything an import printed is passed over)."""
        import json

        while True:
            line = self._proc.stdout.readline()
            if not line:
                raise RuntimeError("the test session's zygote process ended")
            if line.startswith("zygote: "):
                return json.loads(line[len("zygote: "):])

    def output_folder(self) -> Path:
        """A folder for a signalled run's output, removed when the zygote stops (the test reads the
        output while the run goes on and after it ends)."""
        folder = Path(tempfile.mkdtemp(prefix="sweeper-run-"))
        self._folders.append(folder)
        return folder

    def stop(self) -> None:
        if self._running is not None and self._running.poll() is None:
            self._running.kill()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        for folder in self._folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._folders.clear()


class ZygoteChild:
    """A run forked from the zygote, used as the tests use subprocess.Popen(stdout=PIPE,
    stderr=STDOUT, text=True): pid, poll, wait, send_signal, kill, communicate, returncode and
    stdout.read() (its output so far)."""

    def __init__(self, args, pid: int, out: Path, status):
        import threading

        self.args, self.pid, self.returncode, self._out = args, pid, None, out
        self._ended = threading.Event()

        def wait_for_status():
            self.returncode = status()
            self._ended.set()

        threading.Thread(target=wait_for_status, daemon=True).start()

    @property
    def stdout(self):
        return self

    def read(self) -> str:
        return self._out.read_text() if self._out.exists() else ""

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: Optional[float] = None):
        self.wait(timeout)
        return self.read(), None


# The zygote: imports, then for each request line forks a child and reports its pid, then its exit status.
ZYGOTE_SCRIPT = """
import json, os, sys, traceback
import sweeper.__main__ as cli
import sweeper.driver.train_sweep, sweeper.driver.inference  # noqa: F401 - what every run imports
import mlflow  # noqa: F401
base_path = [p for p in sys.path if p not in ("", os.getcwd())]
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(err if request["err"] != request["out"] else out, 2)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[:] = [request["cwd"], *extra, *[p for p in base_path if p not in extra]]
            sys.argv = [cli.__file__, *request["args"]]
            cli.cli()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    print("zygote: " + json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print("zygote: " + json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
"""

ZYGOTE = Zygote()


def joined_process(args, cwd: Path, env=None):
    """`python -m sweeper *args` started in `cwd`, joining the session's Ray, to be signalled or killed:
    a Popen-like process (stdout and stderr together), forked from the zygote (see run_cli); its
    default store starts as the session's empty store."""
    seed_default_store(args, cwd)
    args, merged = joining_session_ray(args, env)
    if os.environ.get("SWEEPER_TEST_NO_ZYGOTE"):
        return subprocess.Popen([sys.executable, "-m", "sweeper", *args], cwd=cwd, env=merged,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = ZYGOTE.output_folder() / "output"
    return ZYGOTE.spawn(args, cwd, merged, out)


def recorded(db: Path, prefix: str) -> int:
    """How many complete child runs the MLflow store `db` holds whose key starts with `prefix` (0 while the
    store does not exist yet), read without MLflow so a test can poll a running sweep's store."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return con.execute("select count(*) from tags where key='sweeper.trial_key' and value like ?",
                               (prefix + "%",)).fetchone()[0]
    except sqlite3.Error:
        return 0


def interrupt_once_recorded(args, cwd: Path, prefix: str, timeout: float = 300) -> str:
    """Run `python -m sweeper *args` joining the session's Ray in `cwd`, send it SIGINT once a run keyed
    `prefix`... is recorded, and return its output; asserts it ended as an interrupted sweep does (130)."""
    import signal

    proc = joined_process(args, cwd, {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    deadline = time.time() + timeout
    while recorded(cwd / "mlflow.db", prefix) < 1:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, f"no {prefix}... run recorded in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    return out



# -- a sweep as a process of its own, to signal or kill, and its record read back ----------------------


def start_sweep(cwd: Path, *overrides: str, own_ray: bool = True, env=None):
    """`python -m sweeper *overrides` in `cwd` as a process to signal or kill (stdout and stderr
    together): with a Ray of its own by default (a driver that must also stop the Ray it started),
    or joining the session's (`own_ray=False`). `env` adds to the environment (default: this
    repository on PYTHONPATH, where Ray's workers import the tests' models)."""
    env = env or {"PYTHONPATH": str(REPO)}
    if not own_ray:
        return joined_process(list(overrides), cwd, env)
    seed_default_store(overrides, cwd)
    return subprocess.Popen([sys.executable, "-m", "sweeper", *overrides], cwd=cwd, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_while_running(proc, done, what: str, timeout: float = 300, every: float = 1.0) -> None:
    """Until done() is true; fails if the sweep `proc` ends first or `timeout` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if done():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def sweep_runs(folder: Path, uri: Optional[str] = None) -> tuple:
    """The sweeps (parent runs) and complete points (a half-written run is not one) of experiment
    `sweeper` in the store at `uri`, else folder/mlflow.db; ([], []) while there is none."""
    from mlflow.tracking import MlflowClient

    db = Path(folder) / "mlflow.db"
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


def nothing_running(folder: Path, uri: Optional[str] = None) -> bool:
    """No run of experiment `sweeper` is left RUNNING in the store (as sweep_runs finds it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri or f"sqlite:///{Path(folder) / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeper")
    return [r.info.run_name for r in client.search_runs([exp.experiment_id], max_results=1000)
            if r.info.status == "RUNNING"] == []


def end_processes_in(folder: Path) -> None:
    """End what a killed driver left running (Ray's agents, which outlive their raylet for a while):
    the processes whose working folder is `folder` or below, by id, never `ray stop` (it would end
    every Ray on the machine)."""
    import psutil

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


def sleepy_model(started: Optional[Path] = None) -> list:
    """The overrides of tests.unit.test_training.Sleepy, a forward of 20 ms per micro-batch, so a point
    lasts seconds: long enough to be interrupted in the middle. With `started`, the first training
    forward of a point creates that file (wait for it to know a point is training)."""
    model = ["model=custom", "model._target_=tests.unit.test_training.Sleepy", "model.input_shape=[1,8,8]"]
    return model + ([f"+model.kwargs.started={started}"] if started is not None else [])
