"""sweep.strategy=smart and branch through the CLI: a sweep interrupted mid-rung or mid-branch, resumed,
every point recorded once, answered. (Their pure rules and driver sides are tested in
tests/unit/test_smart.py and tests/unit/test_branch.py.)"""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.harness import interrupt_once_recorded, recorded, run_cli
from tests.helpers import REPO


# ---------------------------------------------------------------------------------------------------
# Through the CLI: measured, interrupted mid-rung, resumed, finished


SMART = [
    "optim=sgd", "model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]", "data=digits",
    "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1]",
    "sweep.seeds=[0,1]", "sweep.strategy=smart", "smart.rungs=2", "smart.eta=2", "smart.throughput_steps=12",
    "train.epochs=1", "eval.every_samples=512", "measure.warmup_steps=2", "measure.windows=3",
    "measure.flops=false", "measure.memory_breakdown=false", "cluster.include_dashboard=false",
]


# Both the interrupted sweep and its resume join the session's Ray (a sweep interrupted on a cluster);
# tests/e2e/test_resume.py interrupts a sweep that started its own. Interrupted once rung 2, whose runs continue
# from rung 1's checkpoints, is under way: the resume continues the runs it lacks from those checkpoints.
@pytest.mark.e2e
def test_a_smart_sweep_interrupted_mid_rung_resumes_to_every_point_recorded_once(tmp_path):
    interrupt_once_recorded(SMART, tmp_path, "r2-")  # once rung 2 is under way
    held = recorded(tmp_path / "mlflow.db", "r2-")
    results = tmp_path / ".sweeper" / "ray" / "results"
    kept = [p.name for p in results.glob("*/rungs/*")]
    assert len(kept) == 6 and all(k.startswith("r1-") for k in kept), kept  # the interrupted sweep keeps them

    again = run_cli(*SMART, "sweep.resume=true", cwd=tmp_path, env={"PYTHONPATH": str(REPO)}, timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert not list(results.glob("*/rungs"))  # every class recorded: the rungs' checkpoints are deleted
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweeper").experiment_id], max_results=1000)
    parent = next(r for r in runs if r.data.tags.get("sweeper.role") == "sweep")
    assert parent.info.status == "FINISHED"
    complete = [r for r in runs if "sweeper.trial_key" in r.data.tags]
    by_role = Counter(r.data.tags["sweeper.role"] for r in complete)
    keys_of = Counter(r.data.tags["sweeper.trial_key"] for r in complete)
    assert max(keys_of.values()) == 1  # nothing measured or recorded twice
    # 4 layouts' throughput runs; 3 classes (gb16, gb32, gb64) x 2 seeds at rung 1, the best half at rung 2
    assert by_role["throughput"] == 4 and by_role["trial"] == 8
    rung2 = [r for r in complete if r.data.tags["sweeper.trial_key"].startswith("r2-")]
    assert sum(k.startswith("r1-") for k in keys_of) == 6 and 2 <= len(rung2) <= 6
    # interrupted mid-rung 2; the resume measured neither the layouts nor rung 1 again, nor rung 2's recorded runs
    assert 1 <= held < len(rung2)
    experiments = [p.name for p in results.iterdir()
                   if any(f.name.startswith("experiment_state") for f in p.iterdir())]
    assert sum("-rung" not in e for e in experiments) == 1, experiments  # the layouts' runs: the sweep's name
    assert sum("-rung1" in e for e in experiments) == 1 and sum("-rung2" in e for e in experiments) == 2, experiments
    # each rung-2 run continued from its unit's rung-1 checkpoint, trained only the steps after it, and is
    # recorded as one run from step 0 (its loss per step from the first step on)
    rung1 = {r.data.tags["sweeper.trial_key"][3:]: r for r in complete if r.data.tags["sweeper.trial_key"][:3] == "r1-"}
    for run in rung2:
        unit = run.data.tags["sweeper.trial_key"][3:]
        assert run.data.tags["sweeper.continued_from"].endswith("/rungs/r1-" + unit)
        before = rung1[unit].data.metrics["optimizer_steps"]
        assert run.data.metrics["optimizer_steps"] == before + int(run.data.params["steps"])
        assert len(client.get_metric_history(run.info.run_id, "train_loss")) == run.data.metrics["optimizer_steps"]
    assert client.get_run(parent.info.run_id).data.metrics["smart_continued_runs"] == len(rung2)
    points = [r for r in complete if r.data.tags["sweeper.role"] == "trial"]
    for run in points:
        tags = run.data.tags
        assert tags["sweeper.accuracy_from"] in keys_of and tags["sweeper.throughput_from"] in keys_of
        assert tags["sweeper.status"] in ("ok", "stopped")
        assert tags["sweeper.throughput_from"] == "tp-" + tags["sweeper.trial_key"].rsplit("-s", 1)[0]
    # the two members of gb32 (mb16-acc2, mb32-acc1) carry their representative's accuracy exactly
    gb32 = [r for r in points if r.data.tags["sweeper.accuracy_class"] == "gb32" and r.data.params["seed"] == "0"]
    assert len(gb32) == 2 and gb32[0].data.metrics["val_loss"] == gb32[1].data.metrics["val_loss"]
    metrics = client.get_run(parent.info.run_id).data.metrics
    assert metrics["compute_point_seconds"] == pytest.approx(
        metrics["compute_throughput_point_seconds"] + metrics["compute_accuracy_point_seconds"]
        + metrics["compute_stopped_point_seconds"])
    assert metrics["smart_accuracy_classes"] == 3 and metrics["full_grid_point_seconds_estimate"] > 0
    assert metrics["smart_measurement_runs"] == by_role["throughput"] + by_role["rung"]
    assert metrics["num_trials_ok"] + metrics.get("num_trials_stopped", 0) == 8
    assert all(r.info.status != "RUNNING" for r in runs)
    # the report says what the strategy spent against the whole grid, with the parent's figures
    page = next((tmp_path / "reports").glob("*/report.html")).read_text()
    assert "Compute spent (sweep.strategy=smart)" in page
    assert f"The sweep spent {metrics['compute_point_seconds']:.1f} point-seconds" in page
    assert f"~{metrics['full_grid_point_seconds_estimate']:.1f} point-seconds" in page


# ---------------------------------------------------------------------------------------------------
# Through the CLI: a branch sweep interrupted mid-branch, resumed, recorded once, answered

BRANCH = [
    "optim=adamw", "optim.lr=0.003", "model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]",
    "data=digits", "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1]",
    "sweep.strategy=branch", "branch.at=[0.2,0.5]", "branch.window=384", "smart.throughput_steps=12", "train.epochs=2",
    "measure.warmup_steps=2", "measure.windows=3", "measure.flops=false", "measure.memory_breakdown=false",
    "cluster.include_dashboard=false",
]


@pytest.mark.e2e
def test_a_branch_sweep_interrupted_mid_branch_resumes_each_branch_once_and_answers(tmp_path):
    # The default path: the trunk's checkpoints in the sweep's local Ray results folder (a URI storage path's
    # staging, written locally, uploaded and fetched, is tests/unit/test_storage.py's).
    args = list(BRANCH)
    interrupt_once_recorded(args, tmp_path, "branch-")  # once the trunk is recorded and its branches under way
    held = recorded(tmp_path / "mlflow.db", "branch-")
    store = tmp_path / ".sweeper" / "ray" / "results"
    assert len(list(store.glob("*/trunk/*/s*/meta.json"))) == 2  # the trunk's checkpoints, kept for the resume

    again = run_cli(*args, "sweep.resume=true", cwd=tmp_path, env={"PYTHONPATH": str(REPO)}, timeout=400)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert not list(store.glob("*/trunk"))  # every branch recorded: the checkpoints are deleted
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweeper").experiment_id], max_results=1000)
    parent = next(r for r in runs if r.data.tags.get("sweeper.role") == "sweep")
    assert parent.info.status == "FINISHED"
    complete = [r for r in runs if "sweeper.trial_key" in r.data.tags]
    keys = Counter(r.data.tags["sweeper.trial_key"] for r in complete)
    assert max(keys.values()) == 1  # nothing measured or recorded twice
    roles = Counter(r.data.tags["sweeper.role"] for r in complete)
    # 4 layouts (global batches 16, 32, 32, 64); the trunk at 16; 2 checkpoints x 2 larger global batches
    assert (roles["throughput"], roles["trunk"], roles["branch"], roles["trial"]) == (4, 1, 4, 4)
    assert 1 <= held < 4  # interrupted mid-branch; the resume ran only the branches it lacked
    trunk = next(r for r in complete if r.data.tags["sweeper.role"] == "trunk")
    trunk_key = trunk.data.tags["sweeper.trial_key"]
    marks = sorted(int(m.value) for m in client.get_metric_history(trunk.info.run_id, "saved_at_samples"))
    assert len(marks) == 2
    for run in (r for r in complete if r.data.tags["sweeper.role"] == "branch"):
        tags, metrics = run.data.tags, run.data.metrics
        assert tags["sweeper.branch_trunk"] == trunk_key and tags["sweeper.status"] == "ok"
        assert int(metrics["branch_checkpoint_samples"]) in marks
        assert tags["sweeper.continued_from"].startswith(f"{store}/")
        assert tags["sweeper.continued_from"].endswith(f"/s{int(metrics['branch_checkpoint_samples'])}")
        assert metrics["branch_global_batch"] in (32, 64)
        # the window's steps at the branch's own global batch, from the checkpoint on
        steps = len(client.get_metric_history(run.info.run_id, "train_loss"))
        assert steps * metrics["branch_global_batch"] == metrics["branch_window_samples"]
    # the critical batch size at each checkpoint, as a curve over samples seen; the answer as an artifact
    answer = json.loads(Path(client.download_artifacts(parent.info.run_id, "branch/answer.json", str(tmp_path)))
                        .read_text())
    assert [c["samples"] for c in answer["checkpoints"]] == marks and answer["schedule"][0] == [0, 16]
    curve = client.get_metric_history(parent.info.run_id, "critical_batch_size_branched")  # where it says something
    said = [c["samples"] for c in answer["checkpoints"] if c["informative"]]
    assert sorted(m.step for m in curve) == said and all(m.value in (16, 32, 64) for m in curve)
    # every span on the trunk's micro-batch and workers, as train.batch_schedule runs it, and timed by a
    # layout the grid measured there
    assert all(re.fullmatch(r"mb16-acc\d+-w1", k) for k in answer["schedule_layouts"])
    assert len(answer["schedule_timed_as"]) == len(answer["schedule"])
    assert set(answer["schedule_timed_as"]) <= {"mb16-acc1-w1", "mb16-acc2-w1"}  # what this grid measured at mb16-w1
    # no point above where it flattens is recommended; the report and the console say what it measured
    flat = int(client.get_run(parent.info.run_id).data.metrics["critical_batch_size_flat"])
    chosen = client.get_run(parent.info.run_id).data.tags.get("sweeper.recommendation", "")
    assert chosen and global_batch(chosen) <= flat
    page = next((tmp_path / "reports").glob("*/report.html")).read_text()
    assert "Critical batch size over training (sweep.strategy=branch)" in page
    assert "<figcaption>critical batch over training</figcaption>" in page
    assert "critical batch size over training" in out


def global_batch(key: str) -> int:
    """The global batch of the recommendation's point ("Train mb32-acc2-w1: ..."), or of a schedule's first
    layout ("Train the batch-size schedule 16 -> 64 on mb16-acc1-w1: ...")."""
    m, a, w = map(int, re.search(r"Train (?:the (?:batch-size )?schedule [\d >-]+ on )?mb(\d+)-acc(\d+)-w(\d+)",
                                 key).groups())
    return m * a * w
