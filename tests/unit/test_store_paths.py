"""A SQLite store that is not ./mlflow.db (a sweep run as a Ray job, whose working directory is a copy Ray
unpacks per job): its experiment's artifacts are kept beside it, and a resume reads the sweep's recorded
config.yaml from it, not from MLflow's global tracking URI (./mlflow.db)."""

from sweeper import tracking
from tests.harness import mlflow_store


def test_a_store_outside_the_working_directory_keeps_its_artifacts_beside_it(tmp_path, monkeypatch):
    elsewhere = tmp_path / "job-working-dir"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    store = tracking.Store(mlflow_store(tmp_path / "shared"), "sweeper")
    location = store.client.get_experiment(store.experiment_id).artifact_location
    assert location.replace("file://", "").startswith(str(tmp_path / "shared" / "mlruns"))
    assert not (elsewhere / "mlruns").exists()


def test_the_store_in_the_working_directory_keeps_mlflows_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = tracking.Store(f"sqlite:///{tmp_path / 'mlflow.db'}", "sweeper")
    location = store.client.get_experiment(store.experiment_id).artifact_location
    assert location.replace("file://", "") == str(tmp_path / "mlruns" / store.experiment_id)


def test_a_recorded_config_is_read_from_the_sweeps_own_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's global tracking URI: ./mlflow.db, another store
    store = tracking.Store(mlflow_store(tmp_path / "shared"), "sweeper")
    run = store.client.create_run(store.experiment_id)
    store.client.log_text(run.info.run_id, "optim:\n  lr: 0.05\n", "config.yaml")
    assert tracking.SweepReader(store, run.info.run_id).artifact_text("config.yaml") == "optim:\n  lr: 0.05\n"
