"""The report from a real SQLite MLflow store: files, artifacts, the recommendation, the CLI."""

import os

import yaml
from mlflow.tracking import MlflowClient

from sweeper.config import ReportConfig
from sweeper.plan import GridPoint
from sweeper.report import build as report
from sweeper.schema import PointResult
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


def recorded_sweep(tmp_path, experiment="exp", settings=None):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, experiment)
    params = {"lr_scaling": "sqrt", "base_batch_size": 32}
    if settings is not None:
        params.update(report.settings_params(settings))
    parent = tracker.start_sweep("sweep-test", params, "a: 1\n")
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
        tracker.log_point(point, params, PointResult.from_flat(result))
    return uri, tracker, parent


def test_report_files_artifacts_and_recommendation(tmp_path):
    uri, tracker, parent = recorded_sweep(tmp_path)
    made = report.build(tracker, parent, ReportConfig(), str(tmp_path / "out"))
    # The fastest ok trial within report.max_accuracy_drop (0.02) of the best accuracy (0.90); the
    # faster mb64 (0.80) is named as passed over, and the oom one is never a candidate.
    assert made.recommendation.best.key == "mb32-acc1-w1"
    assert "Not recommended although faster: mb64-acc1-w1 (470.0 samples/s, val_accuracy 0.800)" in made.text
    assert "mb16-acc2-w1" not in [t.key for t in made.recommendation.runners_up]  # 0.86 < 0.88
    assert "Runners-up: mb16-acc1-w1 (300.0 samples/s, 100 MiB, val_accuracy 0.900)" in made.text
    assert made.override_line.startswith("sweep.micro_batch_sizes=[32] sweep.accumulation_steps=[1]")
    doc = yaml.safe_load(open(made.yaml_path))
    assert doc["recommendation"]["micro_batch_size"] == 32 and doc["constraints"]["max_accuracy_drop"] == 0.02
    html = open(made.html_path).read()
    assert html.count("data:image/png;base64,") == 4 and "http://" not in html and "https://" not in html
    assert "Runners-up" in html
    client = MlflowClient(uri)
    artifacts = {a.path for a in client.list_artifacts(parent, "report")}
    assert artifacts == {f"report/{name}" for name in os.listdir(made.folder)}
    assert client.get_run(parent).data.tags["sweeper.recommendation"].startswith("Train with mb32")
    # Without the guard the objective alone decides.
    free = report.build(tracker, parent, ReportConfig(max_accuracy_drop=None), str(tmp_path / "free"), log=False)
    assert free.recommendation.best.key == "mb64-acc1-w1"


def test_a_rebuild_never_loses_or_duplicates_what_the_sweep_recorded(tmp_path):
    uri, tracker, parent = recorded_sweep(tmp_path, settings=ReportConfig(objective="accuracy"))
    client = MlflowClient(uri)
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "frontier.json").write_text("{}")  # a file of someone else's in the folder
    own = report.build(tracker, parent, ReportConfig(objective="accuracy"), str(tmp_path / "stray"))
    assert own.recommendation.best.key == "mb16-acc1-w1"
    listing = sorted(a.path for a in client.list_artifacts(parent, "report"))
    assert "report/frontier.json" not in listing  # only the report's own files are logged
    tag = client.get_run(parent).data.tags["sweeper.recommendation"]

    # The same question again (the sweep's recorded settings are the CLI's defaults): the same files.
    assert report.main([parent, "--tracking-uri", uri, "--out", str(tmp_path / "again")]) == 0
    assert sorted(a.path for a in client.list_artifacts(parent, "report")) == listing
    assert client.get_run(parent).data.tags["sweeper.recommendation"] == tag

    # Another question: kept beside the sweep's answer, which stays as it was.
    assert report.main([parent, "--tracking-uri", uri, "--objective", "throughput", "--min-accuracy", "none"]) == 0
    assert client.get_run(parent).data.tags["sweeper.recommendation"] == tag
    variant = "report/variants/objective=throughput"
    assert variant in {a.path for a in client.list_artifacts(parent, "report/variants")}
    assert {a.path for a in client.list_artifacts(parent, variant)} >= {f"{variant}/report.html"}
    assert (tmp_path / "reports" / "sweep-test" / "variants" / "objective=throughput" / "report.html").exists()


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
    assert capsys.readouterr().out.startswith("Train with mb32-acc1-w1")
    assert report.main(["mine", "--tracking-uri", uri, "--no-log", "--objective", "accuracy"]) == 0
    assert "Train with mb16-acc1-w1" in capsys.readouterr().out
    # A recorded sweep without report settings (before they were recorded) reads as the defaults,
    # so the accuracy question is a variant, kept beside the sweep's own report.
    assert (tmp_path / "reports" / "sweep-test" / "variants" / "objective=accuracy" / "report.html").exists()
    assert report.main(["no-such-thing", "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.startswith("error: LookupError: 'no-such-thing' is neither an experiment nor a run")
    # A store that is not there is named, not created empty.
    missing = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    assert report.main([parent, "--tracking-uri", missing]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: tracking.uri={missing!r}: no MLflow store there") and err.count("\n") == 1
    assert not (tmp_path / "elsewhere.db").exists()
    assert report.main([parent, "--tracking-uri", uri, "--max-accuracy-drop", "5"]) == 2
    assert capsys.readouterr().err.startswith("error: --max-accuracy-drop=5.0: must be between 0 and 1")
    # Option names in the message, values as the user typed them.
    to_accuracy = ["--objective", "time_to_accuracy", "--min-accuracy", "none"]
    assert report.main([parent, "--tracking-uri", uri, *to_accuracy]) == 2
    assert capsys.readouterr().err.startswith(
        "error: --objective=time_to_accuracy needs --min-accuracy (the accuracy to reach), e.g. --min-accuracy=0.9")
