"""What Ray reads once per process, decided in one place and set before anything imports Ray: its auth
token (for the local Ray sweeper starts, or the cluster it joins), usage stats, Tune's console and loggers.

Ray reads these variables when it is first imported (its C++ token loader caches them), so `prepare()`
runs before the driver imports Ray at all: `sweeper.__main__` calls it before the task's modules are
imported, and `connect()` again (it is idempotent). Imports no Ray, by design; tests/unit/test_ray_environment.py
fails if anything on the driver's way to `connect()` imports Ray first.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from sweeper.config import ClusterConfig

AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_FILE = "auth_token"


@dataclass(frozen=True)
class RayEnvironment:
    """The token this process sends to Ray, and where it came from (named in a refused join's error)."""

    token_path: Optional[str]  # the token file; None: no file (no token, or RAY_AUTH_TOKEN itself)
    token_source: str  # e.g. "cluster.ray_dir", "RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token", "none"
    auth_mode: Optional[str]  # RAY_AUTH_MODE as set for Ray ("token", "disabled") or None: Ray's default

    def describe_token(self) -> str:
        if self.token_source == "none":
            return "no token was sent (none in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
        if self.token_path is None:
            return f"the token was {self.token_source}"
        return f"the token sent was {self.token_path} (from {self.token_source})"


def prepare(cfg: ClusterConfig) -> RayEnvironment:
    """Set what Ray reads once per process; the token it will send. Called before Ray is imported."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Tune's own console tables would interleave with sweeper's progress bar and summary.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune's automatic CSV, JSON and TensorBoard loggers (read by tune.run, inside Tuner.fit() in this
    # process) would write progress.csv, result.json and events.out.tfevents per trial; a trial is a
    # worker group of several points, so their curves would join unrelated points. The points' record
    # is MLflow. TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=0 in the environment brings them back.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    if cfg.address is None:
        return _local(os.path.abspath(cfg.ray_dir))
    return _joined()


def _local(ray_dir: str) -> RayEnvironment:
    """A new local Ray: Ray 2.60 turns token auth on for it and would write the token to
    ~/.ray/auth_token; it is kept with the rest of this tool's Ray files instead (`write_token`, just
    before Ray starts, so a run refused before then leaves no file)."""
    path = os.path.join(ray_dir, TOKEN_FILE)
    # Forced, not a default: a token path inherited from elsewhere would not be this Ray's.
    os.environ[TOKEN_PATH] = path
    os.environ.setdefault(AUTH_MODE, "token")
    return RayEnvironment(path, "cluster.ray_dir", os.environ[AUTH_MODE])


def write_token(env: RayEnvironment) -> None:
    """The local Ray's token file, made if missing (Ray reads it at ray.init, not at import)."""
    if env.token_source != "cluster.ray_dir" or env.token_path is None or os.path.exists(env.token_path):
        return
    os.makedirs(os.path.dirname(env.token_path), exist_ok=True)
    try:
        fd = os.open(env.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another sweep in this folder made it first: share it
        return
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # as Ray's own generator: 256 bits


def _joined() -> RayEnvironment:
    """An existing cluster: the token the user points at, else the one `ray start` on this machine uses.

    Ray turns token auth on for a joining driver only when it finds a local cluster by itself
    (address auto), never for an explicit address; but `ray start --head` turns it on whenever
    ~/.ray/auth_token exists. So `ray start --head` then `cluster.address=HOST:PORT` was refused
    ("InvalidAuthToken") although both read the same file. With a token available and RAY_AUTH_MODE
    unset, token mode is turned on here for every address: a cluster without auth accepts the header.
    """
    path, source = _available_token()
    if source != "none":
        os.environ.setdefault(AUTH_MODE, "token")
    mode = os.environ.get(AUTH_MODE)
    if mode is not None and mode.lower() == "disabled":
        return RayEnvironment(None, "none", mode)
    return RayEnvironment(path, source, mode)


def _available_token() -> Tuple[Optional[str], str]:
    """(token file, where it came from) as Ray looks for a token: the variable, the path, the default file."""
    if os.environ.get(TOKEN):
        return None, "the RAY_AUTH_TOKEN variable"
    if os.environ.get(TOKEN_PATH):
        return os.environ[TOKEN_PATH], "RAY_AUTH_TOKEN_PATH"
    default = Path.home() / ".ray" / TOKEN_FILE
    return (str(default), "~/.ray/auth_token, Ray's default") if default.is_file() else (None, "none")


# Set by Ray's job supervisor in the environment of a job's entrypoint (`ray job submit`, a KubeRay RayJob).
JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})


def job_shell() -> Optional[str]:
    """The shell between Ray's job supervisor and this driver when it runs as a Ray job's entrypoint
    without `exec` (None otherwise, or off Linux). Ray runs the entrypoint with `sh -c` and `ray job stop`
    signals the shell and the driver together: the shell dies at once, the driver ends its sweep and exits
    orphaned, and the supervisor waits for that orphan's zombie until the node's init reaps it (1.5-2 s on
    this machine's init, unknown in a pod's), within RAY_JOB_STOP_WAIT_TIME_S (3 s by default) or the job
    is force-killed. With `exec python -m sweeper ...` the driver is the supervisor's own child, reaped the
    moment it exits."""
    if JOB_CONFIG not in os.environ:
        return None
    try:
        name = Path(f"/proc/{os.getppid()}/comm").read_text().strip()
    except OSError:
        return None
    return name if name in SHELLS else None
