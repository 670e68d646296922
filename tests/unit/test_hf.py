"""model=hf: a Hugging Face transformers causal LM built from its config (random weights, no download)
through sweeper's worker, FLOP counter and checkpointing, and its bad inputs refused before Ray. The
extra is part of `.[test]`, so these run in CI."""

from functools import partial

import pytest
import torch

pytest.importorskip("transformers")

from sweeper import recipe
from sweeper.config import DataConfig, MeasureConfig, ModelConfig  # noqa: E402
from sweeper.measure import flops  # noqa: E402
from sweeper.plan import GridPoint  # noqa: E402
from sweeper.worker.spec import WorkerContext  # noqa: E402
from sweeper.worker.train import train_point  # noqa: E402
from sweeper.workloads import models  # noqa: E402
from tests.helpers import point_spec  # noqa: E402

GPT2 = ModelConfig(name="hf", hf_type="gpt2", context=16, input_shape=[16],
                   kwargs={"n_layer": 2, "n_head": 2, "n_embd": 32, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                           "attn_pdrop": 0.0})
LLAMA = ModelConfig(name="hf", hf_type="llama", context=16, input_shape=[16],
                    kwargs={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "num_key_value_heads": 2})
TEXT = DataConfig(name="text", val_fraction=0.1, num_classes=256)


_spec = partial(point_spec, model=GPT2, data=TEXT, seed=1, lr=3e-3, steps=10,
                measure=MeasureConfig(warmup_steps=2, windows=3, flops=False))


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_a_transformers_model_is_built_from_its_config_with_the_datas_vocabulary(cfg):
    torch.manual_seed(0)
    model = models.build(cfg, 256)
    logits = model(torch.randint(0, 256, (2, 16)))
    assert logits.shape == (2, 16, 256)
    torch.manual_seed(0)
    assert torch.equal(models.build(cfg, 256)(torch.zeros(1, 16, dtype=torch.long)),
                       model(torch.zeros(1, 16, dtype=torch.long)))  # seeded: the same weights
    blocks = recipe.wrappable(model)
    assert blocks == [{"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer"}[cfg.hf_type]]
    assert recipe.apply_checkpointing(models.build(cfg, 256), "blocks") == 2
    assert models.batch_coupled_layers(model) == []


def test_flops_per_token_of_gpt2_are_the_closed_form():
    # N = 12 L d^2 + V d (the tied head); attention 12 L d T: the same count as sweeper's own GPT.
    count = flops.count_flops(lambda: models.build(GPT2, 256), models.samples(GPT2, 256))
    layers, d, context = 2, 32, 16
    closed = 6 * (12 * layers * d * d + 256 * d) + 12 * layers * d * context
    assert count.train_per_sample == context * closed  # exact: the same matmuls counted


def test_layouts_of_one_global_batch_train_a_transformers_model_alike():
    torch.set_num_threads(1)
    a = train_point(_spec(GridPoint(8, 1, 1)), WorkerContext())
    b = train_point(_spec(GridPoint(4, 2, 1)), WorkerContext())
    assert a["status"] == "ok" and a["train_loss"][-1] < a["train_loss"][0]
    torch.testing.assert_close(torch.tensor(a["train_loss"]), torch.tensor(b["train_loss"]), rtol=1e-5, atol=1e-5)
    assert a["tokens_per_second"] > 0 and a["val_bits_per_byte"] > 0


@pytest.mark.parametrize("overrides, says", [
    (["model.hf_type=gpt"], "model.hf_type='gpt' is not a transformers model type: did you mean gptj?"),
    (["+model.kwargs.n_layers=3"], "model.kwargs has n_layers (did you mean n_layer?), not a field of GPT2Config"),
    (["+model.kwargs.n_positions=8"], "model.kwargs.n_positions=8 is below model.context=64"),
    (["model.hf_type=vit", "model.kwargs={}"], "model.hf_type='vit' has no causal language model"),
    (["data=digits"], "model=hf trains on token sequences"),
])
def test_bad_transformers_input_is_one_line_naming_the_key(overrides, says):
    from tests.helpers import problems as _problems

    problems = _problems("model=hf", "data=text", *overrides)
    assert any(says in p for p in problems), problems
