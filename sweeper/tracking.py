"""MLflow: one parent run per sweep, one nested child run per point, written from the driver only.

The only module that imports MLflow. The names it records are sweeper/schema.py's (docs/mlflow.md).
"""

from __future__ import annotations

import math
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from sweeper.plan import GridPoint
from sweeper.schema import FrontierResult, InferenceResult, PointResult, Record, SweepSummary

MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call


def check(uri: str, must_exist: bool = False) -> List[str]:
    """Problems reaching the tracking store, found before any trial starts. `must_exist`: a SQLite
    store must already be there (reading a sweep back; MLflow would create an empty one)."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as reply:
                if reply.status == 200:
                    return []
                reason = f"HTTP {reply.status}"
        except (urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
        return [
            f"tracking.uri={uri!r} is unreachable ({reason}): start the server (`mlflow server "
            "--host 127.0.0.1 --port 5000`) or set tracking.uri=null for a local SQLite store"
        ]
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


@dataclass(frozen=True)
class SweepRecord:
    """A sweep read back from MLflow: its parent run and one row per child run (params, metrics and
    the sweeper tags, plus `key` and `status`)."""

    run_id: str
    run_name: str
    params: Dict[str, str]
    children: List[Dict[str, Any]]


class Tracker:
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
                    f"{ref!r} is neither an experiment nor a run in {uri}: give a sweep's parent run id "
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
            raise LookupError(f"experiment {ref!r} holds no sweep in {uri}")
        return cls(uri, ref), sweeps[0].info.run_id

    def __init__(self, uri: str, experiment_name: str):
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        self.experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(experiment_name)
        )
        self.parent_run_id: Optional[str] = None

    def start_sweep(self, run_name: str, params: Dict[str, Any], config_yaml: str, task: str = "train") -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            # The Ray Tune experiment of the same name holds the sweep's trials: how a resume finds it.
            tags={"sweeper.role": "sweep", "sweeper.ray_experiment": run_name, "sweeper.task": task},
        )
        self.parent_run_id = run.info.run_id
        self._log_params(self.parent_run_id, params)
        self.client.log_text(self.parent_run_id, config_yaml, "config.yaml")
        return self.parent_run_id

    def log_point(self, point: GridPoint, params: Dict[str, Any], result: PointResult) -> Optional[str]:
        """One child run for the point (sweeper.role=trial); returns its id, or None if this sweep
        already holds it (a re-delivered result is never recorded twice)."""
        return self._log_child(point.key, "trial", params, result)

    def log_probe(self, params: Dict[str, Any], result: PointResult) -> Optional[str]:
        """One child run (sweeper.role=probe) per frontier probe: its size, measured peak and
        breakdown, or its out-of-memory. The report and the points table leave probes out."""
        return self._log_child(result.trial_key, "probe", params, result)

    def log_inference(self, params: Dict[str, Any], result: InferenceResult) -> Optional[str]:
        """One child run (sweeper.role=inference) per inference batch size of a model."""
        return self._log_child(result.trial_key, "inference", params, result)

    def log_parent_metrics(self, metrics: Dict[str, float]) -> None:
        """Figures of the whole sweep that have no fixed name (e.g. a knee per model)."""
        assert self.parent_run_id is not None, "start_sweep() first"
        self._log_metrics(self.parent_run_id, metrics)

    def log_artifacts(self, folder: str, path: str) -> None:
        assert self.parent_run_id is not None, "start_sweep() first"
        self.client.log_artifacts(self.parent_run_id, folder, path)

    def log_frontier(self, num_workers: int, result: FrontierResult, folder: Optional[str] = None) -> None:
        """A worker count's frontier on the parent run: `<metric>_w<workers>`, the reason as a tag,
        and the files in `folder` (its plot and probes) as artifacts under `frontier/`."""
        assert self.parent_run_id is not None, "start_sweep() first"
        self._log_metrics(self.parent_run_id, result.metrics(num_workers))
        reasons = {prefix: found.reason for prefix, found in result.searches()}
        for prefix, name in (("frontier_", "frontier"), ("frontier_accumulating_", "frontier_accumulating")):
            text = reasons.get(prefix) or (result.error if prefix == "frontier_" else None)
            if text:
                self.client.set_tag(self.parent_run_id, f"sweeper.{name}_w{num_workers}", str(text)[:5000])
        if folder and os.path.isdir(folder):
            self.client.log_artifacts(self.parent_run_id, folder, "frontier")

    def log_sweep_params(self, params: Dict[str, Any]) -> None:
        """Parameters known only once the sweep has started (the grid an auto search derived)."""
        assert self.parent_run_id is not None, "start_sweep() first"
        self._log_params(self.parent_run_id, params)

    def _log_child(self, key: str, role: str, params: Dict[str, Any], result: Record) -> Optional[str]:
        assert self.parent_run_id is not None, "start_sweep() first"
        if self._existing_child(key):
            return None
        status = result.get("status") or "failed"
        tags = {
            "mlflow.parentRunId": self.parent_run_id,
            "sweeper.role": role,
            "sweeper.status": status,
            "sweeper.trial_key": key,
            **result.tags(),
        }
        oom = getattr(result, "oom_source", None)
        if oom:
            tags["sweeper.oom"] = oom
        # The point's own start and end in its worker, not the moment the driver logs it: the
        # runs table's Duration column then shows how long the point ran (it read ~20 ms).
        started, seconds = result.get("started_at"), result.get("trial_seconds")
        start_ms = None if started is None else int(started * 1000)
        end_ms = None if started is None or seconds is None else int((started + seconds) * 1000)
        run = self.client.create_run(self.experiment_id, run_name=key, tags=tags, start_time=start_ms)
        run_id = run.info.run_id
        self._log_params(run_id, params)
        self._log_metrics(run_id, result.metrics(), result.series())
        trace = getattr(result, "profile_trace_dir", None)
        if trace and os.path.isdir(trace):
            # A torch.profiler Chrome trace: open in Perfetto or TensorBoard's profiler plugin.
            self.client.log_artifacts(run_id, trace, "profile")
        self.client.set_terminated(run_id, "FAILED" if status == "failed" else "FINISHED", end_time=end_ms)
        return run_id

    def find_sweep(self, ray_experiment: str) -> Optional[str]:
        """The parent run of the sweep whose Ray Tune experiment is `ray_experiment`, if recorded."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`sweeper.ray_experiment` = '{ray_experiment}'",
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def resume_sweep(self, run_id: str) -> Dict[str, str]:
        """Record into an interrupted sweep's parent run again; returns its params."""
        self.parent_run_id = run_id
        self.client.update_run(run_id, status="RUNNING")
        return dict(self.client.get_run(run_id).data.params)

    def recorded_keys(self) -> List[str]:
        """Trial keys this sweep already holds (ok, oom or failed alike: each is recorded once)."""
        trials = [r for r in self.children() if r.data.tags.get("sweeper.role") == "trial"]
        return [r.data.tags.get("sweeper.trial_key") for r in trials]

    def end_sweep(self, summary: SweepSummary, failed: bool) -> None:
        if self.parent_run_id is None:
            return
        self._log_metrics(self.parent_run_id, summary.metrics())
        self.client.set_terminated(self.parent_run_id, "FAILED" if failed else "FINISHED")

    def load_sweep(self, parent_run_id: str) -> SweepRecord:
        parent = self.client.get_run(parent_run_id)
        runs = self.client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            max_results=10_000,
        )
        children = []
        for run in runs:
            tags = run.data.tags
            if tags.get("sweeper.role") != "trial":
                continue
            row: Dict[str, Any] = {**run.data.params, **run.data.metrics}
            row.update({k: v for k, v in tags.items() if k.startswith("sweeper.")})
            row["key"] = tags.get("sweeper.trial_key", run.info.run_name)
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

    def children(self) -> List[Any]:
        return self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.parent_run_id}'",
            max_results=10_000,
        )

    def _existing_child(self, key: str) -> bool:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.mlflow.parentRunId = '{self.parent_run_id}' "
                f"and tags.`sweeper.trial_key` = '{key}'"
            ),
            max_results=1,
        )
        return bool(runs)

    def _log_params(self, run_id: str, params: Dict[str, Any]) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def _log_metrics(
        self, run_id: str, values: Dict[str, float], series: Optional[Dict[str, List[float]]] = None
    ) -> None:
        """Numbers by name (step 0), and each series with its index as the step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, float(v), now, 0) for name, v in values.items() if v is not None and math.isfinite(v)]
        metrics += [Metric(name, float(v), now, i) for name, vs in (series or {}).items() for i, v in enumerate(vs)]
        for begin in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(run_id, metrics=metrics[begin : begin + MAX_BATCH])
