"""Writing a sweep to MLflow: one parent run per sweep, one nested child run per point, from the driver
only. Every write goes through the journal (sweeper/tracking/journal.py): one the store cannot take now
is kept on disk and replayed at the end or on resume, and a point's identity tag is written last, so a
driver killed between two writes leaves the point unrecorded (measured again), never half-recorded.

The names it records are sweeper/schema.py's (docs/mlflow.md). Imports MLflow inside functions only.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from sweeper.plan import GridPoint
from sweeper.schema import FrontierResult, InferenceResult, PointResult, Record, SweepSummary
from sweeper.tracking.journal import Journal
from sweeper.tracking.monitor import Monitor
from sweeper.tracking.read import IDENTITY_TAG, MEASUREMENT_FILE, MEASUREMENT_ROLES, SweepReader
from sweeper.tracking.store import Store, default_journal_dir, redact

MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
# Bumped when what a sweep leaves for `sweep.resume` (Ray Tune's pickled state, the tags) changes
# shape; a sweep of another format is refused, not half-resumed.
RESUME_FORMAT = "2"
RESULT_TYPES = {"point": PointResult, "inference": InferenceResult}
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


class Tracker:
    """The sweep's writes: one parent run, one child per point; writes the store cannot take go to a
    journal and are replayed at the end or on resume. Reading the sweep back is `reader`'s."""

    def __init__(self, uri: str, experiment_name: str, journal_dir: Optional[str] = None,
                 monitor: Optional[Monitor] = None):
        self.store = Store(uri, experiment_name)
        self.journal_dir = journal_dir or default_journal_dir(uri)
        self.parent_run_id: Optional[str] = None
        self.journal: Optional[Journal] = None
        self.monitor = monitor
        self._monitor: Optional[Any] = None  # the running SystemMetricsMonitor
        self._context: Optional[Dict[str, str]] = None
        # The sweep's data (set by the driver once it has loaded it): each point's run logs it as an input.
        self.dataset: Optional[DatasetRecord] = None

    @property
    def _client(self) -> Any:
        return self.store.client

    @property
    def reader(self) -> SweepReader:
        """The sweep this tracker writes, read back (start_sweep() or resume_sweep() first)."""
        assert self.parent_run_id is not None, "start_sweep() or resume_sweep() first"
        return SweepReader(self.store, self.parent_run_id)

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
        run = self._client.create_run(self.store.experiment_id, run_name=run_name, tags={**self.context_tags(), **tags})
        self._attach(run.info.run_id)
        _log_params(self._client, self.parent_run_id, params)
        self._client.log_text(self.parent_run_id, config_yaml, "config.yaml")
        for name, text in _launch.items():
            self._client.log_text(self.parent_run_id, text, name)
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
        self._monitor = self.monitor.start(self.store.uri, self.parent_run_id)

    def stop_monitor(self) -> None:
        """Stop the monitor and write its last samples (before the run ends: the monitor stops
        itself, losing them, once it sees the run ended). Safe to call more than once."""
        running, self._monitor = self._monitor, None
        if running is not None:
            running.finish()

    def resume_sweep(self, run_id: str) -> Tuple[int, int]:
        """Record into an interrupted sweep's parent run again (after the caller checked it is the
        same sweep): its journal replayed, its half-written points ended KILLED. Returns (journal
        writes replayed, points found half-written)."""
        self._attach(run_id)
        self._client.update_run(run_id, status="RUNNING")
        self.start_monitor()
        replayed, _ = self.replay()
        return replayed, self.reconcile()

    def reconcile(self) -> int:
        """End the children a killed driver left RUNNING: complete ones (their identity was written,
        last) as their status says, half-written ones KILLED, so resume measures those again.
        Returns how many were half-written."""
        half = 0
        for run in self.reader.children():
            if run.info.status != "RUNNING":
                continue
            tags = run.data.tags
            if IDENTITY_TAG in tags:
                failed = tags.get("sweeper.status") == "failed"
                self._client.set_terminated(run.info.run_id, "FAILED" if failed else "FINISHED")
            else:
                half += 1
                self._client.set_tag(run.info.run_id, "sweeper.incomplete", "true")
                self._client.set_terminated(run.info.run_id, "KILLED")
        return half

    def log_sweep_params(self, params: Dict[str, Any]) -> None:
        """Parameters known only once the sweep has started (the grid an auto search derived)."""
        self._journaled("sweep_params", {"params": params})

    def log_parent_metrics(self, metrics: Dict[str, float], curves: Optional[Dict[str, List[Tuple[int, float]]]] = None
                           ) -> None:
        """Figures of the whole sweep that have no fixed name (e.g. a knee per model); `curves`, each value
        at its own step (e.g. samples seen: MLflow's chart draws them)."""
        self._journaled("parent_metrics", {"metrics": metrics, **({"curves": curves} if curves else {})})

    def log_sweep_tags(self, tags: Dict[str, str]) -> None:
        """Tags on the parent run known only once the sweep has measured (e.g. where a bandwidth came from)."""
        self._journaled("sweep_tags", {"tags": tags})

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
            self._client.set_tag(existing.info.run_id, "sweeper.role", "superseded")
        typed = RESULT_TYPES[record].from_flat(result)
        status = typed.status or "failed"
        # The point's own start and end in its worker, not the moment the driver logs it: the
        # runs table's Duration column then shows how long the point ran (it read ~20 ms).
        started, seconds = typed.get("started_at"), typed.get("trial_seconds")
        start_ms = None if started is None else int(started * 1000)
        end_ms = None if started is None or seconds is None else int((started + seconds) * 1000)
        run = self._client.create_run(self.store.experiment_id, run_name=key, start_time=start_ms,
                                      tags={**self.context_tags(), "mlflow.parentRunId": parent, "sweeper.role": role})
        run_id = run.info.run_id
        _log_params(self._client, run_id, params)
        _log_metrics(self._client, run_id, typed.metrics(), typed.series(), typed.curves())
        if self.dataset is not None and record == "point":
            self._log_dataset(run_id, self.dataset)
        if role in MEASUREMENT_ROLES:
            self._client.log_dict(run_id, result, MEASUREMENT_FILE)
        trace = getattr(typed, "profile_trace_dir", None)
        if trace and os.path.isdir(trace):
            # A torch.profiler Chrome trace: open in Perfetto or TensorBoard's profiler plugin.
            self._client.log_artifacts(run_id, trace, "profile")
        identity = {**typed.tags(), "sweeper.status": status, IDENTITY_TAG: key}
        oom = getattr(typed, "oom_source", None)
        if oom:
            identity["sweeper.oom"] = oom
        _log_tags(self._client, run_id, identity)
        self._client.set_terminated(run_id, "FAILED" if status == "failed" else "FINISHED", end_time=end_ms)
        return run_id

    def _write_sweep_params(self, params: Dict[str, Any]) -> None:
        _log_params(self._client, self.parent_run_id, params)

    def _write_sweep_tags(self, tags: Dict[str, str]) -> None:
        _log_tags(self._client, self.parent_run_id, tags)

    def _write_parent_metrics(self, metrics: Dict[str, float], curves: Optional[Dict[str, list]] = None) -> None:
        curves = {name: [(int(step), float(v)) for step, v in pairs] for name, pairs in (curves or {}).items()}
        _log_metrics(self._client, self.parent_run_id, metrics, None, curves)

    def _write_artifacts(self, folder: str, path: str) -> None:
        self._client.log_artifacts(self.parent_run_id, folder, path)

    def _write_frontier(self, label: str, result: Dict[str, Any], folder: Optional[str]) -> None:
        found = FrontierResult.from_flat(result)
        _log_metrics(self._client, self.parent_run_id, found.metrics(label))
        reasons = {prefix: search.reason for prefix, search in found.searches()}
        tags = {}
        for prefix, name in (("frontier_", "frontier"), ("frontier_accumulating_", "frontier_accumulating")):
            text = reasons.get(prefix) or (found.error if prefix == "frontier_" else None)
            if text:
                tags[f"sweeper.{name}_{label}"] = str(text)[:5000]
        _log_tags(self._client, self.parent_run_id, tags)
        if folder and os.path.isdir(folder):
            self._client.log_artifacts(self.parent_run_id, folder, "frontier")

    def _write_end(self, summary: Dict[str, Any], status: str) -> None:
        _log_metrics(self._client, self.parent_run_id, SweepSummary.from_flat(summary).metrics())
        self._client.set_terminated(self.parent_run_id, status)

    def _existing_child(self, key: str) -> Optional[Any]:
        """This sweep's complete run of `key`, if it holds one (superseded runs are not)."""
        runs = self._client.search_runs(
            [self.store.experiment_id],
            filter_string=(
                f"tags.mlflow.parentRunId = '{self.parent_run_id}' and tags.`{IDENTITY_TAG}` = '{key}' "
                "and tags.`sweeper.role` != 'superseded'"
            ),
            max_results=1,
        )
        return runs[0] if runs else None

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
        self._client.log_inputs(run_id, datasets=[DatasetInput(meta._to_mlflow_entity(), tags=tags)])


