"""The real thing: the CLI on a real Ray (the session's, or its own local one where that is what is
tested) and a SQLite MLflow store, read back afterwards."""

import gzip
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch
from mlflow.tracking import MlflowClient

from sweeper.config import ModelConfig
from sweeper.workloads import models
from tests.harness import run_cli

pytestmark = pytest.mark.e2e

TINY_MLP = ["model=mlp", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]"]
# The mechanics below were written against SGD (momentum: one buffer a parameter); the default is AdamW.
BUDGET = ["train.epochs=1", "measure.warmup_steps=3", "measure.windows=3"]
TRAIN = ["optim=sgd", "optim.lr=0.1", *BUDGET]


def _runs(tmp_path, experiment="sweeper"):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweeper.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("sweeper.role") == "trial"]
    return client, parents, children


# On the session's Ray (a local Ray's own start-up, its token in .sweeper/ray and nothing in $HOME, is
# test_ui's dashboard test, whose sweep starts one). Nothing here is timed against a bound the machine's
# load can break, so it runs beside the other worker's tests.
def test_equal_global_batch_layouts_give_one_loss_curve_through_the_cli(tmp_path):
    started = time.perf_counter()
    result = run_cli(
        *TINY_MLP, "data=digits", *TRAIN,
        "sweep.micro_batch_sizes=[8,16]", "sweep.accumulation_steps=[1,2,4]",
        "sweep.num_workers=[1,2]", "sweep.global_batch_sizes=[32]",
        cwd=tmp_path,
    )
    lifetime = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "mlflow ui --backend-store-uri sqlite:///" in result.stdout
    assert "Ray dashboard:" in result.stdout

    client, parents, children = _runs(tmp_path)
    assert len(parents) == 1
    parent = parents[0]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"config.yaml", "overrides.yaml", "command.txt",
                                                                           "report"}
    layouts = {(r.data.params["micro_batch_size"], r.data.params["accumulation_steps"], r.data.params["num_workers"])
               for r in children}
    assert layouts == {("8", "4", "1"), ("16", "2", "1"), ("8", "2", "2"), ("16", "1", "2")}

    # Measurements (issue 3): every child carries them under their schema names.
    tiny = models.build(ModelConfig(name="mlp", depth=2, width=64, input_shape=[1, 8, 8]), 10)
    param_bytes = 4 * sum(p.numel() for p in tiny.parameters())
    for run in children:
        m, tags = run.data.metrics, run.data.tags
        assert m["memory_parameters_bytes"] == param_bytes  # known answer: float32 parameters
        assert m["memory_optimizer_state_bytes"] == param_bytes  # SGD momentum: one buffer per parameter
        assert m["peak_memory_bytes"] == m["memory_tracked_peak_bytes"] >= 2 * param_bytes
        assert m["cpu_rss_peak_above_baseline_bytes"] > 0
        assert m["flops_per_sample_train"] > m["flops_per_sample_forward"] > 0
        assert tags["sweeper.peak_flops_source"].startswith("measured: fp32 ")
        assert 0 < m["mfu"] and m["achieved_flops_per_second"] > 0
        assert m["timing_windows"] == 3 and tags["sweeper.throughput_stable"] in ("true", "false")
        # A step's parts are recorded (their arithmetic, against a step of known duration: test_training).
        assert min(m[f"{p}_seconds_per_step"] for p in ("data", "forward_backward", "optimizer")) >= 0
        assert m["forward_backward_seconds_per_step"] > 0
        assert m["process_cpu_percent_mean"] > 0
        assert 0 < m["startup_seconds"] < m["trial_seconds"]
    # One Ray Train worker group of 2 for all four points; its start-up is logged once.
    group_starts = [r for r in children if "worker_group_startup_seconds" in r.data.metrics]
    assert len(group_starts) == 1 and group_starts[0].data.params["num_workers"] == "1"
    assert {r.data.metrics["worker_group_points"] for r in children} == {4.0}
    # The group's start-up is logged in its parts (their sum: test_overhead), within the grid's time;
    # every later point records the harness's gap before it.
    gm = group_starts[0].data.metrics
    pm = client.get_run(parent.info.run_id).data.metrics
    assert min(gm[f"worker_group_{p}_seconds"] for p in ("launch", "init", "setup")) >= 0
    assert 0 < gm["worker_group_startup_seconds"] < pm["sweep_grid_seconds"]
    others = [r.data.metrics for r in children if r is not group_starts[0]]
    assert "between_points_seconds" not in gm
    # (A toy point trains in ~0.1 s, less than the report round trip: only the grid bounds the gap.)
    assert all(0 <= m["between_points_seconds"] < pm["sweep_grid_seconds"] for m in others)
    # Each trial's run spans its own time in the worker (the UI's Duration column).
    for run in children:
        assert run.info.end_time - run.info.start_time == pytest.approx(
            run.data.metrics["trial_seconds"] * 1000, abs=2)
    assert pm["sweep_wall_seconds"] > pm["sum_trial_seconds"] > pm["sum_train_seconds"] > 0
    assert pm["sweep_wall_over_train_seconds"] > pm["sweep_wall_over_trial_seconds"] > 1
    phases = {"setup", "ray_start", "tracking", "grid", "report"}
    assert {k for k in pm if k.startswith("sweep_") and k.endswith("_seconds") and "_over_" not in k} == {
        f"sweep_{p}_seconds" for p in phases | {"wall"}}
    # The wall time against clocks the driver does not keep: it spans at least the parent run's start
    # to the last point's end (MLflow's timestamps, in ms), and at most the CLI process's whole life.
    last_point_end = max(r.info.end_time for r in children)
    assert (last_point_end - parent.info.start_time) / 1000 - 0.002 <= pm["sweep_wall_seconds"] <= lifetime

    curves = []
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["sweeper.status"] == "ok"
        p, m = run.data.params, run.data.metrics
        assert set(p) >= {"model", "dataset", "micro_batch_size", "accumulation_steps", "num_workers",
                          "global_batch_size", "lr"}
        assert p["global_batch_size"] == "32" and p["model"] == "mlp" and p["dataset"] == "digits"
        assert m["samples_per_second"] > 0 and m["step_time_seconds"] > 0 and m["peak_memory_bytes"] > 0
        assert 0.0 <= m["val_accuracy"] <= 1.0
        assert m["startup_seconds"] > 0
        history = sorted(client.get_metric_history(run.info.run_id, "train_loss"), key=lambda x: x.step)
        assert [h.step for h in history] == list(range(1437 // 32))
        curves.append(torch.tensor([h.value for h in history]))
    for curve in curves[1:]:
        torch.testing.assert_close(curve, curves[0], rtol=1e-4, atol=1e-5)

    # The report (issue 5): files on the parent run and next to the store, the answer printed.
    report_files = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/recommendation.yaml", "report/throughput_vs_micro_batch.png",
            "report/memory_vs_micro_batch.png", "report/accuracy_vs_global_batch.png",
            "report/pareto_throughput_memory.png"} <= report_files
    tags = client.get_run(parent.info.run_id).data.tags
    assert tags["sweeper.recommendation"].startswith("Train mb")
    assert tags["sweeper.recommended_overrides"].startswith("sweep.micro_batch_sizes=[")
    assert "recommendation:\nTrain mb" in result.stdout
    on_disk = tmp_path / "reports" / parent.info.run_name / "report.html"
    assert on_disk.exists() and "data:image/png;base64," in on_disk.read_text()
    # ... and rebuilt from MLflow alone, by experiment name.
    again = subprocess.run(
        [sys.executable, "-m", "sweeper.report", "sweeper", "--no-log", "--out", str(tmp_path / "again")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.startswith("Train mb") and (tmp_path / "again" / "report.html").exists()


def test_own_model_factory_on_synthetic_data_reports_no_accuracy(tmp_path):
    result = run_cli(
        "model=custom", "model._target_=torchvision.models.mobilenet_v3_small", "model.input_shape=[3,32,32]",
        "data=synthetic", "data.num_samples=384", *TRAIN,
        "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[2]", "sweep.num_workers=[1]",
        "tracking.experiment_name=custom", "profile=true", "measure.profile_steps=2",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "synthetic data has random labels" in result.stdout
    client, parents, children = _runs(tmp_path, "custom")
    assert len(parents) == 1 and len(children) == 1
    run = children[0]
    assert run.data.tags["sweeper.status"] == "ok"
    assert "val_accuracy" not in run.data.metrics
    assert "random labels" in run.data.tags["sweeper.accuracy"]
    assert math.isfinite(run.data.metrics["train_loss"])

    # profile=true: a Chrome trace of the profiled steps, as an artifact of the trial's run.
    assert [a.path for a in client.list_artifacts(run.info.run_id, "profile")] == ["profile/rank0.pt.trace.json.gz"]
    local = client.download_artifacts(run.info.run_id, "profile/rank0.pt.trace.json.gz", str(tmp_path))
    with gzip.open(local, "rt") as f:
        trace = json.load(f)
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("ProfilerStep" in name for name in names) and any("conv" in name for name in names)


FRAGILE_MODEL = """
import torch


class Fragile(torch.nn.Module):
    # Bad model code that only shows at some batch sizes.
    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        if self.training and x.shape[0] > 16:
            raise ValueError("fragile model: batch larger than 16")
        return self.linear(x.flatten(1))
"""


def test_a_point_that_raises_is_recorded_failed_and_its_group_goes_on(tmp_path):
    (tmp_path / "fragile.py").write_text(FRAGILE_MODEL)
    result = run_cli(
        "model=custom", "model._target_=fragile.Fragile", "model.input_shape=[1,8,8]", *TRAIN,
        "sweep.micro_batch_sizes=[32,8]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout
    client, parents, children = _runs(tmp_path)
    by_micro = {r.data.params["micro_batch_size"]: r for r in children}
    assert set(by_micro) == {"32", "8"}
    failed, ok = by_micro["32"], by_micro["8"]
    assert failed.data.tags["sweeper.status"] == "failed" and failed.info.status == "FAILED"
    assert failed.data.tags["sweeper.error"] == "ValueError: fragile model: batch larger than 16"
    # The same worker group measured the next point after the failure.
    assert ok.data.tags["sweeper.status"] == "ok" and ok.data.metrics["samples_per_second"] > 0
    assert client.get_run(parents[0].info.run_id).info.status == "FAILED"


def test_a_recipe_sweep_crosses_precision_and_checkpointing_with_adamw(tmp_path):
    result = run_cli(
        *TINY_MLP, *BUDGET, "optim=adamw", "optim.lr=0.001", "sweep.micro_batch_sizes=[16]",
        "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]", "sweep.precisions=[fp32,bf16]",
        "sweep.activation_checkpointing=[none,blocks]", "tracking.experiment_name=recipe",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client, parents, children = _runs(tmp_path, "recipe")
    by_key = {r.data.tags["sweeper.trial_key"]: r for r in children}
    assert set(by_key) == {"mb16-acc1-w1", "mb16-acc1-w1-bf16", "mb16-acc1-w1-ckpt", "mb16-acc1-w1-bf16-ckpt"}
    tiny = models.build(ModelConfig(name="mlp", depth=2, width=64, input_shape=[1, 8, 8]), 10)
    param_bytes = 4 * sum(p.numel() for p in tiny.parameters())
    for key, run in by_key.items():
        p, m = run.data.params, run.data.metrics
        assert (p["precision"], p["activation_checkpointing"]) == (
            "bf16" if "bf16" in key else "fp32", "blocks" if "ckpt" in key else "none")
        assert p["optimizer"] == "adamw" and p["compiled"] == "False"
        assert m["memory_optimizer_state_bytes"] >= 2 * param_bytes  # AdamW: two fp32 tensors a parameter
        precision = "bf16" if "bf16" in key else "fp32"
        assert run.data.tags["sweeper.peak_flops_source"].startswith(f"measured: {precision} ")
        if "ckpt" in key:
            assert m["checkpointed_blocks"] == 2 and m["hfu"] > m["mfu"] > 0
            assert m["flops_per_sample_hardware"] > m["flops_per_sample_train"]
        else:
            assert m["hfu"] == pytest.approx(m["mfu"])
    params = client.get_run(parents[0].info.run_id).data.params
    assert params["optimizer"] == "adamw" and params["precisions"] == "['fp32', 'bf16']"


def test_a_diverging_lr_is_a_diverged_point_and_replicates_share_their_point(tmp_path):
    result = run_cli(
        *TINY_MLP, *TRAIN, "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
        "sweep.lr_multipliers=[1,10000]", "sweep.seeds=[0,1]", "eval.every_samples=400", "eval.target_accuracy=0.5",
        "tracking.experiment_name=diverge", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]  # diverged is a result
    client, parents, children = _runs(tmp_path, "diverge")
    by_key = {r.data.tags["sweeper.trial_key"]: r for r in children}
    assert set(by_key) == {"mb16-acc1-w1-s0", "mb16-acc1-w1-s1", "mb16-acc1-w1-lrx10000-s0", "mb16-acc1-w1-lrx10000-s1"}
    for seed in (0, 1):
        good, bad = by_key[f"mb16-acc1-w1-s{seed}"], by_key[f"mb16-acc1-w1-lrx10000-s{seed}"]
        assert good.data.tags["sweeper.status"] == "ok" and good.data.params["point"] == "mb16-acc1-w1"
        assert bad.data.tags["sweeper.status"] == "diverged" and bad.data.params["point"] == "mb16-acc1-w1-lrx10000"
        assert bad.data.tags["sweeper.divergence"] in ("nonfinite", "spike")
        assert bad.data.metrics["diverged_at_step"] >= 0 and bad.info.status == "FINISHED"
        # The curve of evaluations: every 400 samples rounded up to 25 steps of 16, then the last step.
        curve = client.get_metric_history(good.info.run_id, "val_accuracy_curve")
        assert sorted(h.step for h in curve) == [400, 800, 1200, 1424]
        assert good.data.metrics["reached_target"] in (0.0, 1.0)
    tags = client.get_run(parents[0].info.run_id).data.tags
    assert "lrx10000" not in tags.get("sweeper.recommended_overrides", "")
    assert client.get_run(parents[0].info.run_id).data.metrics["num_trials_diverged"] == 2


def test_a_language_model_on_your_own_token_files_through_the_cli(tmp_path):
    """model=gpt on a nanoGPT train.bin/val.bin folder at two contexts (sweep.context_lengths): tokens/s,
    FLOPs per token and the loss in the record, the same tokens at each context, the table in tokens/s,
    the data's files named in its MLflow dataset input, the recommendation judged by the loss."""
    import numpy as np

    folder = tmp_path / "corpus"
    folder.mkdir()
    # A learnable stream: a repeating phrase of 12 ids among 40, with some noise.
    rng = np.random.default_rng(0)
    phrase = rng.integers(0, 40, 12)
    for name, length in (("train.bin", 24_000), ("val.bin", 2_400)):
        ids = np.resize(phrase, length)
        noise = rng.random(length) < 0.05
        ids[noise] = rng.integers(0, 40, int(noise.sum()))
        ids.astype(np.uint16).tofile(folder / name)
    result = run_cli(
        "model=gpt", "model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.context=16",
        "data=tokens", f"data.path={folder}", "data.vocab_size=40", "train.samples=768", "optim.lr=0.01",
        "measure.warmup_steps=3", "measure.windows=3",
        "sweep.micro_batch_sizes=[8]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1]",
        "sweep.context_lengths=[8,16]",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tokens/s" in result.stdout and "val loss" in result.stdout
    client, parents, children = _runs(tmp_path)
    assert sorted(run.data.params["point"] for run in children) == [
        "mb8-acc1-w1-ctx16", "mb8-acc1-w1-ctx8", "mb8-acc2-w1-ctx16", "mb8-acc2-w1-ctx8"]
    for run in children:
        metrics, params = run.data.metrics, run.data.params
        context = int(params["context"])
        assert run.data.tags["sweeper.status"] == "ok", run.data.tags
        assert metrics["tokens_per_second"] == pytest.approx(context * metrics["samples_per_second"])
        assert metrics["tokens_seen"] == context * metrics["samples_seen"] == 768 * 16  # the same tokens
        assert int(params["tokens_per_step"]) == context * int(params["global_batch_size"])
        assert metrics["val_loss"] < metrics["train_unigram_entropy_bits"] * math.log(2)  # it learned the phrase
        assert metrics["flops_per_token_train"] > 0 and "val_bits_per_byte" not in metrics
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert str(folder) in inputs[0].dataset.source
    # Judged by the loss in nats per token (not bytes: no bits per byte), ranked by tokens/s.
    answer = parents[0].data.tags["sweeper.recommendation"]
    assert "val_loss" in answer and "tokens/s" in answer and "val_accuracy" not in answer, answer


HIT_RATE = """
import torch


class HitRate:  # eval.metrics_fn: accuracy again, as a user's metric
    higher_is_better = {"hit_rate": True}

    def update(self, outputs, batch):
        return {"hits": outputs.argmax(-1) == batch[1], "samples": torch.ones(len(batch[1]))}

    def compute(self, totals):
        return {"hit_rate": float(totals["hits"] / totals["samples"])}
"""


def test_your_own_metric_is_recorded_and_judges_the_recommendation_through_the_cli(tmp_path):
    """eval.metrics_fn in Ray's workers, over every worker's share; recorded in MLflow; report.quality_metric
    judges by it; eval.max_samples and eval.batch_size scored what they say."""
    (tmp_path / "my_metrics.py").write_text(HIT_RATE)
    result = run_cli(
        *TINY_MLP, *TRAIN, "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1,2]",
        "sweep.num_workers=[1,2]", "sweep.global_batch_sizes=[32]", "eval.metrics_fn=my_metrics.HitRate",
        "eval.max_samples=300", "eval.batch_size=64", "report.quality_metric=hit_rate",
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _, parents, children = _runs(tmp_path)
    assert sorted(run.data.params["point"] for run in children) == ["mb16-acc1-w2", "mb16-acc2-w1"]
    for run in children:
        metrics = run.data.metrics
        assert metrics["val_samples"] == 300 and metrics["eval_batch_size"] == 64
        # Counts from both workers' shares: the hit rate is the accuracy over the 300 samples, exactly.
        assert metrics["val_metric/hit_rate"] == pytest.approx(metrics["val_accuracy"], abs=1e-12)
        assert 0 < metrics["val_metric_se/hit_rate"] < 0.1
        assert run.data.tags["sweeper.metric_directions"] == "hit_rate=higher"
    assert "the report could not be built" not in result.stdout, result.stdout[-3000:]
    answer = parents[0].data.tags["sweeper.recommendation"]
    assert "hit_rate" in answer and "val_accuracy" not in answer, answer


def test_a_point_saves_its_training_state_and_a_later_sweep_continues_it_through_the_cli(tmp_path):
    """train.save_state=true records each point's checkpoint; train.start_from continues from it at
    another layout, training what is left of the budget where the stream stood."""
    point = ["sweep.micro_batch_sizes=[16]", "sweep.num_workers=[1]", "measure.warmup_steps=2",
             "measure.windows=3", "optim=adamw", "optim.lr=0.003"]
    first = run_cli(*TINY_MLP, "data=digits", *point, "sweep.accumulation_steps=[1]", "train.samples=480",
                    "train.save_state=true", cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    _, _, children = _runs(tmp_path)
    (saved,) = children
    folder = saved.data.tags["sweeper.checkpoint"]
    assert saved.data.metrics["checkpoint_samples"] == 480 and saved.data.metrics["checkpoint_bytes"] > 0
    assert os.path.isfile(os.path.join(folder, "meta.json"))

    then = run_cli(*TINY_MLP, "data=digits", *point, "sweep.accumulation_steps=[2]", "train.samples=1440",
                   f"train.start_from={folder}", "tracking.experiment_name=continued", cwd=tmp_path)
    assert then.returncode == 0, then.stdout[-3000:] + then.stderr[-3000:]
    _, _, (continued,) = _runs(tmp_path, "continued")
    metrics = continued.data.metrics
    assert continued.data.tags["sweeper.continued_from"] == folder and metrics["start_samples"] == 480
    assert metrics["samples_seen"] == 1440 - 480 and metrics["checkpoint_read_seconds"] > 0
    losses = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(continued.info.run_id, "train_loss")
    first_losses = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(saved.info.run_id,
                                                                                          "train_loss")
    # It goes on from the trained weights, not from a fresh model's loss (ln 10 = 2.3). A checkpoint of
    # another model is refused before Ray: tests/unit/test_state.py.
    assert losses[0].value < first_losses[0].value - 0.3
