"""MLflow's own views filled, on a real SQLite store: the experiment's kind, the runs' context tags
(user, source, git commit), the launch command beside config.yaml, system metrics on the parent run,
and `sweeper.results()` reading a sweep back as a DataFrame."""

import subprocess
import sys
import threading

import pytest
from hydra.core.hydra_config import HydraConfig
from mlflow.tracking import MlflowClient

import sweeper
from sweeper import tracking
from sweeper.__main__ import launch_files
from sweeper.plan import GridPoint
from sweeper.schema import PointResult, SweepSummary
from sweeper.tracking import Monitor, Tracker
from tests.harness import compose_cfg, mlflow_store
from tests.helpers import REPO, wait_for



@pytest.fixture
def uri(tmp_path):
    return mlflow_store(tmp_path)


def _point(tracker, mb, acc, sps, status="ok"):
    flat = {"status": status, "samples_per_second": sps, "peak_memory_bytes": 1000.0 * mb, "val_accuracy": 0.5}
    params = {"micro_batch_size": mb, "accumulation_steps": acc, "num_workers": 1, "global_batch_size": mb * acc,
              "lr": 0.1, "lr_scaling": "none", "precision": "fp32"}
    return tracker.log_point(GridPoint(mb, acc, 1), params, PointResult.from_flat(flat))


def test_the_experiment_opens_in_the_model_training_view_new_or_existing(uri):
    client = MlflowClient(uri)
    Tracker(uri, "fresh")
    assert client.get_experiment_by_name("fresh").tags["mlflow.experimentKind"] == "custom_model_development"
    # One made before this version (or by hand) lacks the tag: MLflow 3.17 would open it as GenAI.
    old = client.create_experiment("old")
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    Tracker(uri, "old")
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    # A kind the user chose is theirs.
    chosen = client.create_experiment("chosen", tags={"mlflow.experimentKind": "finetuning"})
    Tracker(uri, "chosen")
    assert client.get_experiment(chosen).tags["mlflow.experimentKind"] == "finetuning"


def test_parent_and_child_runs_carry_mlflows_context_tags(uri, monkeypatch):
    # What `python -m sweeper` sees as its main file: the source and its git commit are resolved from it.
    main_file = str(REPO / "sweeper" / "__main__.py")
    monkeypatch.setattr(sys, "argv", [main_file])
    # MLflow's git context caches the first main file's repository for the process: another test
    # that tracked under pytest's own argv would leave it without a commit.
    from mlflow.tracking.context import registry
    for provider in registry._run_context_provider_registry:
        if hasattr(provider, "_cache"):
            monkeypatch.setattr(provider, "_cache", {})
    tracker = Tracker(uri, "context")
    parent = tracker.start_sweep("sweep-ctx", {"model": "mlp"}, "a: 1\n")
    child = _point(tracker, 8, 1, 10.0)
    client = MlflowClient(uri)
    for run_id in (parent, child):
        tags = client.get_run(run_id).data.tags
        assert tags["mlflow.source.name"] == main_file and tags["mlflow.source.type"] == "LOCAL"
        assert tags["mlflow.user"] and tags["mlflow.user"] != "unknown"
        if (REPO / ".git").exists():
            head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
            assert tags["mlflow.source.git.commit"] == head.stdout.strip()
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == parent


