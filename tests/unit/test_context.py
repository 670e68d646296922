"""sweep.context_lengths, a language model's training sequence length as a grid axis: points keyed per
context, the same tokens at every context, FLOPs and data per context, smart classes that never mix
contexts, and the bad inputs refused before Ray."""

import pytest

from sweeper import plan
from sweeper.driver.preflight import preflight
from sweeper.plan import GridPoint
from sweeper.report.trials import Trial
from sweeper.strategies import smart
from sweeper.worker.points import implied_oom
from sweeper.workloads import gpt
from tests.harness import typed_cfg
from tests.helpers import problems as problems_of

TINY = ["model=gpt", "data=text", "model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.context=64",
        "train.samples=512", "sweep.micro_batch_sizes=[8]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]"]


def _cfg(*overrides):
    return typed_cfg(*TINY, *overrides)


def _problems(*overrides):
    return problems_of(*TINY, *overrides)


def test_a_context_is_an_axis_with_its_own_key_and_the_same_tokens():
    points = plan.expand_grid([8, 16], [1], [1], contexts=[32, 64])
    assert [p.key for p in points] == ["mb8-acc1-w1-ctx32", "mb16-acc1-w1-ctx32", "mb8-acc1-w1-ctx64",
                                       "mb16-acc1-w1-ctx64"]
    assert GridPoint(8, 1, 1, lr_multiplier=2.0, seed=1, context=32).key == "mb8-acc1-w1-lrx2-ctx32-s1"
    assert plan.expand_grid([8], [1], [1])[0].key == "mb8-acc1-w1"  # no axis: the key it always had
    # train.samples counts sequences of model.context: half as long, twice as many, the same tokens.
    assert plan.sample_budget(0, 1, 512, 32, 64) * 32 == 512 * 64
    assert plan.sample_budget(0, 1, 512, None, 64) == 512
    assert plan.sample_budget(1000, 2, None, 32, 64) == 2000  # epochs: the whole set at that context
    assert smart.class_key(points[0], False) == "gb8-ctx32" != smart.class_key(points[2], False)
    # A longer context holds more activations: an out-of-memory shorter one implies it, not the reverse.
    long, short = GridPoint(8, 1, 1, context=64), GridPoint(8, 1, 1, context=32)
    assert implied_oom(long, [short]) == short and implied_oom(short, [long]) is None


def test_each_context_trains_its_own_sequences_and_flops_at_the_same_tokens():
    cfg = _cfg("sweep.context_lengths=[32,64]")
    prepared, specs = preflight(cfg)
    by_context = {p.context: s for p, s in specs.items()}
    assert by_context[32].model.input_shape == [32] and by_context[64].model.input_shape == [64]
    assert by_context[32].model.context == by_context[64].model.context == 64  # one model, one position table
    assert by_context[32].steps == 2 * by_context[64].steps  # 1,024 sequences of 32 against 512 of 64
    per_token = {c: s.flop_count.train_per_sample / c for c, s in by_context.items()}
    for context, counted in per_token.items():
        assert counted == pytest.approx(gpt.train_flops_per_token(256, context, 1, 32), rel=0.03)
    assert per_token[64] > per_token[32]  # attention's 12 L d T grows with the context


@pytest.mark.parametrize("overrides, says", [
    (["sweep.context_lengths=[32,128]"], "sweep.context_lengths has 128, above model.context=64 (the model's "
                                         "position table): raise model.context to 128 or drop it"),
    (["sweep.context_lengths=[1]"], "sweep.context_lengths contains 1: every value must be an integer >= 2"),
    (["model=mlp", "data=digits", "sweep.context_lengths=[32]"], "model=mlp has no context"),
    (["sweep.context_lengths=[32,32]"], "sweep.context_lengths gives 32 more than once"),
    (["sweep.context_lengths=[32]", "sweep.micro_batch_sizes=auto", "device.memory_budget_gb=1"],
     "sweep.context_lengths with sweep.micro_batch_sizes=auto"),
    (["report.quality=val_bits_per_byte", "data=tokens", "data.path=/nowhere"], "report.quality=val_bits_per_byte "
                                                                               "needs byte-level text"),
])
def test_bad_context_and_quality_input_is_one_line_naming_the_key(overrides, says):
    problems = _problems(*overrides)
    assert any(says in p for p in problems), problems


def test_one_context_given_as_a_number_is_a_list():
    assert _cfg("sweep.context_lengths=32").sweep.context_lengths == [32]


def test_the_report_keeps_contexts_apart_in_layouts_and_plot_series():
    from sweeper.report import folding, plots

    a = Trial("mb8-acc1-w1-lrx2-ctx32", 8, 1, 1, 8, "ok", lr_multiplier=2.0, context=32)
    b = Trial("mb8-acc1-w1-ctx64", 8, 1, 1, 8, "ok", context=64)
    assert folding.layout_key(a) == "mb8-acc1-w1-ctx32"
    assert plots.series_of(a)[2] == "LR x2, context 32" and plots.series_of(b)[2] == "context 64"
    assert plots.series_of(Trial("mb8-acc1-w1", 8, 1, 1, 8, "ok", context=64))[2] == ""


def test_a_sweep_recorded_before_these_settings_existed_is_still_the_same_experiment():
    import yaml

    from sweeper.driver.resume import differences

    now = yaml.safe_dump({"model": {"name": "gpt", "hf_type": "gpt2"}, "sweep": {"context_lengths": None}})
    assert differences(yaml.safe_dump({"model": {"name": "gpt"}}), now) == []  # absent: the default
    assert differences(yaml.safe_dump({"model": {"name": "gpt"}, "sweep": {"context_lengths": [32]}}), now) == [
        "sweep.context_lengths: [32] -> None"]
