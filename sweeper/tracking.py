"""MLflow: one parent run per sweep, one nested child run per point, written from the driver only.

The only module that imports MLflow. The names it records are sweeper/schema.py's (docs/mlflow.md).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import math
import os
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from sweeper.journal import Journal
from sweeper.plan import GridPoint
from sweeper.schema import FrontierResult, InferenceResult, PointResult, Record, SweepSummary

MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
# A point's run is a sweep's record only once its identity is written, last: resume measures a
# point again whose run lacks it (a driver killed halfway through writing it).
IDENTITY_TAG = "sweeper.trial_key"
# Bumped when what a sweep leaves for `sweep.resume` (Ray Tune's pickled state, the tags) changes
# shape; a sweep of another format is refused, not half-resumed.
RESUME_FORMAT = "2"
# sweep.strategy=smart's measurement runs, and the file that keeps each one's whole result.
MEASUREMENT_ROLES, MEASUREMENT_FILE = ("throughput", "rung", "trunk", "branch"), "result.json"
RESULT_TYPES = {"point": PointResult, "inference": InferenceResult}
# MLflow 3's kind of experiment: model training, not GenAI (traces, judges, prompts). Set on experiments
# that lack it. MLflow 3.17.2's web UI picks its view by a per-browser toggle instead (docs/mlflow.md).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The command line that launched this process's sweep, beside its config.yaml: artifact name -> text,
# credentials already redacted. Set by __main__ per job (record_launch); a library user has none.
_launch: Dict[str, str] = {}


@dataclass(frozen=True)
class DatasetRecord:
    """The data every point of a sweep trained on, logged as each point's MLflow dataset input (the runs
    table's Datasets column): its name, where it comes from, a digest, and the split sizes."""

    name: str
    source: str
    train_samples: int
    val_samples: int
    # A fingerprint of the data's config and split sizes (not of its bytes): equal for equal data.
    digest: str

    @classmethod
    def of(cls, name: str, source: str, config: Dict[str, Any], train_samples: int, val_samples: int
           ) -> "DatasetRecord":
        import hashlib

        key = json.dumps({"name": name, "source": source, "config": config, "train": train_samples,
                          "val": val_samples}, sort_keys=True, default=str)
        return cls(name, source, train_samples, val_samples, hashlib.sha256(key.encode()).hexdigest()[:8])


def record_launch(files: Dict[str, str]) -> None:
    """The launch files (e.g. Hydra's `overrides.yaml`, `command.txt`) the next sweep's parent run
    records beside `config.yaml`. __main__ calls it once per job, before the job's sweep starts."""
    _launch.clear()
    _launch.update(files)


@dataclass(frozen=True)
class Monitor:
    """MLflow's system-metrics monitor (CPU, memory, disk, network; GPU through pynvml) on the
    parent run while the sweep runs. `node`: a label in the names (system/<node>/...), for a driver
    on a cluster. MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides `interval_seconds`."""

    node: Optional[str] = None
    interval_seconds: float = 10.0

    @classmethod
    def for_driver(cls, on_cluster: bool) -> "Optional[Monitor]":
        """The sweep driver's monitor: labelled with this host's name when it joined a cluster (other
        nodes' figures are the points' own utilization metrics); None when the user turned MLflow's
        system metrics off (MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false)."""
        if os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() in ("false", "0"):
            return None
        return cls(node=socket.gethostname() if on_cluster else None)


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


@dataclass(frozen=True)
class SweepRecord:
    """A sweep read back from MLflow: its parent run and one row per child run (params, metrics and
    the sweeper tags, plus `key` and `status`)."""

    run_id: str
    run_name: str
    params: Dict[str, str]
    children: List[Dict[str, Any]]


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