def test_the_command_line_is_recorded_beside_the_config_with_the_password_redacted(uri, monkeypatch):
    secret_uri = "http://alice:s3cret-pw@127.0.0.1:5000"
    argv = [str(REPO / "sweeper" / "__main__.py"), "model=mlp", f"tracking.uri={secret_uri}", "train.seed=1"]
    monkeypatch.setattr(sys, "argv", argv)
    cfg = compose_cfg(*argv[1:], hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # what Hydra's runtime holds while a job runs
    try:
        files = launch_files(tracking.password(secret_uri))
    finally:
        HydraConfig.instance().cfg = None
    assert "s3cret-pw" not in "".join(files.values())
    assert files["command.txt"] == (
        "python -m sweeper model=mlp 'tracking.uri=http://alice:***@127.0.0.1:5000' train.seed=1\n")
    assert files["overrides.yaml"].splitlines() == [
        "- model=mlp", "- tracking.uri=http://alice:***@127.0.0.1:5000", "- train.seed=1"]
    tracking.record_launch(files)
    try:
        tracker = Tracker(uri, "launch")
        parent = tracker.start_sweep("sweep-launch", {}, "a: 1\n")
    finally:
        tracking.record_launch({})
    names = {f.path for f in MlflowClient(uri).list_artifacts(parent)}
    assert {"config.yaml", "overrides.yaml", "command.txt"} <= names


@pytest.mark.parametrize("node,status", [(None, "FINISHED"), ("node-a", "KILLED")])
def test_system_metrics_fill_the_parent_run_while_it_runs_and_stop_at_its_end(uri, monkeypatch, node, status):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    tracker = Tracker(uri, "system", monitor=Monitor(node=node, interval_seconds=0.2))
    parent = tracker.start_sweep("sweep-sys", {}, "a: 1\n")
    prefix = "system/" + (f"{node}/" if node else "")
    client = MlflowClient(uri)
    # While the run is open, the monitor logs a sample every 0.2 s: wait for two.
    wait_for(lambda: len(client.get_metric_history(parent, f"{prefix}cpu_utilization_percentage")) >= 2,
             "two system-metric samples on the running parent", every=0.2)
    assert client.get_run(parent).info.status == "RUNNING"
    tracker.end_sweep(SweepSummary(), status)
    assert not [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor" and t.is_alive()]
    run = client.get_run(parent)
    names = set(run.data.metrics)
    assert {f"{prefix}cpu_utilization_percentage", f"{prefix}system_memory_usage_megabytes"} <= names, names
    assert run.info.status == status


def test_system_metrics_can_be_turned_off_with_mlflows_own_variable(monkeypatch):
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    assert Monitor.for_driver(on_cluster=False) is None
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING")
    assert Monitor.for_driver(on_cluster=False) == Monitor()
    assert Monitor.for_driver(on_cluster=True).node  # this host's name


def test_results_is_one_row_per_point_with_params_and_metrics_columns(uri):
    tracker = Tracker(uri, "table")
    parent = tracker.start_sweep("sweep-table", {"model": "mlp"}, "a: 1\n")
    _point(tracker, 8, 1, 10.0)
    _point(tracker, 16, 2, 25.0)
    _point(tracker, 64, 1, 0.0, status="oom")
    tracker.log_probe({"micro_batch_size": 128}, PointResult.from_flat({"trial_key": "probe-128", "status": "oom"}))
    tracker.end_sweep(SweepSummary(), "FINISHED")

    frame = sweeper.results(parent, tracking_uri=uri)
    assert list(frame["key"]) == ["mb16-acc2-w1", "mb64-acc1-w1", "mb8-acc1-w1"]  # probes are not points
    assert list(frame.columns[:2]) == ["key", "status"]
    assert list(frame["status"]) == ["ok", "oom", "ok"]
    assert list(frame["micro_batch_size"]) == [16, 64, 8] and frame["micro_batch_size"].dtype.kind == "i"
    assert list(frame["global_batch_size"]) == [32, 64, 8]
    assert frame.set_index("key").loc["mb16-acc2-w1", "samples_per_second"] == 25.0
    assert {"peak_memory_bytes", "val_accuracy", "lr", "lr_scaling", "sweeper.trial_key"} <= set(frame.columns)
    assert frame.attrs["run_id"] == parent and frame.attrs["run_name"] == "sweep-table"
    # An experiment's name means its latest sweep.
    assert sweeper.results("table", tracking_uri=uri).attrs["run_id"] == parent
    with pytest.raises(LookupError, match="neither an experiment nor a run"):
        sweeper.results("no-such-thing", tracking_uri=uri)
