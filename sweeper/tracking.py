"""MLflow: one parent run per sweep, one nested child run per trial, written from the driver only.

The only module that imports MLflow. Names here are the public schema (see README).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from sweeper.plan import GridPoint

# Metrics a trial result may carry, logged under these exact names when present (README: schema).
SCALAR_METRICS = (
    # throughput: timed windows of whole optimizer steps, warm-up excluded
    "samples_per_second",
    "samples_per_second_cv",
    "step_time_seconds",
    "data_seconds_per_step",
    "forward_backward_seconds_per_step",
    "optimizer_seconds_per_step",
    "timing_windows",
    "stable_windows_used",
    # memory, the largest over workers
    "peak_memory_bytes",
    "memory_parameters_bytes",
    "memory_buffers_bytes",
    "memory_gradients_bytes",
    "memory_optimizer_state_bytes",
    "memory_activations_bytes",
    "memory_temporaries_bytes",
    "memory_other_bytes",
    "memory_tracked_peak_bytes",
    "memory_forward_activations_bytes",
    # the budget the step ran under, and the fake-tensor estimate of the tracked peak against it
    "memory_budget_bytes",
    "memory_estimated_peak_bytes",
    "memory_estimate_error",
    "cuda_max_memory_allocated_bytes",
    "cuda_max_memory_reserved_bytes",
    "gpu_device_memory_used_bytes_max",
    "cpu_rss_peak_above_baseline_bytes",
    "cpu_rss_peak_bytes",
    # utilization during the timed windows (means over workers, maxima over workers)
    "process_cpu_percent_mean",
    "process_cpu_percent_max",
    "system_cpu_percent_mean",
    "system_cpu_percent_max",
    "gpu_utilization_percent_mean",
    "gpu_utilization_percent_max",
    # FLOPs
    "flops_per_sample_forward",
    "flops_per_sample_train",
    "achieved_flops_per_second",
    "peak_flops_per_second",
    "mfu",
    # accuracy and the harness's own cost
    "val_accuracy",
    "bn_recalibration_samples",  # BatchNorm statistics re-estimated over these before validation
    "startup_seconds",
    "worker_group_startup_seconds",
    "worker_group_launch_seconds",
    "worker_group_init_seconds",
    "worker_group_setup_seconds",
    "between_points_seconds",
    "worker_group_points",
    # faults and placement: restarts of the worker group before this point, nodes its workers spanned
    "worker_group_restarts",
    "num_nodes",
    "trial_seconds",
    "train_seconds",
    "optimizer_steps",
    "samples_seen",
)
# An inference point's figures (task=inference), logged like a trial's.
SCALAR_METRICS += (
    "batch_size",
    "latency_p50_seconds",
    "latency_p95_seconds",
    "latency_p99_seconds",
    "latency_mean_seconds",
    "latency_cv",
    "timed_runs",
    "forward_flops_per_sample",
)
# Logged on the sweep's parent run.
SWEEP_METRICS = (
    "num_trials_ok",
    "num_trials_oom",
    "num_trials_failed",
    # where the sweep's wall time went: checks and preparation, Ray's start, the grid, the report
    "sweep_wall_seconds",
    "sweep_setup_seconds",
    "sweep_ray_start_seconds",
    "sweep_tracking_seconds",
    "sweep_frontier_seconds",
    "sweep_grid_seconds",
    "sweep_report_seconds",
    "sum_trial_seconds",
    "sweep_wall_over_trial_seconds",
    "sum_train_seconds",
    "sweep_wall_over_train_seconds",
)
# Result entries recorded as tags (text, not numbers).
RESULT_TAGS = {
    "error": "sweeper.error",
    "memory_measure": "sweeper.memory_measure",
    "peak_flops_source": "sweeper.peak_flops_source",
    "gpu_telemetry_note": "sweeper.gpu_telemetry",
    "accuracy_note": "sweeper.accuracy",
    "memory_budget_mode": "sweeper.memory_budget",
    "oom_implied_by": "sweeper.oom_implied_by",
    "probe_role": "sweeper.probe_role",
}
# The memory frontier of each worker count, on the parent run with a `_w<workers>` suffix.
FRONTIER_METRICS = (
    "frontier_micro_batch_size",
    "frontier_predicted_micro_batch_size",
    "frontier_estimated_micro_batch_size",
    "frontier_fit_probes",
    "frontier_verifications",
    "frontier_fixed_bytes",
    "frontier_per_sample_bytes",
    "frontier_fit_r_squared",
    "frontier_fit_max_relative_residual",
    "frontier_fit_points",
    "memory_budget_bytes",
    # the same search with gradient accumulation (only when the grid accumulates)
    "frontier_accumulating_micro_batch_size",
    "frontier_accumulating_predicted_micro_batch_size",
    "frontier_accumulating_estimated_micro_batch_size",
    "frontier_accumulating_fit_probes",
    "frontier_accumulating_verifications",
    "frontier_accumulating_fixed_bytes",
    "frontier_accumulating_per_sample_bytes",
    "frontier_accumulating_fit_r_squared",
)
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

    def log_trial(self, point: GridPoint, params: Dict[str, Any], result: Dict[str, Any]) -> Optional[str]:
        """One child run for the trial; returns its id, or None if this sweep already holds it
        (a re-delivered result is never recorded twice)."""
        return self._log_child(point.key, "trial", params, result)

    def log_probe(self, params: Dict[str, Any], result: Dict[str, Any]) -> Optional[str]:
        """One child run (sweeper.role=probe) per frontier probe: its size, measured peak and
        breakdown, or its out-of-memory. The report and the trials table leave probes out."""
        return self._log_child(result["trial_key"], "probe", params, result)

    def log_inference(self, params: Dict[str, Any], result: Dict[str, Any]) -> Optional[str]:
        """One child run (sweeper.role=inference) per inference batch size of a model."""
        return self._log_child(result["trial_key"], "inference", params, result)

    def log_parent_metrics(self, metrics: Dict[str, float]) -> None:
        """Figures of the whole sweep that have no fixed name (e.g. a knee per model)."""
        assert self.parent_run_id is not None, "start_sweep() first"
        self._log_metrics(self.parent_run_id, metrics, names=set(metrics))

    def log_artifacts(self, folder: str, path: str) -> None:
        assert self.parent_run_id is not None, "start_sweep() first"
        self.client.log_artifacts(self.parent_run_id, folder, path)

    def log_frontier(self, num_workers: int, result: Dict[str, Any], folder: Optional[str] = None) -> None:
        """A worker count's frontier on the parent run: `<metric>_w<workers>`, the reason as a tag,
        and the files in `folder` (its plot and probes) as artifacts under `frontier/`."""
        assert self.parent_run_id is not None, "start_sweep() first"
        suffixed = {f"{k}_w{num_workers}": result[k] for k in FRONTIER_METRICS if result.get(k) is not None}
        self._log_metrics(self.parent_run_id, suffixed, names=set(suffixed))
        for prefix, name in (("frontier_", "frontier"), ("frontier_accumulating_", "frontier_accumulating")):
            text = result.get(f"{prefix}reason") or (result.get("error") if prefix == "frontier_" else None)
            if text:
                self.client.set_tag(self.parent_run_id, f"sweeper.{name}_w{num_workers}", str(text)[:5000])
        if folder and os.path.isdir(folder):
            self.client.log_artifacts(self.parent_run_id, folder, "frontier")

    def log_sweep_params(self, params: Dict[str, Any]) -> None:
        """Parameters known only once the sweep has started (the grid an auto search derived)."""
        assert self.parent_run_id is not None, "start_sweep() first"
        self._log_params(self.parent_run_id, params)

    def _log_child(self, key: str, role: str, params: Dict[str, Any], result: Dict[str, Any]) -> Optional[str]:
        assert self.parent_run_id is not None, "start_sweep() first"
        if self._existing_child(key):
            return None
        status = result.get("status", "failed")
        tags = {
            "mlflow.parentRunId": self.parent_run_id,
            "sweeper.role": role,
            "sweeper.status": status,
            "sweeper.trial_key": key,
        }
        if status == "oom":
            # Where the out-of-memory came from: never run (implied by a smaller point's), a budget
            # simulated on CPU, or the device's own allocator.
            tags["sweeper.oom"] = (
                "implied" if result.get("oom_implied_by") else "simulated" if result.get("oom_simulated") else "device"
            )
        for name, tag in RESULT_TAGS.items():
            if result.get(name):
                tags[tag] = str(result[name])[:5000]
        if "throughput_stable" in result:
            tags["sweeper.throughput_stable"] = str(bool(result["throughput_stable"])).lower()
        # The point's own start and end in its worker, not the moment the driver logs it: the
        # runs table's Duration column then shows how long the trial ran (it read ~20 ms).
        started = result.get("started_at")
        start_ms = end_ms = None
        if started is not None:
            start_ms = int(started * 1000)
            if "trial_seconds" in result:
                end_ms = int((started + result["trial_seconds"]) * 1000)
        run = self.client.create_run(self.experiment_id, run_name=key, tags=tags, start_time=start_ms)
        run_id = run.info.run_id
        self._log_params(run_id, params)
        self._log_metrics(run_id, result)
        trace = result.get("profile_trace_dir")
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

    def end_sweep(self, metrics: Dict[str, float], failed: bool) -> None:
        if self.parent_run_id is None:
            return
        self._log_metrics(self.parent_run_id, metrics)
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

    def _log_metrics(self, run_id: str, values: Dict[str, Any], names: Optional[set] = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        known = names if names is not None else set(SCALAR_METRICS) | set(SWEEP_METRICS)
        metrics = [
            Metric(name, float(values[name]), now, 0)
            for name in values
            if name in known and values[name] is not None
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
