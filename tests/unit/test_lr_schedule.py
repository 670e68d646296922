"""train.lr_schedule after train.warmup_steps, counted in samples of the point's budget (sweeper/lr_schedule.py):
the factors worked out by hand, the optimizer's groups following them, and a continued point going on from
where its schedule stood."""

import math

import pytest
import torch

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.lr_schedule import Schedule
from sweeper.plan import GridPoint
from sweeper.worker.spec import WorkerContext
from sweeper.worker.step import LRSchedule
from sweeper.worker.train import train_point
from tests.helpers import point_spec, problems

# A budget of 1000 samples, a warm-up of 100 (10 steps of 10), a floor of 0.1.
T, W, G, LOW = 1000, 100, 10, 0.1


def test_the_warmup_counts_the_samples_after_the_step_and_matches_todays_rational():
    schedule = Schedule("constant", T, W)
    assert schedule.factor(0, G) == 10 / 100  # step 0 ends at 10 samples
    assert schedule.factor(40, G) == 50 / 100
    assert schedule.factor(90, G) == 1.0 and schedule.factor(500, G) == 1.0
    # today's Warmup: (step + 1) / warmup_steps at one global batch, the same float
    assert [Schedule("constant", T, 4 * 32).factor(k * 32, 32) for k in range(5)] == [1 / 4, 2 / 4, 3 / 4, 1.0, 1.0]


@pytest.mark.parametrize("samples, linear, cosine", [
    (100, 1.0, 1.0),  # the first step after the warm-up: the full LR
    (325, 0.775, 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2),  # a quarter of the 900 decaying samples: 0.868198
    (550, 0.55, 0.55),  # halfway both are at the mean of 1 and the floor
    (1000, 0.1, 0.1),  # the end of the budget: the floor
    (1200, 0.1, 0.1),  # past it (a budget rounded up to a global batch): still the floor
])
def test_linear_and_cosine_decay_from_the_warmups_end_to_the_floor(samples, linear, cosine):
    assert Schedule("linear", T, W, LOW).factor(samples, G) == pytest.approx(linear, abs=1e-12)
    assert Schedule("cosine", T, W, LOW).factor(samples, G) == pytest.approx(cosine, abs=1e-12)


def test_cosine_at_a_quarter_is_the_worked_number():
    assert Schedule("cosine", T, W, LOW).factor(325, G) == pytest.approx(0.868198, abs=1e-6)


def test_wsd_holds_then_decays_over_the_budgets_last_fraction():
    wsd = Schedule("wsd", T, W, LOW, decay_fraction=0.2)  # decays from 800 samples on
    assert wsd.decay_start == 800
    assert wsd.factor(40, G) == 0.5  # warming up
    assert wsd.factor(790, G) == 1.0  # stable
    assert wsd.factor(900, G) == pytest.approx(1 - 0.9 * 0.5)  # halfway through its 200 decaying samples
    assert wsd.factor(1000, G) == pytest.approx(LOW)
    # a decay share reaching into the warm-up starts at the warm-up's end
    assert Schedule("wsd", T, W, 0.0, decay_fraction=1.0).decay_start == W


def test_a_warmup_as_long_as_the_budget_leaves_nothing_to_decay():
    assert Schedule("cosine", 100, 100, 0.0).factor(90, G) == 1.0


def test_every_parameter_group_follows_its_own_lr():
    weights = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD([{"params": [weights[0]]}, {"params": [weights[1]], "lr": 0.2}], lr=1.0)
    schedule = LRSchedule(optimizer, Schedule("linear", T, W, LOW), start_samples=320, global_batch=G)
    schedule.set(0)  # the step training samples [320, 330): 1 - 0.9 x 220/900
    factor = 1 - 0.9 * 220 / 900
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([factor, 0.2 * factor])


MLP = ModelConfig(name="mlp", depth=2, width=32, input_shape=[1, 8, 8])
DIGITS = DataConfig(name="digits")
ADAMW = OptimConfig(name="adamw", lr=0.003)


