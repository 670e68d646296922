"""Training-state checkpoints (issue 28, its first part): a point saved at a step boundary and continued,
at the same layout or another, trains as the uninterrupted run does; the stream goes on at the same
sample; a checkpoint of another model is refused in one line."""

import pytest
import torch

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.sampler import GlobalBatchSampler
from sweeper.worker import state
from sweeper.worker.spec import PointSpec, Span, WorkerContext
from sweeper.worker.train import train_point
from tests.helpers import point_spec

MLP = ModelConfig(name="mlp", depth=2, width=64, input_shape=[1, 8, 8])
DIGITS = DataConfig(name="digits", num_classes=10)
SGD = OptimConfig(name="sgd", lr=0.05, momentum=0.9)
ADAMW = OptimConfig(name="adamw", lr=0.003)


def _spec(point, steps, optim=SGD, model=MLP, warmup=0, **extra):
    return point_spec(point, model, DIGITS, lr=optim.lr, steps=steps, train=TrainConfig(seed=3, warmup_steps=warmup),
                      measure=MeasureConfig(warmup_steps=1, windows=2, stable_windows=2, memory_breakdown=False),
                      optim=optim, evaluate=False, **extra)


def _losses(result):
    return torch.tensor(result["train_loss"], dtype=torch.float64)


@pytest.mark.parametrize("optim, precision, warmup", [(SGD, "fp32", 0), (ADAMW, "fp32", 5), (ADAMW, "bf16", 0)],
                         ids=["sgd", "adamw-warmup", "adamw-bf16"])
def test_continuing_at_the_same_layout_reproduces_the_uninterrupted_run(tmp_path, optim, precision, warmup):
    torch.set_num_threads(1)
    point = GridPoint(16, 2, 1, precision=precision)
    straight = train_point(_spec(point, 16, optim, warmup=warmup), WorkerContext())
    first = train_point(_spec(point, 7, optim, warmup=warmup, save_state_to=str(tmp_path / "s")), WorkerContext())
    after = train_point(_spec(point, 9, optim, warmup=warmup, start_from=str(tmp_path / "s")), WorkerContext())
    torch.testing.assert_close(_losses(first), _losses(straight)[:7], rtol=0, atol=0)
    torch.testing.assert_close(_losses(after), _losses(straight)[7:], rtol=1e-6, atol=1e-6)
    assert first["checkpoint_samples"] == 7 * 32 and first["checkpoint_bytes"] > 0
    assert first["checkpoint_write_seconds"] > 0 and after["checkpoint_read_seconds"] > 0
    assert after["start_samples"] == 7 * 32 and after["continued_from"] == str(tmp_path / "s")


def test_continuing_at_another_layout_of_the_same_global_batch_matches(tmp_path):
    torch.set_num_threads(1)
    straight = train_point(_spec(GridPoint(32, 1, 1), 14, ADAMW), WorkerContext())
    train_point(_spec(GridPoint(32, 1, 1), 6, ADAMW, save_state_to=str(tmp_path / "s")), WorkerContext())
    other = train_point(_spec(GridPoint(8, 4, 1, checkpointing="blocks"), 8, ADAMW, start_from=str(tmp_path / "s")),
                        WorkerContext())
    torch.testing.assert_close(_losses(other), _losses(straight)[6:], rtol=1e-5, atol=1e-5)


def test_a_continued_stream_goes_on_at_the_same_sample_at_any_global_batch():
    point16, point48 = GridPoint(16, 1, 1), GridPoint(16, 3, 1)
    straight = list(GlobalBatchSampler(1000, point16, 0, 120, 7))
    before = list(GlobalBatchSampler(1000, point16, 0, 50, 7))
    after = list(GlobalBatchSampler(1000, point48, 0, 20, 7, start_sample=50 * 16))  # 960 samples, into epoch 2
    assert before + after == straight[:50 * 16 + 20 * 48]


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path):
    train_point(_spec(GridPoint(16, 1, 1), 4, save_state_to=str(tmp_path / "s")), WorkerContext())
    wider = ModelConfig(name="mlp", depth=2, width=128, input_shape=[1, 8, 8])
    with pytest.raises(ValueError, match=r"was saved by another model.width 64 \(this point: 128\): continue from"):
        train_point(_spec(GridPoint(16, 1, 1), 4, model=wider, start_from=str(tmp_path / "s")), WorkerContext())
    with pytest.raises(ValueError, match="was saved by another optimizer 'sgd'"):
        train_point(_spec(GridPoint(16, 1, 1), 4, ADAMW, start_from=str(tmp_path / "s")), WorkerContext())
    with pytest.raises(ValueError, match="is not a sweeper training-state checkpoint"):
        state.read(str(tmp_path))