def log_report(store: Store, run_id: str, files: List[str], artifact_path: str, recommendation: Optional[str] = None,
               override_line: Optional[str] = None) -> None:
    """The report's files as artifacts under `artifact_path` of the sweep's run (the same names
    replace the files of an earlier build); the sweep's own recommendation also as tags,
    readable in the runs table without opening anything. Written directly, like every write of a
    report rebuilt from MLflow alone (it has no journal)."""
    for path in files:
        store.client.log_artifact(run_id, path, artifact_path)
    if recommendation is not None:
        store.client.set_tag(run_id, "sweeper.recommendation", recommendation[:5000])
    if override_line:
        store.client.set_tag(run_id, "sweeper.recommended_overrides", override_line)


def log_sweep_metrics(store: Store, run_id: str, metrics: Dict[str, float], tags: Optional[Dict[str, str]] = None
                      ) -> None:
    """Figures the report derives from the whole sweep (the critical batch size), written to its
    parent run directly like the report itself (a rebuild has no journal): a rebuild logs them again."""
    _log_metrics(store.client, run_id, metrics)
    _log_tags(store.client, run_id, tags or {})


def _log_params(client: Any, run_id: str, params: Dict[str, Any]) -> None:
    from mlflow.entities import Param

    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])


def _log_tags(client: Any, run_id: str, tags: Dict[str, str]) -> None:
    from mlflow.entities import RunTag

    if tags:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def _log_metrics(
    client: Any, run_id: str, values: Dict[str, float], series: Optional[Dict[str, List[float]]] = None,
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
        client.log_batch(run_id, metrics=metrics[begin : begin + MAX_BATCH])