class Tracker:
    """The sweep's record: one parent run, one child per point; writes the store cannot take go to a
    journal (sweeper.journal) and are replayed at the end or on resume."""

    @classmethod
    def for_sweep(cls, uri: str, ref: str) -> "Tuple[Tracker, str]":
        """A tracker on the experiment holding sweep `ref` (a parent run id, or an experiment name
        meaning its latest sweep), and that sweep's run id. LookupError if there is none."""
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

    def __init__(self, uri: str, experiment_name: str, journal_dir: Optional[str] = None,
                 monitor: Optional[Monitor] = None):
        # A tracking server that went away would hold each write ~4 minutes in the client's retries
        # (7 retries, backoff factor 2, 120 s a try); the journal keeps what fails, so fail fast.
        for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                            ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")):
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.journal_dir = journal_dir or default_journal_dir(uri)
        with _store_lock(uri):
            self.client = MlflowClient(tracking_uri=uri)
            experiment = self.client.get_experiment_by_name(experiment_name)
            if experiment is None:
                self.experiment_id = self.client.create_experiment(
                    experiment_name, artifact_location=artifacts_beside_store(uri, experiment_name),
                    tags=dict([EXPERIMENT_KIND]))
            else:
                self.experiment_id = experiment.experiment_id
                if EXPERIMENT_KIND[0] not in experiment.tags:
                    self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)
        self.parent_run_id: Optional[str] = None
        self.journal: Optional[Journal] = None
        self.monitor = monitor
        self._monitor: Optional[Any] = None  # the running SystemMetricsMonitor
        self._context: Optional[Dict[str, str]] = None
        # The sweep's data (set by the driver once it has loaded it): each point's run logs it as an input.
        self.dataset: Optional[DatasetRecord] = None

    # ---------------------------------------------------------------------------------------------
    # The parent run

    def start_sweep(self, run_name: str, params: Dict[str, Any], config_yaml: str, task: str = "train",
                    config_hash: Optional[str] = None) -> str:
        tags = {
            "sweeper.role": "sweep", "sweeper.task": task, "sweeper.resume_format": RESUME_FORMAT,
            # The Ray Tune experiment of the same name holds the sweep's worker groups: how a resume finds it.
            "sweeper.ray_experiment": run_name,
        }
        if config_hash:
            tags["sweeper.config_hash"] = config_hash
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={**self.context_tags(), **tags})
        self._attach(run.info.run_id)
        self._log_params(self.parent_run_id, params)
        self.client.log_text(self.parent_run_id, config_yaml, "config.yaml")
        for name, text in _launch.items():
            self.client.log_text(self.parent_run_id, text, name)
        self.start_monitor()
        return self.parent_run_id

    def context_tags(self) -> Dict[str, str]:
        """MLflow's own context tags, as `mlflow.start_run` would set them (`MlflowClient.create_run`
        resolves none): mlflow.user, mlflow.source.name/type, mlflow.source.git.commit/branch/repoURL
        where the source is in a git checkout. Resolved once per tracker: resolving runs git."""
        if self._context is None:
            from mlflow.tracking.context.registry import resolve_tags

            tags = {k: v for k, v in resolve_tags().items() if k.startswith(("mlflow.user", "mlflow.source."))}
            if "mlflow.source.git.repoURL" in tags:  # a remote URL may carry a token
                tags["mlflow.source.git.repoURL"] = redact(tags["mlflow.source.git.repoURL"])
            self._context = tags
        return self._context

    def start_monitor(self) -> None:
        """MLflow's system-metrics monitor on the parent run, if this tracker was given one; it
        samples this machine until stop_monitor() (called by end_sweep) or the run ends."""
        if self.monitor is None or self._monitor is not None or self.parent_run_id is None:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # resume_logging: a resumed sweep's samples continue after the interrupted run's last step.
        self._monitor = SystemMetricsMonitor(self.parent_run_id, sampling_interval=self.monitor.interval_seconds,
                                             node_id=self.monitor.node, tracking_uri=self.uri, resume_logging=True)
        self._monitor.start()

    def stop_monitor(self) -> None:
        """Stop the monitor and write its last samples (before the run ends: the monitor stops
        itself, losing them, once it sees the run ended). Safe to call more than once."""
        running, self._monitor = self._monitor, None
        if running is not None:
            running.finish()

    def find_sweep(self, ray_experiment: str) -> Optional[Any]:
        """The parent run of the sweep whose Ray Tune experiment is `ray_experiment`, if recorded."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`sweeper.ray_experiment` = '{ray_experiment}'",
            max_results=1,
        )
        return runs[0] if runs else None

    def recorded_config(self, run_id: str) -> Optional[str]:
        """The resolved config a sweep recorded (its `config.yaml` artifact), or None."""
        try:
            # Through this store's client: `runs:/` URIs resolve against MLflow's global tracking URI,
            # which is ./mlflow.db unless set, not tracking.uri (a resume to another store read nothing).
            with tempfile.TemporaryDirectory() as folder:
                with open(self.client.download_artifacts(run_id, "config.yaml", folder)) as f:
                    return f.read()
        except Exception:  # noqa: BLE001 - a sweep without its config cannot be checked: the caller refuses it
            return None

    def resume_sweep(self, run_id: str) -> Tuple[int, int]:
        """Record into an interrupted sweep's parent run again (after the caller checked it is the
        same sweep): its journal replayed, its half-written points ended KILLED. Returns (journal
        writes replayed, points found half-written)."""
        self._attach(run_id)
        self.client.update_run(run_id, status="RUNNING")
        self.start_monitor()
        replayed, _ = self.replay()
        return replayed, self.reconcile()

    def reconcile(self) -> int:
        """End the children a killed driver left RUNNING: complete ones (their identity was written,
        last) as their status says, half-written ones KILLED, so resume measures those again.
        Returns how many were half-written."""
        half = 0
        for run in self.children():
            if run.info.status != "RUNNING":
                continue
            tags = run.data.tags
            if IDENTITY_TAG in tags:
                failed = tags.get("sweeper.status") == "failed"
                self.client.set_terminated(run.info.run_id, "FAILED" if failed else "FINISHED")
            else:
                half += 1
                self.client.set_tag(run.info.run_id, "sweeper.incomplete", "true")
                self.client.set_terminated(run.info.run_id, "KILLED")
        return half

    def log_sweep_params(self, params: Dict[str, Any]) -> None:
        """Parameters known only once the sweep has started (the grid an auto search derived)."""
        self._journaled("sweep_params", {"params": params})

    def log_parent_metrics(self, metrics: Dict[str, float], curves: Optional[Dict[str, List[Tuple[int, float]]]] = None
                           ) -> None:
        """Figures of the whole sweep that have no fixed name (e.g. a knee per model); `curves`, each value
        at its own step (e.g. samples seen: MLflow's chart draws them)."""
        self._journaled("parent_metrics", {"metrics": metrics, **({"curves": curves} if curves else {})})

    def log_artifacts(self, folder: str, path: str) -> None:
        self._journaled("artifacts", {"folder": folder, "path": path})

    def log_frontier(self, label: str, result: FrontierResult, folder: Optional[str] = None) -> None:
        """A frontier search's result on the parent run: `<metric>_w<workers>` (plus the recipe, e.g.
        `_w2_bf16_ckpt`), the reason as a tag, and the files in `folder` (its plot and probes) as
        artifacts under `frontier/`."""
        self._journaled("frontier", {"label": label, "result": result.to_flat(), "folder": folder})

    def end_sweep(self, summary: SweepSummary, status: str) -> Tuple[int, int]:
        """The sweep's closing figures and its end, FINISHED | FAILED | KILLED, after the journal's
        writes; returns (replayed, still pending). With writes still pending the parent is left as it
        is: a later resume replays them and ends it."""
        if self.parent_run_id is None:
            return 0, 0
        self.stop_monitor()
        replayed, pending = self.replay()
        self._journaled("end", {"summary": summary.to_flat(), "status": status})
        return replayed, (self.journal.pending if self.journal else pending)

    def replay(self) -> Tuple[int, int]:
        if self.journal is None:
            return 0, 0
        return self.journal.replay(self._apply)

    @property
    def pending(self) -> int:
        return self.journal.pending if self.journal else 0

    # ---------------------------------------------------------------------------------------------
    # Child runs

    def log_point(self, point: GridPoint, params: Dict[str, Any], result: PointResult,
                  replace_failed: bool = False) -> Optional[str]:
        """One child run for the point (sweeper.role=trial); returns its id, or None if this sweep
        already holds it (a re-delivered result is never recorded twice) or the store could not take
        it now (it is in the journal). `replace_failed`: a point recorded failed is recorded again,
        its old run kept as sweeper.role=superseded."""
        return self._child(point.key, "trial", params, result, replace_failed)

    def log_probe(self, params: Dict[str, Any], result: PointResult) -> Optional[str]:
        """One child run (sweeper.role=probe) per frontier probe: its size, measured peak and
        breakdown, or its out-of-memory. The report and the points table leave probes out."""
        return self._child(result.trial_key, "probe", params, result)

    def log_inference(self, params: Dict[str, Any], result: InferenceResult) -> Optional[str]:
        """One child run (sweeper.role=inference) per inference batch size of a model."""
        return self._child(result.trial_key, "inference", params, result)

    def log_measurement(self, key: str, role: str, params: Dict[str, Any], result: PointResult) -> Optional[str]:
        """sweep.strategy=smart: one child run per measurement run (sweeper.role=throughput | rung), its
        whole result also kept as the run's result.json, so a resumed sweep rebuilds its points from
        what was measured. The report and the points table leave these runs out."""
        return self._child(key, role, params, result)

    def measurements(self, role: str) -> Dict[str, Dict[str, Any]]:
        """This sweep's complete measurement runs of `role`: key -> its result (as it was reported)."""
        out: Dict[str, Dict[str, Any]] = {}
        for run in self.children():
            tags = run.data.tags
            if tags.get("sweeper.role") != role or IDENTITY_TAG not in tags:
                continue
            with tempfile.TemporaryDirectory() as folder:
                path = self.client.download_artifacts(run.info.run_id, MEASUREMENT_FILE, folder)
                with open(path) as f:
                    out[tags[IDENTITY_TAG]] = json.load(f)
        return out

    def recorded_keys(self) -> List[str]:
        """Keys of the points this sweep holds complete (ok, oom or failed alike: each once)."""
        return [r.data.tags[IDENTITY_TAG] for r in self.children()
                if r.data.tags.get("sweeper.role") == "trial" and IDENTITY_TAG in r.data.tags]

    def failed_keys(self) -> List[str]:
        return [r.data.tags[IDENTITY_TAG] for r in self.children() if r.data.tags.get("sweeper.role") == "trial"
                and r.data.tags.get("sweeper.status") == "failed" and IDENTITY_TAG in r.data.tags]

    def children(self) -> List[Any]:
        return self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.parent_run_id}'",
            max_results=10_000,
        )

    # ---------------------------------------------------------------------------------------------
    # Reading a sweep back

    def load_sweep(self, parent_run_id: str) -> SweepRecord:
        """The sweep's parent and its complete points (half-written runs are not a record)."""
        parent = self.client.get_run(parent_run_id)
        runs = self.client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            max_results=10_000,
        )
        children = []
        for run in runs:
            tags = run.data.tags
            if tags.get("sweeper.role") != "trial" or IDENTITY_TAG not in tags:
                continue
            row: Dict[str, Any] = {**run.data.params, **run.data.metrics}
            row.update({k: v for k, v in tags.items() if k.startswith("sweeper.")})
            row["key"] = tags[IDENTITY_TAG]
            row["status"] = tags.get("sweeper.status", "failed")
            children.append(row)
        return SweepRecord(parent_run_id, parent.info.run_name, dict(parent.data.params), children)

    def log_report(
        self,
        run_id: str,
        files: List[str],
        artifact_path: str,
        recommendation: Optional[str] = None,
        override_line: Optional[str] = None,
    ) -> None:
        """The report's files as artifacts under `artifact_path` of the sweep's run (the same names
        replace the files of an earlier build); the sweep's own recommendation also as tags,
        readable in the runs table without opening anything."""
        for path in files:
            self.client.log_artifact(run_id, path, artifact_path)
        if recommendation is not None:
            self.client.set_tag(run_id, "sweeper.recommendation", recommendation[:5000])
        if override_line:
            self.client.set_tag(run_id, "sweeper.recommended_overrides", override_line)

    def log_sweep_metrics(self, run_id: str, metrics: Dict[str, float], tags: Optional[Dict[str, str]] = None) -> None:
        """Figures the report derives from the whole sweep (the critical batch size), written to its
        parent run directly like the report itself (a rebuild has no journal): a rebuild logs them again."""
        self._log_metrics(run_id, metrics)
        self._log_tags(run_id, tags or {})

    def sweep_metrics(self, run_id: str) -> Dict[str, float]:
        """The parent run's metrics by name (e.g. the frontier's `frontier_micro_batch_size_w1`)."""
        return dict(self.client.get_run(run_id).data.metrics)

    # ---------------------------------------------------------------------------------------------
    # Writing, through the journal

    def _attach(self, run_id: str) -> None:
        self.parent_run_id = run_id
        self.journal = Journal(self.journal_dir, run_id)

    def _journaled(self, kind: str, args: Dict[str, Any]) -> Any:
        assert self.journal is not None, "start_sweep() or resume_sweep() first"
        return self.journal.write(kind, args, lambda: self._apply(kind, args))[1]

    def _apply(self, kind: str, args: Dict[str, Any]) -> Any:
        return getattr(self, f"_write_{kind}")(**args)

    def _child(self, key: str, role: str, params: Dict[str, Any], result: Record, replace_failed: bool = False
               ) -> Optional[str]:
        kind = "inference" if isinstance(result, InferenceResult) else "point"
        return self._journaled("child", {"key": key, "role": role, "params": params, "result": result.to_flat(),
                                         "record": kind, "replace_failed": replace_failed})

    def _write_child(self, key: str, role: str, params: Dict[str, Any], result: Dict[str, Any], record: str,
                     replace_failed: bool) -> Optional[str]:
        """Create the run, write its params, metrics and artifacts, then its identity and status (the
        mark of a complete record), then end it."""
        parent = self.parent_run_id
        existing = self._existing_child(key)
        if existing is not None:
            if not (replace_failed and existing.data.tags.get("sweeper.status") == "failed"):
                return None
            # Superseded first: a driver killed between the two writes leaves the point unrecorded
            # (measured again on resume), never recorded twice.
            self.client.set_tag(existing.info.run_id, "sweeper.role", "superseded")
        typed = RESULT_TYPES[record].from_flat(result)
        status = typed.status or "failed"
        # The point's own start and end in its worker, not the moment the driver logs it: the
        # runs table's Duration column then shows how long the point ran (it read ~20 ms).
        started, seconds = typed.get("started_at"), typed.get("trial_seconds")
        start_ms = None if started is None else int(started * 1000)
        end_ms = None if started is None or seconds is None else int((started + seconds) * 1000)
        run = self.client.create_run(self.experiment_id, run_name=key, start_time=start_ms,
                                     tags={**self.context_tags(), "mlflow.parentRunId": parent, "sweeper.role": role})
        run_id = run.info.run_id
        self._log_params(run_id, params)
        self._log_metrics(run_id, typed.metrics(), typed.series(), typed.curves())
        if self.dataset is not None and record == "point":
            self._log_dataset(run_id, self.dataset)
        if role in MEASUREMENT_ROLES:
            self.client.log_dict(run_id, result, MEASUREMENT_FILE)
        trace = getattr(typed, "profile_trace_dir", None)
        if trace and os.path.isdir(trace):
            # A torch.profiler Chrome trace: open in Perfetto or TensorBoard's profiler plugin.
            self.client.log_artifacts(run_id, trace, "profile")
        identity = {**typed.tags(), "sweeper.status": status, IDENTITY_TAG: key}
        oom = getattr(typed, "oom_source", None)
        if oom:
            identity["sweeper.oom"] = oom
        self._log_tags(run_id, identity)
        self.client.set_terminated(run_id, "FAILED" if status == "failed" else "FINISHED", end_time=end_ms)
        return run_id

    def _write_sweep_params(self, params: Dict[str, Any]) -> None:
        self._log_params(self.parent_run_id, params)

    def _write_parent_metrics(self, metrics: Dict[str, float], curves: Optional[Dict[str, list]] = None) -> None:
        curves = {name: [(int(step), float(v)) for step, v in pairs] for name, pairs in (curves or {}).items()}
        self._log_metrics(self.parent_run_id, metrics, None, curves)

    def _write_artifacts(self, folder: str, path: str) -> None:
        self.client.log_artifacts(self.parent_run_id, folder, path)

    def _write_frontier(self, label: str, result: Dict[str, Any], folder: Optional[str]) -> None:
        found = FrontierResult.from_flat(result)
        self._log_metrics(self.parent_run_id, found.metrics(label))
        reasons = {prefix: search.reason for prefix, search in found.searches()}
        tags = {}
        for prefix, name in (("frontier_", "frontier"), ("frontier_accumulating_", "frontier_accumulating")):
            text = reasons.get(prefix) or (found.error if prefix == "frontier_" else None)
            if text:
                tags[f"sweeper.{name}_{label}"] = str(text)[:5000]
        self._log_tags(self.parent_run_id, tags)
        if folder and os.path.isdir(folder):
            self.client.log_artifacts(self.parent_run_id, folder, "frontier")

    def _write_end(self, summary: Dict[str, Any], status: str) -> None:
        self._log_metrics(self.parent_run_id, SweepSummary.from_flat(summary).metrics())
        self.client.set_terminated(self.parent_run_id, status)

    def _existing_child(self, key: str) -> Optional[Any]:
        """This sweep's complete run of `key`, if it holds one (superseded runs are not)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.mlflow.parentRunId = '{self.parent_run_id}' and tags.`{IDENTITY_TAG}` = '{key}' "
                "and tags.`sweeper.role` != 'superseded'"
            ),
            max_results=1,
        )
        return runs[0] if runs else None

    def _log_params(self, run_id: str, params: Dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def _log_dataset(self, run_id: str, dataset: DatasetRecord) -> None:
        """MLflow's dataset input (MlflowClient.log_inputs takes the run id; mlflow.log_input needs an
        active run): a MetaDataset, since the data itself lives in the workers; the split sizes as the
        input's tags beside MLflow's own context tag."""
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        meta = MetaDataset(CodeDatasetSource({"mlflow.source.name": dataset.source}), name=dataset.name,
                           digest=dataset.digest)
        tags = [InputTag("mlflow.data.context", "train"), InputTag("train_samples", str(dataset.train_samples)),
                InputTag("val_samples", str(dataset.val_samples))]
        self.client.log_inputs(run_id, datasets=[DatasetInput(meta._to_mlflow_entity(), tags=tags)])

    def _log_tags(self, run_id: str, tags: Dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def _log_metrics(
        self, run_id: str, values: Dict[str, float], series: Optional[Dict[str, List[float]]] = None,
        curves: Optional[Dict[str, List[Tuple[int, float]]]] = None,
    ) -> None:
        """Numbers by name (step 0), each series with its index as the step, each curve at its own
        steps (e.g. samples seen)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, float(v), now, 0) for name, v in values.items() if v is not None and math.isfinite(v)]
        metrics += [Metric(name, float(v), now, i) for name, vs in (series or {}).items() for i, v in enumerate(vs)]
        metrics += [Metric(name, float(v), now, s) for name, pairs in (curves or {}).items() for s, v in pairs]
        for begin in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(run_id, metrics=metrics[begin : begin + MAX_BATCH])


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