@pytest.mark.parametrize("overrides, says", [
    (["train.start_from=/nowhere"], "train.start_from='/nowhere': /nowhere is not a sweeper training-state "
                                    "checkpoint (no meta.json)"),
    (["train.save_state=true", "sweep.strategy=smart"], "train.save_state / train.start_from / "
                                                        "train.batch_schedule with sweep.strategy=smart"),
])
def test_bad_checkpoint_settings_are_one_line_before_ray(overrides, says):
    from tests.helpers import problems as _problems

    problems = _problems("model=mlp", "data=digits", *overrides)
    assert any(says in p for p in problems), problems


def test_a_checkpoint_past_the_budget_is_refused(tmp_path):
    from tests.helpers import problems as _problems

    train_point(_spec(GridPoint(16, 1, 1), 4, save_state_to=str(tmp_path / "s")), WorkerContext())
    problems = _problems("model=mlp", "data=digits", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]",
                         "optim=sgd", "optim.lr=0.05", "optim.momentum=0.9", "train.seed=3", "train.samples=64",
                         f"train.start_from={tmp_path / 's'}")
    assert any("is at 64 samples, less than one global batch" in p for p in problems), problems


def test_resnet18_with_batchnorm_continues_as_the_uninterrupted_run(tmp_path):
    """BatchNorm's running statistics are buffers of the state dict: they travel with the weights."""
    torch.set_num_threads(1)
    resnet = ModelConfig(name="resnet18", input_shape=[3, 16, 16])
    point = GridPoint(8, 1, 1)
    straight = train_point(_spec(point, 8, model=resnet), WorkerContext())
    train_point(_spec(point, 4, model=resnet, save_state_to=str(tmp_path / "s")), WorkerContext())
    after = train_point(_spec(point, 4, model=resnet, start_from=str(tmp_path / "s")), WorkerContext())
    torch.testing.assert_close(_losses(after), _losses(straight)[4:], rtol=1e-6, atol=1e-6)


def test_a_batch_schedule_is_a_run_at_16_then_a_continued_run_at_32_step_for_step(tmp_path):
    """train.batch_schedule [(0, 16), (N, 32)]: the first span at global batch 16 to N samples, then
    accumulation doubled at the same micro-batch, the LR that of global batch 32."""

    torch.set_num_threads(1)
    at16, at32 = GridPoint(16, 1, 1), GridPoint(16, 2, 1)
    n = 6 * 16
    scheduled = train_point(_spec(at16, 6, ADAMW, warmup=4, later_spans=[Span(n, at32, 0.004, 5)]), WorkerContext())
    first = train_point(_spec(at16, 6, ADAMW, warmup=4, save_state_to=str(tmp_path / "s")), WorkerContext())
    then = PointSpec(**{**_spec(at32, 5, ADAMW, warmup=4, start_from=str(tmp_path / "s")).__dict__, "lr": 0.004})
    second = train_point(then, WorkerContext())
    torch.testing.assert_close(_losses(scheduled), torch.cat([_losses(first), _losses(second)]), rtol=0, atol=0)
    assert scheduled["samples_seen"] == n + 5 * 32 and scheduled["optimizer_steps"] == 11
    assert scheduled["schedule_global_batch_size"] == [16.0, 32.0] and scheduled["schedule_steps"] == [6.0, 5.0]
    assert scheduled["schedule_lr"] == [0.003, 0.004] and scheduled["schedule_start_samples"] == [0.0, 96.0]


MLP_CLI = ["model=mlp", "data=digits", "model.depth=2", "model.width=64", "model.input_shape=[1,8,8]",
           "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
           "measure.warmup_steps=2", "measure.windows=3", "train.samples=960", "train.lr_scaling=sqrt",
           "train.base_batch_size=16"]


def test_a_schedule_becomes_each_points_spans_with_their_layout_lr_and_steps():
    from sweeper.driver.preflight import preflight
    from tests.harness import typed_cfg

    cfg = typed_cfg(*MLP_CLI, "train.batch_schedule=[[0,16],[320,32],[640,64]]")
    _, specs = preflight(cfg)
    (spec,) = specs.values()
    assert spec.steps == 20 and spec.point.global_batch_size == 16
    spans = [(s.start_samples, s.point.accumulation_steps, s.steps) for s in spec.later_spans]
    assert spans == [(320, 2, 10), (640, 4, 5)]
    assert spec.later_spans[1].lr == pytest.approx(cfg.optim.lr * 2)  # sqrt(64 / 16)


