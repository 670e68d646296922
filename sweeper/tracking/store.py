"""The MLflow store and its URI: checked before any trial starts, opened on one experiment (`Store`), the
folder beside it where reports and the journal go, and its credentials kept out of what is printed.

Imports MLflow inside functions only (`import sweeper` happens in every Ray worker); the rest of
sweeper/tracking/ reaches the store through a `Store`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator, List, Optional, Tuple

# MLflow 3's kind of experiment: model training, not GenAI (traces, judges, prompts). Set on experiments
# that lack it. MLflow 3.17.2's web UI picks its view by a per-browser toggle instead (docs/mlflow.md).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


class Store:
    """An MLflow client on one experiment of the store at `uri`, the experiment created if it is new."""

    def __init__(self, uri: str, experiment_name: str):
        # A tracking server that went away would hold each write ~4 minutes in the client's retries
        # (7 retries, backoff factor 2, 120 s a try); the journal keeps what fails, so fail fast.
        for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                            ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")):
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        with _store_lock(uri):
            self.client: Any = MlflowClient(tracking_uri=uri)
            experiment = self.client.get_experiment_by_name(experiment_name)
            if experiment is None:
                self.experiment_id: str = self.client.create_experiment(
                    experiment_name, artifact_location=artifacts_beside_store(uri, experiment_name),
                    tags=dict([EXPERIMENT_KIND]))
            else:
                self.experiment_id = experiment.experiment_id
                if EXPERIMENT_KIND[0] not in experiment.tags:
                    self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)

    @classmethod
    def holding(cls, uri: str, ref: str) -> "Tuple[Store, str]":
        """The store's experiment holding sweep `ref` (a parent run id, or an experiment name meaning its
        latest sweep), and that sweep's run id. LookupError if there is none."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(ref)
        if experiment is None:
            try:
                run = client.get_run(ref)
            except MlflowException:
                raise LookupError(
                    f"{ref!r} is neither an experiment nor a run in {redact(uri)}: give a sweep's parent run id "
                    "or an experiment name (`mlflow ui` lists both)"
                ) from None
            if run.data.tags.get("sweeper.role") != "sweep":
                raise LookupError(f"run {ref} is not a sweep's parent run (tag sweeper.role=sweep)")
            experiment = client.get_experiment(run.info.experiment_id)
            return cls(uri, experiment.name), ref
        sweeps = client.search_runs(
            [experiment.experiment_id],
            filter_string="tags.`sweeper.role` = 'sweep'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not sweeps:
            raise LookupError(f"experiment {ref!r} holds no sweep in {redact(uri)}")
        return cls(uri, ref), sweeps[0].info.run_id


def check(uri: str, must_exist: bool = False) -> List[str]:
    """Problems reaching the tracking store, found before any trial starts. `must_exist`: a SQLite
    store must already be there (reading a sweep back; MLflow would create an empty one)."""
    if uri.startswith(("http://", "https://")):
        return _check_server(uri)
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            return [
                f"tracking.uri={uri!r}: folder {folder!r} does not exist or is not writable; "
                "create it or choose another path"
            ]
        if must_exist and not os.path.isfile(path):
            return [
                f"tracking.uri={uri!r}: no MLflow store there; run from the folder the sweep ran in, "
                "or pass --tracking-uri sqlite:///<path to its mlflow.db>"
            ]
    return []


def _check_server(uri: str) -> List[str]:
    """The server answers /health (which an authenticating server leaves open) and then an API call
    with the credentials MLflow's client will send (MLFLOW_TRACKING_USERNAME / _PASSWORD)."""
    base = uri.rstrip("/")
    for path in ("/health", "/api/2.0/mlflow/experiments/search?max_results=1"):
        request = urllib.request.Request(base + path)
        user, secret = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
        if user and secret:
            token = base64.b64encode(f"{user}:{secret}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5):
                continue
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                return [
                    f"tracking.uri={redact(uri)!r} asks for a login (HTTP {exc.code}): set MLFLOW_TRACKING_USERNAME "
                    "and MLFLOW_TRACKING_PASSWORD (or give them in the URI, http://user:password@host)"
                ]
            reason = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
        return [
            f"tracking.uri={redact(uri)!r} is unreachable ({reason}): start the server (`mlflow server "
            "--host 127.0.0.1 --port 5000`) or set tracking.uri=null for a local SQLite store"
        ]
    return []


def artifacts_beside_store(uri: str, experiment_name: str) -> Optional[str]:
    """Where a new experiment of a SQLite store keeps its artifacts: MLflow's default, ./mlruns, is the
    working directory's, which for a sweep run as a Ray job (`ray job submit --working-dir .`) is a
    temporary copy Ray unpacks per job: its config.yaml, which a resume compares, and its report were
    then lost. Beside the store instead when the store is elsewhere; None (MLflow's default) otherwise."""
    if not uri.startswith("sqlite:///"):
        return None
    folder = os.path.dirname(os.path.abspath(uri[len("sqlite:///"):]))
    if folder == os.path.abspath(os.getcwd()):
        return None  # ./mlruns, beside the store already
    return os.path.join(folder, "mlruns", experiment_name)


def store_errors() -> Tuple[type, ...]:
    """What the store raises when it refuses a request (a run or experiment that is not there, a bad
    id), for callers that catch it without importing MLflow."""
    from mlflow.exceptions import MlflowException

    return (MlflowException,)


def default_journal_dir(uri: str) -> str:
    """Beside the store: `<store folder>/.sweeper/journal` for SQLite or a file store, else
    `./.sweeper/journal`."""
    return os.path.join(store_folder(uri), ".sweeper", "journal")


def store_folder(uri: str) -> str:
    """The folder a local store lives in (its reports and journal go beside it); `.` for a server."""
    if uri.startswith("sqlite:///"):
        return os.path.dirname(uri[len("sqlite:///"):]) or "."
    if uri.startswith("file://"):
        return os.path.dirname(uri[len("file://"):].rstrip("/")) or "."
    return "."


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Creating a fresh SQLite store is not safe from two processes at once (one dies with `table
    params already exists`): hold a file lock beside it while the first client creates it."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    with open(uri[len("sqlite:///"):] + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def password(uri: str) -> Optional[str]:
    return urllib.parse.urlsplit(uri).password


def credentials_to_environment(uri: str) -> str:
    """`http://user:password@host` -> `http://host`, the user and password moved to MLflow's own
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD: the client would otherwise print the password
    in its "View run at" lines and errors. Other URIs are returned as they are."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None:
        return uri
    os.environ["MLFLOW_TRACKING_USERNAME"] = urllib.parse.unquote(parts.username)
    if parts.password is not None:
        os.environ["MLFLOW_TRACKING_PASSWORD"] = urllib.parse.unquote(parts.password)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def redact(uri: str) -> str:
    """The URI with any password replaced by ***, for printing and recording."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
