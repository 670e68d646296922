"""Decode with a KV cache (issue 31): the cache reproduces decoding without it, its memory is the
formula's, the decode step's FLOPs the closed form's, the decode roofline, the continuous-batching
simulator, and the bad inputs refused before Ray."""

import math

import pytest
import torch

from sweeper.config import ModelConfig
from sweeper.inference import roofline
from sweeper.inference.batching_sim import LatencyCurve
from sweeper.inference.decode_sim import Prefill, simulate
from sweeper.inference.timing import InferenceSpec, run_inference_points
from sweeper.workloads import gpt


def test_decoding_with_the_cache_gives_the_logits_of_decoding_without_it():
    torch.manual_seed(0)
    model = gpt.GPT(256, 48, 2, 2, 32).eval()
    ids = torch.randint(0, 256, (3, 40))
    with torch.inference_mode():
        full = model(ids)
        cache = model.new_cache(3)
        chunks = [model(ids[:, :10], cache), model(ids[:, 10:25], cache)]  # a prompt, then a second chunk
        chunks += [model(ids[:, i:i + 1], cache) for i in range(25, 40)]  # then one token at a time
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.position == 40
    with pytest.raises(ValueError, match="longer than the model's context of 48"):
        model(ids[:, :9], cache)


def test_the_kv_cache_measured_from_peak_memory_is_the_formula_within_5_percent_at_two_contexts():
    """The default demo model (4 layers, d_model 128): the peak memory of a decode step grows per
    concurrent sequence by its KV cache, 2 x layers x d_model x context x 4 bytes, plus its step's own
    small activations."""
    model = ModelConfig(name="gpt", n_layer=4, n_head=4, d_model=128, context=256, input_shape=[256])
    for context in (64, 256):
        specs = [InferenceSpec(model=model, num_classes=256, batch_size=b, warmup_runs=1, timed_runs=3,
                               min_timed_seconds=0, context=context) for b in (1, 8)]
        rows = []
        run_inference_points(specs, rows.append)
        assert [r.status for r in rows] == ["ok", "ok"]
        slope = (rows[1].memory.peak_memory_bytes - rows[0].memory.peak_memory_bytes) / 7
        formula = gpt.kv_cache_bytes_per_sequence(4, 128, context)
        assert rows[0].decode.kv_cache_bytes_per_sequence == formula == 2 * 4 * 128 * context * 4
        assert slope == pytest.approx(formula, rel=0.05)
        assert rows[1].decode.decode_flops_per_token == gpt.decode_flops_per_token(256, context, 4, 128)
        assert rows[1].decode.tokens_per_second == pytest.approx(8 / rows[1].latency.latency_p50_seconds)
        assert rows[1].decode.prefill_peak_memory_bytes > rows[1].memory.peak_memory_bytes  # a whole prompt at once


def test_the_decode_roofline_turns_memory_bound_at_every_batch_once_the_cache_outweighs_the_flops():
    # Weights read once per step; each sequence reads its own cache: intensity tends to f / kv.
    weights = 4 * (gpt.matmul_parameters(256, 4, 128))
    short = roofline.predict_knee(gpt.decode_flops_per_token(256, 64, 4, 128), weights,
                                  gpt.kv_cache_bytes_per_sequence(4, 128, 64), 100e9, 20e9)
    long = roofline.predict_knee(gpt.decode_flops_per_token(256, 4096, 4, 128), weights,
                                 gpt.kv_cache_bytes_per_sequence(4, 128, 4096), 100e9, 20e9)
    assert short.knee_batch_size is not None and 1 < short.knee_batch_size < 100
    assert long.knee_batch_size is None  # 1 FLOP per 2 bytes of cache: memory-bound at any batch


def test_continuous_batching_of_decode_requests():
    step, prefill = LatencyCurve((1, 2), (1.0, 1.5)), Prefill(2.0, 10)
    one = simulate([0.0], [10], [5], step, prefill, max_batch=4)
    # Its first token comes out of the prefill (2 s), the other four from decode steps of 1 s.
    assert (one.time_to_first_token_p50, one.latency_p50, one.time_per_output_token_p50) == (2.0, 6.0, 1.0)
    two = simulate([0.0, 0.0], [10, 10], [3, 3], step, prefill, max_batch=2)
    # Both prefill (4 s), then two steps at batch 2 (1.5 s each): 7 s; the second's first token at 4 s.
    assert two.latency_p99 == pytest.approx(7.0) and two.mean_batch == 2.0
    alone = simulate([0.0, 0.0], [10, 10], [3, 3], step, prefill, max_batch=1)
    assert alone.latency_p50 == pytest.approx((4 + 8) / 2)  # one after the other: done at 4 s and 8 s
    assert two.tokens_per_second > alone.tokens_per_second
    with pytest.raises(ValueError, match="max_batch=0"):
        simulate([0.0], [1], [1], step, prefill, max_batch=0)
    assert math.isclose(Prefill(0.5, 100).seconds(50), 0.25)


@pytest.mark.parametrize("overrides, says", [
    (["inference.contexts=[64,512]"], "inference.contexts has 512, above model.context=256"),
    (["model=hf", "+model.kwargs.n_positions=256"], "task=inference with model=hf: decode with a KV cache is "
                                                    "measured for sweeper's GPT"),
    (["inference.contexts=[1]"], "inference.contexts contains 1"),
])
def test_bad_decode_input_is_one_line_naming_the_key(overrides, says):
    from tests.helpers import problems as _problems

    problems = _problems("+experiment=gpt_decode", *overrides)
    assert any(says in p for p in problems), problems


def test_a_decode_points_key_names_its_context():
    model = ModelConfig(name="gpt", context=64, input_shape=[64])
    assert InferenceSpec(model=model, num_classes=256, batch_size=8, context=64).key == "bs8-ctx64"