def _spec(point, steps, budget, **extra):
    train = TrainConfig(seed=3, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1)
    return point_spec(point, MLP, DIGITS, lr=ADAMW.lr, steps=steps, train=train, optim=ADAMW, evaluate=False,
                      measure=MeasureConfig(warmup_steps=1, windows=2, stable_windows=2, memory_breakdown=False),
                      schedule_samples=budget, **extra)


def test_a_point_continued_at_another_global_batch_goes_on_where_its_schedule_stood(tmp_path):
    """Cosine over a budget of 512 samples with a warm-up of 2 steps at 32: 8 steps at 32, then 2 at 64 from the
    checkpoint. The LR each run leaves for its next step is the schedule's at the samples seen: the second run
    went on from sample 256 (not from its own start) with the warm-up kept in samples."""
    from sweeper.worker import state

    torch.set_num_threads(1)
    first = train_point(_spec(GridPoint(32, 1, 1), 8, 512, save_state_to=str(tmp_path / "a")), WorkerContext())
    assert first.status == "ok", first.error
    position = state.read(str(tmp_path / "a")).position
    assert (position.lr_schedule, position.schedule_samples, position.warmup_samples) == ("cosine", 512, 64)
    assert position.lr == pytest.approx(ADAMW.lr * (0.1 + 0.9 * (1 + math.cos(math.pi * 192 / 448)) / 2))
    spec = _spec(GridPoint(32, 2, 1), 2, 512, start_from=str(tmp_path / "a"), save_state_to=str(tmp_path / "b"))
    second = train_point(spec, WorkerContext())
    assert second.status == "ok", second.error
    after = state.read(str(tmp_path / "b")).position
    assert after.samples_seen == 384
    assert after.lr == pytest.approx(ADAMW.lr * (0.1 + 0.9 * (1 + math.cos(math.pi * 320 / 448)) / 2))


def test_a_continued_cosine_point_reproduces_the_uninterrupted_one(tmp_path):
    torch.set_num_threads(1)
    point = GridPoint(16, 2, 1)
    straight = train_point(_spec(point, 12, 384), WorkerContext())
    first = train_point(_spec(point, 5, 384, save_state_to=str(tmp_path / "s")), WorkerContext())
    after = train_point(_spec(point, 7, 384, start_from=str(tmp_path / "s")), WorkerContext())
    losses = torch.tensor(straight["train_loss"], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(first["train_loss"], dtype=torch.float64), losses[:5], rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(after["train_loss"], dtype=torch.float64), losses[5:], rtol=1e-6,
                               atol=1e-6)
    # and the schedule changed the training: a constant LR gives another curve
    constant = _spec(point, 12, 384)
    constant = constant.__class__(**{**constant.__dict__, "train": TrainConfig(seed=3, warmup_steps=2)})
    assert abs(train_point(constant, WorkerContext())["train_loss"][-1] - straight["train_loss"][-1]) > 1e-4


@pytest.mark.parametrize("override, says", [
    ("train.lr_schedule=step", "train.lr_schedule 'step' is invalid. Should be one of ('constant', 'linear', "
                               "'cosine', 'wsd')."),
    ("train.min_lr_ratio=1.5", "train.min_lr_ratio=1.5: must be in [0, 1]"),
    ("train.decay_fraction=0", "train.decay_fraction=0.0: must be in (0, 1]"),
    ("train.grad_clip_norm=-1", "train.grad_clip_norm=-1.0: must be a positive norm, e.g. 1.0, or null"),
    ("train.grad_clip_norm=nan", "train.grad_clip_norm=nan is not a finite number"),
    ("train.step_fn=nowhere.step", "train.step_fn='nowhere.step' cannot be imported"),
    ("data.collate_fn=nowhere.collate", "data.collate_fn='nowhere.collate' cannot be imported"),
    ("data.samples_fn=nowhere.count", "data.samples_fn='nowhere.count' cannot be imported"),
    ("optim.no_decay=[bias,'']", "optim.no_decay=['bias', '']: give a list of name parts"),
])
def test_a_bad_recipe_setting_is_one_line_naming_the_key_before_any_trial(override, says):
    found = problems("model=mlp", "data=digits", override)
    assert any(p.startswith(says) for p in found), found