@pytest.mark.parametrize("schedule, says", [
    ("[[0,32],[320,64]]", "starts at global batch 32, but mb16-acc1-w1 trains at 16"),
    ("[[0,16],[328,32]]", "the span from 0 samples at global batch 16 must end on a whole step"),
    ("[[0,16],[320,24]]", "global batch 24 is not a whole number of mb16-acc1-w1's micro-batch x workers (16)"),
    ("[[16,16]]", "train.batch_schedule starts at 16 samples"),
    ("[[0,16],[0,32]]", "each span must start after the one before"),
    ("[[0,16],[960,32]]", "its last span starts at 960 samples, at or past the budget of 960"),
    ("32", "is invalid: give [samples seen, global batch] pairs"),
])
def test_a_bad_schedule_is_one_line_before_ray(schedule, says):
    from tests.helpers import problems as _problems

    problems = _problems(*MLP_CLI, f"train.batch_schedule={schedule}")
    assert any(says in p for p in problems), problems


def test_a_checkpoint_that_cannot_be_written_is_the_points_recorded_error_not_its_failure(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    result = train_point(_spec(GridPoint(16, 1, 1), 4, save_state_to=str(blocked / "s")), WorkerContext())
    assert result.status == "ok" and "checkpoint_samples" not in result
    assert result.tags()["sweeper.checkpoint_error"].startswith(("FileExistsError", "NotADirectoryError"))


def test_a_continued_run_records_the_points_evaluations_and_keeps_a_target_reached_before(tmp_path):
    """The checkpoint holds the evaluations and the target's figures: the continued run's curve is the
    point's (the first run's, then its own on the uninterrupted run's cadence), and a target reached before
    the checkpoint keeps the samples, steps and seconds it was reached at."""
    from sweeper.config import EvalConfig

    torch.set_num_threads(1)
    every = EvalConfig(every_samples=64, target_accuracy=0.0)  # reached at the first evaluation

    def with_eval(steps, **extra):
        return PointSpec(**{**_spec(GridPoint(16, 1, 1), steps, **extra).__dict__, "eval": every, "evaluate": True})
    straight = train_point(with_eval(10), WorkerContext())
    first = train_point(with_eval(5, save_state_to=str(tmp_path / "s")), WorkerContext())
    after = train_point(with_eval(5, start_from=str(tmp_path / "s")), WorkerContext())
    samples = [s for s, _ in after.progress.val_accuracy_curve]
    # the first run's (on the cadence, then at its end: 80), then where the uninterrupted run evaluates
    assert samples == [64, 80, 128, 160] and after.progress.evaluations == 4
    assert samples[2:] == [s for s, _ in straight.progress.val_accuracy_curve if s > 80]
    assert after.progress.val_loss_curve[:2] == first.progress.val_loss_curve
    assert after["eval_seconds"] > first["eval_seconds"]
    assert (after["samples_to_target"], after["steps_to_target"]) == (64, 4) == (
        straight["samples_to_target"], straight["steps_to_target"])
    assert after["time_to_target_seconds"] == first["time_to_target_seconds"] > 0
    # Continued towards another target, the figures of the first do not count.
    other = train_point(PointSpec(**{**with_eval(5, start_from=str(tmp_path / "s")).__dict__,
                                     "eval": EvalConfig(every_samples=64, target_accuracy=1.01)}), WorkerContext())
    assert other["reached_target"] == 0 and "samples_to_target" not in other
    # A run that continues it again without evaluating saves the point's evaluations on, unchanged.
    quiet = PointSpec(**{**with_eval(2, start_from=str(tmp_path / "s"), save_state_to=str(tmp_path / "t")).__dict__,
                         "evaluate": False})
    train_point(quiet, WorkerContext())
    kept = state.read(str(tmp_path / "t")).history
    assert [e[0] for e in kept.evaluations] == [64, 80] and kept.target["samples_to_target"] == 64


def _scheduled_with_evaluations():
    """Two spans (6 steps of 16, then 4 of 32 from 96 samples) evaluated every 64 samples, the target
    reached at the first evaluation."""
    from sweeper.config import EvalConfig

    torch.set_num_threads(1)
    every = EvalConfig(every_samples=64, target_accuracy=0.0)
    at16, at32 = GridPoint(16, 1, 1), GridPoint(16, 2, 1)
    spec = PointSpec(**{**_spec(at16, 6, later_spans=[Span(96, at32, 0.004, 4)]).__dict__, "eval": every,
                        "evaluate": True})
    return train_point(spec, WorkerContext())


def test_a_schedule_evaluates_in_every_span_and_times_the_target_where_it_is_first_reached():
    result = _scheduled_with_evaluations()
    samples = [s for s, _ in result.progress.val_loss_curve]
    # on the cadence in each span (its own steps: the continued run's rule) and at each span's end
    assert samples == [64, 96, 128, 192, 224] and result.progress.evaluations == 5
    assert (result["samples_to_target"], result["steps_to_target"]) == (64, 4)  # in the first span
    assert result.cost.optimizer_steps == 10


def test_every_evaluation_records_the_runs_wall_clock_across_a_schedules_spans():
    """Issue 46, finding 6: bench_branch's 'measured' seconds to a target were steps x mean step time. Each
    evaluation now records the run's clock there, so a time to a target chosen after the run is read off
    it, on the clock time_to_target_seconds reads (the same seconds where the target was reached)."""
    result = _scheduled_with_evaluations()
    wall, evaluating = result.progress.val_wall_seconds_curve, result.progress.val_eval_seconds_curve
    assert [s for s, _ in wall] == [s for s, _ in evaluating] == [64, 96, 128, 192, 224]  # both spans
    seconds = [t for _, t in wall]
    assert all(b > a for a, b in zip(seconds, seconds[1:]))
    spent = [t for _, t in evaluating]
    assert all(b > a for a, b in zip(spent, spent[1:])) and spent[-1] == pytest.approx(result.progress.eval_seconds)
    assert seconds[0] == pytest.approx(result["time_to_target_seconds"], abs=1e-3)


def test_a_checkpoint_of_another_model_is_refused_before_ray_naming_the_field(tmp_path):
    from tests.helpers import problems as _problems

    train_point(_spec(GridPoint(16, 1, 1), 4, save_state_to=str(tmp_path / "s")), WorkerContext())
    problems = _problems("model=mlp", "data=digits", "model.depth=2", "model.width=128", "model.input_shape=[1,8,8]",
                         "optim=sgd", "optim.lr=0.05", "optim.momentum=0.9", "train.seed=3", "train.samples=640",
                         f"train.start_from={tmp_path / 's'}")
    assert problems == [f"train.start_from='{tmp_path / 's'}' was saved by another model.width 64 (this point: 128) "
                        "(mb16-acc1-w1): continue from a checkpoint of the same model, data, optimizer and seed"]


def test_a_continued_run_carries_the_loss_history_and_the_noise_scales_moving_averages(tmp_path):
    """The checkpoint holds every step's loss and noise estimates, so the continued run's divergence check
    sees the point's untrained loss and its B_simple moving averages go on: the same as the run not split."""
    torch.set_num_threads(1)
    point = GridPoint(16, 2, 1)  # two micro-batches a step: the noise scale is measured
    straight = train_point(_spec(point, 16), WorkerContext())
    first = train_point(_spec(point, 7, save_state_to=str(tmp_path / "s")), WorkerContext())
    history = state.read(str(tmp_path / "s")).history
    assert history.losses == pytest.approx(first["train_loss"], rel=1e-12) and len(history.losses) == 7
    assert [t for t, _ in history.noise] == pytest.approx(first["gns_trace_sigma_per_step"], rel=1e-12)
    after = train_point(_spec(point, 9, start_from=str(tmp_path / "s")), WorkerContext())
    assert after["gns_b_simple"] == pytest.approx(straight["gns_b_simple"], rel=1e-4)
    assert after["gns_b_simple_ema"] == pytest.approx(straight["gns_b_simple_ema"][7:], rel=1e-4)
    # Its own 9 estimates alone would give another ratio: the moving averages did go on from the first 7.
    from sweeper.config import GnsConfig
    from sweeper.worker import gns

    own = [gns.Estimate(g2, t) for t, g2 in zip(after["gns_trace_sigma_per_step"], after["gns_grad_sq_norm_per_step"])]
    assert len(own) == 9
    assert gns.ema_ratio(own, GnsConfig().ema_beta)[-1] != pytest.approx(after["gns_b_simple"], rel=1e-2)
