"""Your training, in one process: your step (train.step_fn), the model's own loss for batch mappings with labels,
batches of any nesting made by your collate (data.collate_fn), losses that count items, clipping worked out by
hand, weight decay's parameter groups, your data factory's check, the largest batch in the tracked step, a
precision the device only emulates, and a Hugging Face sequence classifier trained through all of it.

The pieces a team writes are in tests/your_training.py; the two-rank layouts are tests/unit/test_step_layouts.py.
"""

import collections
import dataclasses

import pytest
import torch

from sweeper import recipe
from sweeper.config import DataConfig, GnsConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.sampler import GlobalBatchSampler
from sweeper.worker import largest
from sweeper.worker.spec import WorkerContext
from sweeper.worker.train import train_point
from sweeper.workloads import batches, datasets
from tests import your_training as yours
from tests.helpers import point_spec

MEASURE = MeasureConfig(warmup_steps=2, windows=3, stable_windows=2, stability_tolerance=0.9, flops=False)
QUICK = dataclasses.replace(MEASURE, memory_breakdown=False)
SGD = OptimConfig(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.0)
ADAMW = OptimConfig(name="adamw", lr=0.01, weight_decay=0.01)

CLASSIFIER = ModelConfig(name="blocknet", _target_="tests.your_training.block_net", checkpoint_modules=["Block"])
DICTS = DataConfig(name="dicts", _target_="tests.your_training.dict_data", num_classes=4)
TOKEN_MODEL = ModelConfig(name="tokennet", _target_="tests.your_training.token_net", checkpoint_modules=["Block"])
TOKENS = DataConfig(name="tokens", _target_="tests.your_training.token_data", num_classes=yours.VOCAB,
                    collate_fn="tests.your_training.pad_collate")


def _spec(point, model, data, steps=12, step_fn=None, measure=QUICK, optim=ADAMW, **train):
    return point_spec(point, model, data, lr=optim.lr, steps=steps, optim=optim, measure=measure, evaluate=False,
                      train=TrainConfig(seed=1, step_fn=step_fn, **train))


def _losses(result):
    return torch.tensor(result["train_loss"], dtype=torch.float64)


# --- batches --------------------------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "ids mask")


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor
    extra: dict


def test_a_batch_of_any_nesting_moves_whole_and_keeps_its_containers():
    batch = {"a": (torch.ones(3, 2), [torch.zeros(3)]), "b": Pair(torch.ones(3), torch.ones(3)),
             "c": Batch(torch.ones(3, 4), {"d": torch.ones(3)}), "text": ["x", "y", "z"], "n": 7}
    moved = batches.to_device(batch, torch.device("meta"))
    assert all(t.is_meta for t in batches.tensors(moved)) and len(list(batches.tensors(moved))) == 6
    assert isinstance(moved["a"], tuple) and isinstance(moved["a"][1], list)
    assert isinstance(moved["b"], Pair) and isinstance(moved["c"], Batch) and moved["c"].extra["d"].is_meta
    assert moved["text"] == ["x", "y", "z"] and moved["n"] == 7
    copied = batches.to_device(batch, torch.device("cpu"), copy=True)
    assert copied["a"][0] is not batch["a"][0] and torch.equal(copied["a"][0], batch["a"][0])
    assert batches.element_count(batch) == 6 + 3 + 6 + 12 + 3


def test_the_samples_of_a_batch_are_read_from_its_labels_its_input_ids_or_its_first_tensor():
    assert batches.sample_count({"input_ids": torch.ones(4, 9), "labels": torch.ones(5)}) == 5
    assert batches.sample_count({"mask": torch.ones(2, 9), "input_ids": torch.ones(4, 9)}) == 4
    assert batches.sample_count((torch.ones(6, 3), torch.ones(6))) == 6
    assert batches.sample_count({"scale": torch.tensor(2.0)}) is None
    assert batches.sample_count({"scale": torch.tensor(2.0)}, lambda b: 11) == 11


# --- your step, your batches ----------------------------------------------------------------------------------


def test_a_dict_batch_trains_through_your_step_and_its_figures_are_recorded():
    result = train_point(_spec(GridPoint(16, 2, 1), CLASSIFIER, DICTS, 16, "tests.your_training.classify_step"),
                         WorkerContext())
    assert result.status == "ok", result.error
    losses = _losses(result)
    assert losses[-4:].mean() < losses[:4].mean()  # it learns
    accuracy = result.recipe.step_metrics["accuracy"]
    assert 0.25 < accuracy <= 1.0
    assert result.metrics()["step_metric_accuracy"] == accuracy
    assert "items_per_second" not in result  # a mean over samples counts no items


