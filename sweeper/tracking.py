"""MLflow: one parent run per sweep, one nested child run per trial, written from the driver only.

The only module that imports MLflow. Names here are the public schema (see README).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from sweeper.plan import GridPoint

# Metrics a trial result may carry, logged under these exact names when present.
SCALAR_METRICS = (
    "samples_per_second",
    "samples_per_second_cv",
    "step_time_seconds",
    "peak_memory_bytes",
    "val_accuracy",
    "startup_seconds",
    "trial_wall_seconds",
    "optimizer_steps",
    "samples_seen",
)
# Counts logged on the sweep's parent run.
SWEEP_METRICS = ("num_trials_ok", "num_trials_oom", "num_trials_failed")
MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call


def check(uri: str) -> List[str]:
    """Problems reaching the tracking store, found before any trial starts."""
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
        folder = os.path.dirname(uri[len("sqlite:///"):]) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            return [
                f"tracking.uri={uri!r}: folder {folder!r} does not exist or is not writable; "
                "create it or choose another path"
            ]
    return []


class Tracker:
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

    def start_sweep(self, run_name: str, params: Dict[str, Any], config_yaml: str) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            tags={"sweeper.role": "sweep"},
        )
        self.parent_run_id = run.info.run_id
        self._log_params(self.parent_run_id, params)
        self.client.log_text(self.parent_run_id, config_yaml, "config.yaml")
        return self.parent_run_id

    def log_trial(self, point: GridPoint, params: Dict[str, Any], result: Dict[str, Any]) -> Optional[str]:
        """One child run for the trial; returns its id, or None if this sweep already holds it
        (a re-delivered result is never recorded twice)."""
        assert self.parent_run_id is not None, "start_sweep() first"
        if self._existing_child(point.key):
            return None
        status = result.get("status", "failed")
        tags = {
            "mlflow.parentRunId": self.parent_run_id,
            "sweeper.role": "trial",
            "sweeper.status": status,
            "sweeper.trial_key": point.key,
        }
        if result.get("error"):
            tags["sweeper.error"] = str(result["error"])[:5000]
        if result.get("memory_measure"):
            tags["sweeper.memory_measure"] = result["memory_measure"]
        if "throughput_noisy" in result:
            tags["sweeper.throughput_noisy"] = str(bool(result["throughput_noisy"])).lower()
        if result.get("accuracy_note"):
            tags["sweeper.accuracy"] = result["accuracy_note"]
        run = self.client.create_run(self.experiment_id, run_name=point.key, tags=tags)
        run_id = run.info.run_id
        self._log_params(run_id, params)
        self._log_metrics(run_id, result)
        self.client.set_terminated(run_id, "FAILED" if status == "failed" else "FINISHED")
        return run_id

    def end_sweep(self, metrics: Dict[str, float], failed: bool) -> None:
        if self.parent_run_id is None:
            return
        self._log_metrics(self.parent_run_id, metrics)
        self.client.set_terminated(self.parent_run_id, "FAILED" if failed else "FINISHED")

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

    def _log_metrics(self, run_id: str, values: Dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(name, float(values[name]), now, 0)
            for name in values
            if (name in SCALAR_METRICS or name in SWEEP_METRICS) and values[name] is not None
        ]
        metrics += [
            Metric("train_loss", float(loss), now, step)
            for step, loss in enumerate(values.get("train_loss") or [])
        ]
        metrics += [
            Metric("window_samples_per_second", float(rate), now, i)
            for i, rate in enumerate(values.get("window_samples_per_second") or [])
        ]
        for begin in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(run_id, metrics=metrics[begin : begin + MAX_BATCH])
