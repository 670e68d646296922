"""The MLflow schema on a real SQLite store: parent and nested children, nothing recorded twice."""

from mlflow.tracking import MlflowClient

from sweeper.plan import GridPoint
from sweeper.schema import PointResult, SweepSummary
from sweeper.tracking import Tracker, check
from tests.harness import mlflow_store


def test_a_point_is_a_nested_child_and_is_never_recorded_twice(tmp_path):
    uri = mlflow_store(tmp_path)
    tracker = Tracker(uri, "exp")
    parent = tracker.start_sweep("sweep-x", {"model": "mlp"}, "model:\n  name: mlp\n")
    point = GridPoint(8, 2, 1)
    result = {"status": "ok", "samples_per_second": 10.0, "train_loss": [2.0, 1.5, 1.0], "val_accuracy": 0.5,
              "started_at": 1_795_000_000.25, "trial_seconds": 12.5}
    result = PointResult.from_flat(result)
    first = tracker.log_point(point, {"micro_batch_size": 8}, result)
    again = tracker.log_point(point, {"micro_batch_size": 8}, result)  # e.g. a re-delivered result
    assert first is not None and again is None
    tracker.end_sweep(SweepSummary(num_trials_ok=1, num_trials_oom=0, num_trials_failed=0), "FINISHED")

    client = MlflowClient(uri)
    children = tracker.reader.children()
    assert [c.info.run_id for c in children] == [first]
    child = children[0]
    assert child.data.tags["mlflow.parentRunId"] == parent
    assert child.data.tags["sweeper.role"] == "trial" and child.data.tags["sweeper.status"] == "ok"
    # The run spans the point's own time in its worker, so the UI's Duration column is the trial's.
    assert (child.info.start_time, child.info.end_time) == (1_795_000_000_250, 1_795_000_012_750)
    history = client.get_metric_history(first, "train_loss")
    assert sorted((h.step, h.value) for h in history) == [(0, 2.0), (1, 1.5), (2, 1.0)]
    parent_run = client.get_run(parent)
    assert parent_run.data.tags["sweeper.role"] == "sweep" and parent_run.info.status == "FINISHED"
    assert parent_run.data.metrics["num_trials_ok"] == 1


def test_unreachable_server_and_unwritable_folder_are_config_problems(tmp_path):
    assert check("http://127.0.0.1:9")[0].startswith("tracking.uri='http://127.0.0.1:9' is unreachable")
    assert check(f"sqlite:///{tmp_path}/no/such/dir/mlflow.db")[0].startswith("tracking.uri=")
    assert check(f"sqlite:///{tmp_path}/mlflow.db") == []


def test_a_server_that_asks_for_a_login_is_named_before_anything_starts_simulated(monkeypatch):
    """An authenticating MLflow server, simulated: /health open, the API 401 without the right login."""
    import base64
    import http.server
    import threading

    good = "Basic " + base64.b64encode(b"alice:s3cret-s3cret").decode()

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" or self.headers.get("Authorization") == good
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
        (problem,) = check(uri)
        assert "asks for a login (HTTP 401)" in problem and "MLFLOW_TRACKING_USERNAME" in problem
        # Credentials in the URI move to MLflow's own variables; the URI kept has none.
        from sweeper.tracking import credentials_to_environment

        clean = credentials_to_environment(f"http://alice:s3cret-s3cret@127.0.0.1:{server.server_port}")
        assert clean == uri and check(clean) == []
    finally:
        server.shutdown()


def test_every_point_logs_its_dataset_as_an_mlflow_input(tmp_path):
    from sweeper.tracking import DatasetRecord

    uri = mlflow_store(tmp_path)
    tracker = Tracker(uri, "exp")
    tracker.start_sweep("sweep-x", {"model": "mlp"}, "model:\n  name: mlp\n")
    tracker.dataset = DatasetRecord.of("digits", "sklearn.datasets.load_digits", {"val_fraction": 0.2}, 1438, 359)
    run_id = tracker.log_point(GridPoint(8, 1, 1), {"micro_batch_size": 8},
                               PointResult.from_flat({"status": "ok", "val_accuracy": 0.9}))

    [logged] = MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    assert logged.dataset.name == "digits" and logged.dataset.digest == tracker.dataset.digest
    assert "sklearn.datasets.load_digits" in logged.dataset.source
    tags = {t.key: t.value for t in logged.tags}
    assert tags == {"mlflow.data.context": "train", "train_samples": "1438", "val_samples": "359"}
    # The same data gives the same digest; other split sizes another.
    assert DatasetRecord.of("digits", "sklearn.datasets.load_digits", {"val_fraction": 0.2}, 1438, 359).digest == \
        tracker.dataset.digest
    assert DatasetRecord.of("digits", "sklearn.datasets.load_digits", {"val_fraction": 0.3}, 1258, 539).digest != \
        tracker.dataset.digest


def test_a_sweep_tag_the_store_refuses_waits_in_the_journal_and_lands_on_the_parent_simulated(tmp_path):
    uri = mlflow_store(tmp_path)
    tracker = Tracker(uri, "exp")
    parent = tracker.start_sweep("sweep-x", {}, "")
    real = tracker.store.client.log_batch

    def store_down(*args, **kwargs):  # what a tracking server that went away raises, simulated
        raise ConnectionError("simulated: the tracking server went away")

    tracker.store.client.log_batch = store_down
    tracker.log_sweep_tags({"sweeper.bandwidth_source": "measured"})
    assert tracker.pending == 1 and "sweeper.bandwidth_source" not in MlflowClient(uri).get_run(parent).data.tags
    tracker.store.client.log_batch = real
    assert tracker.replay() == (1, 0)
    assert MlflowClient(uri).get_run(parent).data.tags["sweeper.bandwidth_source"] == "measured"