def test_a_token_loss_over_padded_batches_counts_the_items_of_every_step():
    """Every step's items are the labels that are not padding among its samples: counted here from the samples
    the stream gives (rank 0 of one worker takes them all)."""
    point, steps = GridPoint(8, 2, 1), 12
    result = train_point(_spec(point, TOKEN_MODEL, TOKENS, steps, "tests.your_training.token_step_sum"),
                         WorkerContext())
    assert result.status == "ok", result.error
    samples, _ = yours.token_data()
    order = list(GlobalBatchSampler(len(samples), point, 0, steps, 1))
    assert result["items_seen"] == sum(len(samples[i]["input_ids"]) for i in order)
    tokens_per_sample = result["items_seen"] / result["samples_seen"]
    assert 2 < tokens_per_sample < 12
    assert result["items_per_second"] == pytest.approx(result["samples_per_second"] * tokens_per_sample, rel=0.2)


@pytest.mark.parametrize("step_fn", ["tests.your_training.token_step_sum", None], ids=["your step", "its own loss"])
def test_padded_token_losses_of_one_global_batch_agree_across_layouts(step_fn):
    """Micro-batches of 4, 8 and 16 sequences hold different numbers of tokens: each loss normalized by the
    global batch's tokens, every layout trains the same model, by your step's sum or by the model's own mean."""
    torch.set_num_threads(1)
    runs = [train_point(_spec(p, TOKEN_MODEL, TOKENS, 10, step_fn), WorkerContext())
            for p in (GridPoint(16, 1, 1), GridPoint(8, 2, 1), GridPoint(4, 4, 1))]
    assert all(r.status == "ok" for r in runs), [r.error for r in runs]
    for other in runs[1:]:
        torch.testing.assert_close(_losses(other), _losses(runs[0]), rtol=1e-5, atol=1e-6)


def test_without_the_normalization_those_layouts_would_not_agree():
    """The naive step (each micro-batch's mean over its own tokens): the test above could fail."""
    torch.set_num_threads(1)
    naive = "tests.your_training.token_step_mean"
    one = train_point(_spec(GridPoint(16, 1, 1), TOKEN_MODEL, TOKENS, 10, naive), WorkerContext())
    four = train_point(_spec(GridPoint(4, 4, 1), TOKEN_MODEL, TOKENS, 10, naive), WorkerContext())
    assert (_losses(one) - _losses(four)).abs().max() > 1e-4


def test_both_ways_of_counting_items_give_one_curve():
    mine = train_point(_spec(GridPoint(8, 2, 1), TOKEN_MODEL, TOKENS, 8, "tests.your_training.token_step_sum"),
                       WorkerContext())
    own = train_point(_spec(GridPoint(8, 2, 1), TOKEN_MODEL, TOKENS, 8), WorkerContext())
    torch.testing.assert_close(_losses(mine), _losses(own), rtol=1e-5, atol=1e-6)


def test_a_dict_input_and_label_pair_trains_through_the_built_in_step():
    """(dict, label) samples: the default collate makes (dict of tensors, labels), moved whole; the built-in
    step calls model(**inputs)."""
    data = DataConfig(name="pairs", _target_="tests.your_training.pair_data", num_classes=4)
    assert datasets.check(data) == []
    result = train_point(_spec(GridPoint(16, 1, 1), CLASSIFIER, data, 8), WorkerContext())
    assert result.status == "ok", result.error


# --- clipping, worked out by hand ----------------------------------------------------------------------------

SCALAR = ModelConfig(name="scalar", _target_="tests.your_training.scalar_net")
THREES = DataConfig(name="threes", _target_="tests.your_training.threes")


