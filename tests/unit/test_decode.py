"""Decode with a KV cache (issue 31): the cache reproduces decoding without it, its memory measured
from its tensors is the formula's, the decode step's activations apart, the decode step's FLOPs the
closed form's, the decode roofline, and the bad inputs refused before Ray."""

import pytest
import torch

from sweeper.config import ModelConfig
from sweeper.inference import decode, latency, roofline
from sweeper.inference.latency import InferenceSpec, run_inference_points
from sweeper.workloads import gpt
from tests.helpers import forwards_take


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


def test_the_kv_cache_is_measured_from_its_tensors_and_the_steps_activations_apart_at_two_contexts():
    """The default demo model (4 layers, d_model 128): at each batch the cache's tensors hold exactly
    2 x layers x d_model x context x 4 bytes per sequence, and the point's peak memory is the weights,
    that cache and the decode step's own activation peak (named apart, small, growing with the batch)."""
    model = ModelConfig(name="gpt", n_layer=4, n_head=4, d_model=128, context=256, input_shape=[256])
    for context in (64, 256):
        specs = [InferenceSpec(model=model, num_classes=256, batch_size=b, warmup_runs=1, timed_runs=3,
                               min_timed_seconds=0, context=context) for b in (1, 8)]
        rows = []
        run_inference_points(specs, rows.append)
        assert [r.status for r in rows] == ["ok", "ok"]
        for row in rows:
            d = row.decode
            assert d.kv_cache_bytes == row.batch_size * 2 * 4 * 128 * context * 4  # exact, from the tensors
            assert d.kv_cache_bytes_per_sequence == d.kv_cache_formula_bytes_per_sequence
            assert row.memory.peak_memory_bytes == d.weight_bytes + d.kv_cache_bytes + d.decode_activation_peak_bytes
            assert 0 < d.decode_activation_peak_bytes < 0.05 * d.kv_cache_bytes
        assert rows[1].decode.decode_activation_peak_bytes > rows[0].decode.decode_activation_peak_bytes
        assert rows[1].decode.decode_flops_per_token == gpt.decode_flops_per_token(256, context, 4, 128)
        assert rows[1].decode.prefill_peak_memory_bytes > rows[1].memory.peak_memory_bytes  # a whole prompt at once


def test_a_decode_step_of_known_duration_gives_tokens_per_second_for_the_whole_batch(monkeypatch):
    # Every forward of the model takes 1/128 s on the clocks the timing reads (tests.helpers.forwards_take).
    forwards_take(monkeypatch, 2 ** -7, latency, decode)
    model = ModelConfig(name="gpt", n_layer=1, n_head=2, d_model=32, context=16, input_shape=[16])
    rows = []
    run_inference_points([InferenceSpec(model=model, num_classes=256, batch_size=8, warmup_runs=1, timed_runs=3,
                                        min_timed_seconds=0, context=16)], rows.append)
    [row] = rows
    # A decode step is one forward: 1/128 s for one new token in each of 8 sequences, 8 x 128 = 1024
    # tokens/s, 128 a sequence; the prefill, one forward of 15-token prompts: 8 x 15 x 128 = 15360.
    assert row.latency.latency_p50_seconds == 2 ** -7
    assert (row.decode.tokens_per_second, row.decode.tokens_per_second_per_sequence) == (1024.0, 128.0)
    assert row.decode.prefill_p50_seconds == 2 ** -7 and row.decode.prefill_tokens_per_second == 15360.0


def test_a_cache_allocated_past_its_formula_is_measured_so(monkeypatch):
    """Issue 46, findings 7-8: the cache's bytes were compared with the formula it is sized by, so a
    cache twice too long would have passed. Measured from its tensors, it reads twice the formula."""
    allocate = gpt.GPT.new_cache
    monkeypatch.setattr(gpt.GPT, "new_cache", lambda self, batch, length=None: allocate(
        self, batch, 2 * (length or self.context)))
    model = ModelConfig(name="gpt", n_layer=2, n_head=2, d_model=32, context=128, input_shape=[128])
    rows = []
    run_inference_points([InferenceSpec(model=model, num_classes=256, batch_size=2, warmup_runs=1, timed_runs=2,
                                        min_timed_seconds=0, context=32)], rows.append)
    [row] = rows
    assert row.status == "ok", row.error
    assert row.decode.kv_cache_bytes_per_sequence == 2 * row.decode.kv_cache_formula_bytes_per_sequence


def test_the_decode_record_names_the_cache_and_the_steps_activations_apart(capsys):
    """Issue 46, finding 7: the parent run's kv_cache_measured_bytes_per_sequence was the slope of the
    peak memory (the cache plus a step's activations); now the cache's tensors' slope on the batch, the
    activations' slope beside it under its own name, the peak's apart."""
    from sweeper.driver import decode_answer
    from sweeper.schema import InferenceResult
    from tests.harness import compose_cfg
    from sweeper import config

    cfg = config.load(compose_cfg("+experiment=gpt_decode"))
    spec = InferenceSpec(model=cfg.model, num_classes=256, batch_size=1, context=64)
    rows = []
    for batch, activations in ((1, 6136), (8, 49088)):
        r = InferenceResult.from_flat({"batch_size": batch, "status": "ok", "samples_per_second": 100.0 * batch,
                                       "kv_cache_bytes": batch * 262144, "kv_cache_formula_bytes_per_sequence": 262144,
                                       "decode_activation_peak_bytes": activations,
                                       "peak_memory_bytes": 3435520 + batch * 262144 + activations})
        rows.append(("gpt-ctx64", r))

    class Tracker:
        logged = {}

        def log_parent_metrics(self, metrics):
            self.logged.update(metrics)

    tracker = Tracker()
    decode_answer.record(cfg, tracker, [spec], rows, {})
    m = tracker.logged
    assert m["kv_cache_measured_bytes_per_sequence_gpt-ctx64"] == pytest.approx(262144, rel=1e-9)
    assert m["decode_activation_peak_bytes_per_sequence_gpt-ctx64"] == pytest.approx((49088 - 6136) / 7, rel=1e-9)
    assert m["peak_memory_bytes_per_sequence_gpt-ctx64"] == pytest.approx(262144 + (49088 - 6136) / 7, rel=1e-9)
    assert "KV cache's tensors hold 256.0 KiB per sequence" in " ".join(capsys.readouterr().out.split())


def test_the_decode_roofline_turns_memory_bound_at_every_batch_once_the_cache_outweighs_the_flops():
    # Weights read once per step; each sequence reads its own cache: intensity tends to f / kv.
    weights = 4 * (gpt.matmul_parameters(256, 4, 128))
    short = roofline.predict_knee(gpt.decode_flops_per_token(256, 64, 4, 128), weights,
                                  gpt.kv_cache_bytes_per_sequence(4, 128, 64), 100e9, 20e9)
    long = roofline.predict_knee(gpt.decode_flops_per_token(256, 4096, 4, 128), weights,
                                 gpt.kv_cache_bytes_per_sequence(4, 128, 4096), 100e9, 20e9)
    assert short.knee_batch_size is not None and 1 < short.knee_batch_size < 100
    assert long.knee_batch_size is None  # 1 FLOP per 2 bytes of cache: memory-bound at any batch


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
