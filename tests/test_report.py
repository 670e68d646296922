"""The report from a real SQLite MLflow store: files, artifacts, the recommendation, the CLI."""

import yaml
from mlflow.tracking import MlflowClient

from sweeper import report
from sweeper.config import ReportConfig
from sweeper.plan import GridPoint
from sweeper.tracking import Tracker

MiB = 2**20
# (micro, accum, workers) -> (status, samples/s, peak MiB, val accuracy)
TRIALS = {
    (16, 1, 1): ("ok", 300.0, 100, 0.90),
    (32, 1, 1): ("ok", 450.0, 140, 0.88),
    (64, 1, 1): ("ok", 470.0, 220, 0.80),
    (128, 1, 1): ("oom", None, None, None),
    (16, 2, 1): ("ok", 310.0, 101, 0.86),
}


def recorded_sweep(tmp_path, experiment="exp"):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, experiment)
    parent = tracker.start_sweep("sweep-test", {"lr_scaling": "sqrt", "base_batch_size": 32}, "a: 1\n")
    for (micro, accum, workers), (status, speed, peak, acc) in TRIALS.items():
        point = GridPoint(micro, accum, workers)
        params = {"micro_batch_size": micro, "accumulation_steps": accum, "num_workers": workers,
                  "global_batch_size": point.global_batch_size, "lr": 0.05}
        result = {"status": status}
        if status == "ok":
            result.update(samples_per_second=speed, samples_per_second_cv=0.01, throughput_stable=True,
                          peak_memory_bytes=peak * MiB, val_accuracy=acc, samples_seen=2000, train_seconds=2000 / speed)
        else:
            result["error"] = "OutOfMemoryError: simulated"
        tracker.log_trial(point, params, result)
    return uri, tracker, parent


def test_report_files_artifacts_and_recommendation(tmp_path):
    uri, tracker, parent = recorded_sweep(tmp_path)
    made = report.build(tracker, parent, ReportConfig(), str(tmp_path / "out"))
    assert made.recommendation.best.key == "mb64-acc1-w1"  # the fastest ok trial; the oom one never
    assert made.override_line.startswith("sweep.micro_batch_sizes=[64] sweep.accumulation_steps=[1]")
    doc = yaml.safe_load(open(made.yaml_path))
    assert doc["recommendation"]["micro_batch_size"] == 64
    html = open(made.html_path).read()
    assert html.count("data:image/png;base64,") == 4 and "http://" not in html and "https://" not in html
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(parent, "report")}
    assert "report/report.html" in artifacts and "report/recommendation.yaml" in artifacts
    assert MlflowClient(uri).get_run(parent).data.tags["sweeper.recommendation"].startswith("Train with mb64")


def test_constraints_change_the_answer(tmp_path):
    _, tracker, parent = recorded_sweep(tmp_path)
    budget = report.build(tracker, parent, ReportConfig(memory_budget_gb=150 / 1024), str(tmp_path / "a"), log=False)
    assert budget.recommendation.best.key == "mb32-acc1-w1"  # 220 MiB no longer fits
    accurate = report.build(tracker, parent, ReportConfig(objective="accuracy"), str(tmp_path / "b"), log=False)
    assert accurate.recommendation.best.key == "mb16-acc1-w1"
    none = report.build(tracker, parent, ReportConfig(min_accuracy=0.95), str(tmp_path / "c"), log=False)
    assert none.recommendation.best is None and none.override_line is None
    assert none.text.startswith("No recommendation")


def test_cli_rebuilds_from_mlflow_by_run_id_or_experiment(tmp_path, capsys):
    uri, _, parent = recorded_sweep(tmp_path, experiment="mine")
    assert report.main([parent, "--tracking-uri", uri, "--out", str(tmp_path / "r1")]) == 0
    assert capsys.readouterr().out.startswith("Train with mb64-acc1-w1")
    assert report.main(["mine", "--tracking-uri", uri, "--no-log", "--objective", "accuracy"]) == 0
    assert "Train with mb16-acc1-w1" in capsys.readouterr().out
    assert (tmp_path / "reports" / "sweep-test" / "report.html").exists()  # next to the store
    assert report.main(["no-such-thing", "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.startswith("error: 'no-such-thing' is neither an experiment nor a run")