@pytest.mark.parametrize("clip, moved_per_step", [(1.0, 0.1), (None, 0.3)], ids=["clipped at 1", "not clipped"])
def test_clipping_scales_the_whole_gradient_to_the_norm(clip, moved_per_step):
    """loss = w x mean(x) with every x = 3: the gradient is 3 at every step. SGD at LR 0.1 moves w by 0.1 x 3,
    or by 0.1 x 1 once the gradient is clipped to norm 1; the loss at step k is 3 (1 - k x that)."""
    spec = _spec(GridPoint(4, 2, 1), SCALAR, THREES, 8, "tests.your_training.scalar_step", optim=SGD,
                 grad_clip_norm=clip)
    result = train_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    expected = [3 * (1 - k * moved_per_step) for k in range(8)]
    assert result["train_loss"] == pytest.approx(expected, abs=1e-5)
    assert result["grad_norm"] == pytest.approx([3.0] * 8)  # recorded before clipping
    if clip:
        assert (result["grad_clipped_steps"], result["grad_clipped_fraction"]) == (8, 1.0)
    else:
        assert "grad_clipped_steps" not in result


# --- the recipe's parameter groups ------------------------------------------------------------------------------


def test_weight_decay_spares_biases_and_normalization_weights_by_name_or_module():
    model = yours.BlockNet()
    recipe.apply_checkpointing(model, "blocks", ["Block"])  # names read as the bare model's
    groups = recipe.parameter_groups(model, ["bias", "norm"])
    names = {id(p): n for n, p in recipe.named_parameters(model)}
    assert [names[id(p)] for p in groups[0]["params"]] == ["inp.weight", "blocks.0.linear.weight",
                                                           "blocks.1.linear.weight", "head.weight"]
    assert sorted(names[id(p)] for p in groups[1]["params"]) == [
        "blocks.0.linear.bias", "blocks.1.linear.bias", "head.bias", "inp.bias", "norm.bias", "norm.weight"]
    assert groups[1]["weight_decay"] == 0.0
    batchnorm = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, bias=False), torch.nn.BatchNorm2d(2))
    spared = recipe.parameter_groups(batchnorm, ["norm"])[1]["params"]  # "1.weight": by its module's class
    assert [p.shape for p in spared] == [torch.Size([2]), torch.Size([2])]


def test_the_built_in_optimizers_take_the_groups_and_one_group_without_decay():
    model = yours.BlockNet()
    adamw = recipe.build_optimizer(ADAMW, model, 0.01)
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.01, 0.0]
    assert len(recipe.build_optimizer(SGD, model, 0.1).param_groups) == 1  # weight decay 0: nothing to spare
    everything = dataclasses.replace(ADAMW, no_decay=[])
    assert len(recipe.build_optimizer(everything, model, 0.01).param_groups) == 1


def test_a_factory_of_your_own_may_take_the_named_parameters():
    model = yours.BlockNet()
    recipe.apply_checkpointing(model, "blocks", ["Block"])
    custom = OptimConfig(name="custom", _target_="tests.your_training.named_sgd", lr=0.1, kwargs={"momentum": 0.5})
    optimizer = recipe.build_optimizer(custom, model, 0.1)
    assert "blocks.0.linear.weight" in yours.named_sgd.names  # not blocks.0.block.linear.weight
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["momentum"] == 0.5


# --- your data factory's check --------------------------------------------------------------------------------


def _check(**fields):
    return datasets.check(DataConfig(name="mine", **fields))


def test_dict_samples_are_accepted_and_a_batch_the_default_collate_cannot_make_is_one_line():
    assert _check(_target_="tests.your_training.dict_data") == []
    assert _check(_target_="tests.your_training.token_data", collate_fn="tests.your_training.pad_collate") == []
    (problem,) = _check(_target_="tests.your_training.token_data")
    assert problem.startswith("data._target_='tests.your_training.token_data': torch's default collate cannot "
                              "batch 2 train samples (RuntimeError")
    assert problem.endswith("or batch them with data.collate_fn (e.g. dynamic padding)")


def test_a_collate_that_fails_or_makes_uncountable_batches_is_one_line():
    (problem,) = _check(_target_="tests.your_training.token_data", collate_fn="tests.your_training.scalar_step")
    assert problem.startswith("data.collate_fn='tests.your_training.scalar_step' raised TypeError")
    (problem,) = _check(_target_="tests.your_training.token_data", collate_fn="tests.unit.test_your_step.scalars")
    assert "cannot be read from it" in problem and problem.endswith("set data.samples_fn")
    assert _check(_target_="tests.your_training.token_data", collate_fn="tests.unit.test_your_step.scalars",
                  samples_fn="tests.unit.test_your_step.two") == []


def scalars(samples):
    return {"scale": torch.tensor(float(len(samples)))}


def two(batch):
    return 2


