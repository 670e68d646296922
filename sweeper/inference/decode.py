"""A decoder's inference at one batch of concurrent sequences and one context: prefill and decode timed
apart, the KV cache's bytes measured from its tensors (beside its formula and the decode step's own
activation peak), the decode step's FLOPs counted. Seed 003's "What
about transformers?": with a KV cache a decode step reads the weights once for the whole batch plus
each sequence's cache, so batching is nearly free until the knee the decode roofline predicts.

One point: `batch` sequences whose prompts fill `context - 1` positions (prefill, timed per prompt),
then decode steps at the last position (each a one-token forward over `context` cached positions,
the cache reset to the prompt after every step so each timed step does the same work). Knows torch
and sweeper's GPT only."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from sweeper.measure import flops, telemetry
from sweeper.workloads import gpt

# The prefill is timed this many times (a prompt is long: a few runs give its median).
PREFILL_RUNS = 5


def prompt(batch: int, context: int, vocab_size: int, seed: int) -> torch.Tensor:
    """`batch` random prompts of `context - 1` tokens: the cache holds `context` positions after the
    first decoded token."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, context - 1), generator=generator)


def measure(model: gpt.GPT, batch: int, context: int, seed: int, device: telemetry.Device,
            timed: Callable[[Callable[[], Any]], Tuple[List[float], float]],
            track: Callable[[Callable[[], Any], bool], Any]) -> Dict[str, Any]:
    """Prefill and decode of `batch` sequences at `context` under inference_mode: `timed(fn)` times
    runs of fn (the point's rule: at least inference.timed_runs, inference.min_timed_seconds), `track(fn,
    enforce)` measures fn's peak memory (under the memory budget when `enforce`). Decoding's memory is a
    fresh cache holding `context - 1` positions and one decode step: the point's peak, what each
    concurrent sequence holds while it generates. The prefill's transient peak (a whole prompt's
    activations at once) is measured apart, outside the budget (a server can prefill in chunks).
    Returns the figures, the decode step's latency samples under "latency_samples_seconds"."""
    ids = prompt(batch, context, model.wte.num_embeddings, seed).to(device.torch_device)
    with torch.inference_mode():
        breakdown, cache_bytes, prefill_breakdown = _tracked_memory(model, ids, batch, context, track)
        cache, prefill = _timed_prefill(model, ids, batch, context, device)
        token = ids[:, -1:]

        def step() -> None:
            cache.position = context - 1  # the same step every time: the token at the last position
            model(token, cache)

        # sweeper's formulas count the CPU's fused attention kernel, which torch's table lacks.
        with FlopCounterMode(display=False, custom_mapping=flops.ATTENTION_FORMULAS) as counter:
            step()
        samples, seconds = timed(step)
    prefill_p50 = sorted(prefill)[len(prefill) // 2]
    layers, d_model = len(model.blocks), model.wte.embedding_dim
    bytes_per_value = model.wte.weight.element_size()
    counted = counter.get_total_flops() / batch
    return {
        "context": context,
        "prefill_tokens": context - 1,
        "prefill_p50_seconds": prefill_p50,
        "prefill_tokens_per_second": batch * (context - 1) / prefill_p50,
        "kv_cache_bytes": cache_bytes,
        "kv_cache_bytes_per_sequence": cache_bytes / batch,
        "kv_cache_formula_bytes_per_sequence": gpt.kv_cache_bytes_per_sequence(layers, d_model, context,
                                                                               bytes_per_value),
        "decode_flops_per_token": counted,
        "decode_flops_formula_per_token": gpt.decode_flops_per_token(model.wte.num_embeddings, context, layers,
                                                                     d_model),
        "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "latency_samples_seconds": samples,
        "timed_seconds": seconds,
        "breakdown": breakdown,
        **({} if prefill_breakdown is None else {"prefill_peak_memory_bytes": prefill_breakdown.peak_bytes}),
        **({} if breakdown is None else {"decode_activation_peak_bytes": activation_peak(
            breakdown.peak_bytes, tensor_bytes([*model.parameters(), *model.buffers()]), cache_bytes)}),
    }


def _tracked_memory(model: gpt.GPT, ids: torch.Tensor, batch: int, context: int,
                    track: Callable[[Callable[[], Any], bool], Any]) -> Tuple[Any, int, Any]:
    """The decode step's memory breakdown (under the budget), the bytes of the cache it held, and the
    prefill's breakdown (outside it). Called under inference_mode."""
    held: List[Any] = []

    def decoding() -> None:
        cache = model.new_cache(batch, context)
        cache.position = context - 1  # its contents do not change its memory
        model(ids[:, -1:], cache)
        held[:] = [cache]

    def prefilling() -> None:
        model(ids, model.new_cache(batch, context))
    breakdown = track(decoding, True)
    # The cache's bytes from the tensors the tracked step attended to, at this concurrency: each
    # distinct storage once, at its size (not the formula it was sized by).
    cache_bytes = tensor_bytes([*held[0].keys, *held[0].values])
    held.clear()
    return breakdown, cache_bytes, track(prefilling, False)


def _timed_prefill(model: gpt.GPT, ids: torch.Tensor, batch: int, context: int,
                   device: telemetry.Device) -> Tuple[Any, List[float]]:
    """A fresh cache filled by PREFILL_RUNS timed prefills after a warm-up, and their seconds. Called
    under inference_mode."""
    cache = model.new_cache(batch, context)
    prefill: List[float] = []
    for _ in range(PREFILL_RUNS + 1):  # the first is a warm-up
        cache.position = 0
        device.synchronize()
        begin = time.perf_counter()
        model(ids, cache)
        device.synchronize()
        prefill.append(time.perf_counter() - begin)
    return cache, prefill[1:]


def tensor_bytes(tensors: List[torch.Tensor]) -> int:
    """The bytes `tensors` hold: each distinct storage once, at its allocated size."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def activation_peak(peak_bytes: int, model_bytes: int, cache_bytes: int) -> int:
    """A decode step's own peak beyond the weights and the KV cache: its activations and temporaries
    (the point's peak is weights + cache + this), what one more step adds on top of the cache."""
    return peak_bytes - model_bytes - cache_bytes