# --- the largest batch in the tracked step ----------------------------------------------------------------------


def test_the_tracked_step_runs_the_streams_largest_batch_and_trains_as_without_it(monkeypatch):
    """Padded batches differ in size: the memory-tracked step (step 1) first runs the largest micro-batch the
    stream holds (the one with the 40-token sequence), then drops what it changed."""
    probed = []
    real = largest.probe
    monkeypatch.setattr(largest, "probe", lambda run, batch: (probed.append(batch), real(run, batch)))
    data = dataclasses.replace(TOKENS, _target_="tests.your_training.one_long_token_data")
    point, steps = GridPoint(4, 2, 1), 10  # 80 samples: the whole set, once
    order = list(GlobalBatchSampler(80, point, 0, steps, 1))
    assert 0 not in order[8:16]  # the tracked step's own micro-batches do not hold it
    tracked = train_point(_spec(point, TOKEN_MODEL, data, steps, measure=MEASURE), WorkerContext())
    plain = train_point(_spec(point, TOKEN_MODEL, data, steps), WorkerContext())
    assert tracked.status == plain.status == "ok", (tracked.error, plain.error)
    (batch,) = probed
    assert batch["input_ids"].shape == (4, 40)
    assert tracked["train_loss"] == plain["train_loss"]  # the probe left the training as it was
    # Without it, the tracked peak (and a CPU budget held to it) would be a shorter batch's.
    monkeypatch.setattr(largest, "stream_largest", lambda run, loaded, stream: None)
    first_come = train_point(_spec(point, TOKEN_MODEL, data, steps, measure=MEASURE), WorkerContext())
    assert tracked["memory_tracked_peak_bytes"] > first_come["memory_tracked_peak_bytes"] > 0


# --- a precision the device only emulates --------------------------------------------------------------------


def test_bf16_on_a_cpu_without_bf16_arithmetic_is_named_emulated():
    cpu = torch.device("cpu")
    assert "AVX512-BF16 or AMX" in recipe.emulated_precision("bf16", cpu, ["avx2", "avx512f"])
    assert recipe.emulated_precision("bf16", cpu, ["avx512f", "avx512_bf16"]) is None
    assert recipe.emulated_precision("bf16", cpu, ["amx_bf16"]) is None
    assert recipe.emulated_precision("fp32", cpu, []) is None
    assert "AVX512-FP16" in recipe.emulated_precision("fp16", cpu, ["avx512f"])


def test_an_emulated_points_throughput_is_labelled(monkeypatch):
    monkeypatch.setattr(recipe, "cpu_flags", lambda: {"avx2"})
    result = train_point(_spec(GridPoint(16, 1, 1, precision="bf16"), CLASSIFIER, DICTS, 8,
                               "tests.your_training.classify_step"), WorkerContext())
    assert result.status == "ok", result.error
    assert "is emulated" in result.tags()["sweeper.throughput_emulated"]


# --- a Hugging Face sequence classifier ---------------------------------------------------------------------------

BERT = ModelConfig(name="bert", _target_="tests.your_training.tiny_bert")
SENTENCES = DataConfig(name="sentences", _target_="tests.your_training.sentence_data", num_classes=2,
                       collate_fn="tests.your_training.sentence_collate")


def test_a_hugging_face_sequence_classifier_trains_on_dynamically_padded_dict_batches():
    """BertForSequenceClassification from a tiny BertConfig: its own loss from `labels` (model(**batch).loss),
    dynamic padding by the collate, cosine after a warm-up, clipping at 1, AdamW sparing biases and LayerNorms,
    the memory-tracked step on the stream's largest batch."""
    torch.set_num_threads(1)
    assert datasets.check(SENTENCES) == []
    spec = _spec(GridPoint(8, 2, 1), BERT, SENTENCES, 24, optim=dataclasses.replace(ADAMW, lr=0.003),
                 measure=MEASURE, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1, grad_clip_norm=1.0)
    spec = dataclasses.replace(spec, gns=GnsConfig(enabled=True))
    result = train_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    losses = _losses(result)
    assert losses[-6:].mean() < losses[:6].mean() - 0.05
    assert result["grad_clipped_steps"] >= 0 and len(result["grad_norm"]) == 24
    assert result["memory_tracked_peak_bytes"] > 0 and result["samples_per_second"] > 0
    assert "items_per_second" not in result  # one label per sentence: a mean over samples


def test_the_report_never_reads_an_emulated_throughput_as_the_recipes():
    from sweeper.report import reasons
    from sweeper.report.trials import Trial, summarize

    why = "bf16 autocast on a CPU without AVX512-BF16 or AMX is emulated through fp32 (up to 48x slower)"
    fast = Trial("mb16-acc1-w1", 16, 1, 1, 16, "ok", samples_per_second=900.0, precision="fp32")
    slow = Trial("mb16-acc1-w1-bf16", 16, 1, 1, 16, "ok", samples_per_second=20.0, precision="bf16",
                 throughput_emulated=why)
    ranked = [summarize([fast]), summarize([slow])]
    text = reasons.winner(ranked[0], ranked, "throughput", None, {}, 0.95)
    assert "(next: mb16-acc1-w1-bf16, 20.0 samples/s (emulated precision: not the recipe's))" in text
    alone = reasons.winner(ranked[1], ranked[1:], "throughput", None, {}, 0.95)
    assert f"Its throughput is not the recipe's: {why}" in alone


def test_a_batch_is_scored_for_evaluation_as_the_step_sees_it():
    """worker.losses.scored, for the evaluation: a causal LM's logits against its labels shifted by one, a
    per-token model's against its own, an (inputs, targets) pair's against its targets."""
    from sweeper.worker import losses

    batch = yours.pad_collate(yours.token_samples(3))
    net = yours.TokenNet()
    logits, targets = losses.scored(net, batch, shifts=False)
    assert logits.shape[:2] == targets.shape == batch["labels"].shape
    logits, targets = losses.scored(net, batch, shifts=True)
    assert torch.equal(targets, batch["labels"][:, 1:]) and logits.shape[1] == targets.shape[1]
    x, y = torch.randn(5, yours.FEATURES), torch.arange(5) % 4
    logits, targets = losses.scored(yours.BlockNet(), ({"x": x}, y), shifts=False)
    assert logits.shape == (5, 4) and targets is y


def test_an_emulated_precision_is_one_warning_before_launch(monkeypatch):
    from sweeper.driver import console, preflight
    from tests.harness import typed_cfg

    said = []
    monkeypatch.setattr(console, "warn", said.append)
    monkeypatch.setattr(recipe, "cpu_flags", lambda: {"avx2", "avx512f"})
    preflight.warn_emulated(typed_cfg("model=mlp", "data=digits", "sweep.precisions=[fp32,bf16]",
                                      "cluster.use_gpu=false"))
    assert said == ["sweep.precisions has bf16: bf16 autocast on a CPU without AVX512-BF16 or AMX is emulated "
                    "through fp32 (up to 48x slower): its throughput is not bf16's; its points are labelled emulated "
                    "(tag sweeper.throughput_emulated) and never ranked as the recipe's throughput"]
    said.clear()
    monkeypatch.setattr(recipe, "cpu_flags", lambda: {"avx512_bf16"})
    preflight.warn_emulated(typed_cfg("model=mlp", "data=digits", "sweep.precisions=[bf16]", "cluster.use_gpu=false"))
    assert said == []


def test_a_micro_batch_of_padding_alone_adds_nothing_and_no_nan():
    from sweeper.worker import losses

    batch = yours.pad_collate(yours.token_samples(2))
    batch["labels"][:] = yours.PAD_LABEL
    net = yours.TokenNet()
    micro = losses.build(None, None, net)(net, batch)
    assert micro.items.item() == 0 and micro.loss.item() == 0.0
    micro.loss.backward()
    assert all(torch.isfinite(p.grad).all() and not p.grad.any() for p in net.parameters() if p.grad is not None)


def drop_one(samples):
    return yours.pad_collate(samples[1:])


def test_a_collate_that_does_not_keep_every_sample_stops_the_point_naming_the_key():
    data = dataclasses.replace(TOKENS, collate_fn="tests.unit.test_your_step.drop_one")
    with pytest.raises(ValueError, match="a micro-batch holds 7 samples, not the point's micro-batch of 8: "
                                         "data.collate_fn must batch each sample it is given"):
        train_point(_spec(GridPoint(8, 1, 1), TOKEN_MODEL, data, 6), WorkerContext())
    (problem,) = _check(_target_="tests.your_training.token_data", collate_fn="tests.unit.test_your_step.drop_one")
    assert problem.startswith("a batch of 2 train samples holds 1 by its leading dimension")
