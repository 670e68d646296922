"""Cross-request batching of a decoder (continuous batching at the level of decode steps), from measured
step times: each request is a prompt plus a number of tokens to generate; per-request time to first
token, time per output token and total latency, and the tokens/s the replica sustains, for a largest
batch of concurrent sequences.

The loop, one decode step at a time: at each step boundary, waiting requests join (first come, first
served) while fewer than `max_batch` sequences are active; each joining request's prompt is prefilled
before the step (its first token comes out of its prefill); then one decode step produces a token for
every active sequence, taking `step.seconds(active)` (the measured decode step at that batch, from
task=inference on model=gpt: `LatencyCurve` of the decode points); a sequence that has all its tokens
leaves. What it does not model: the step time growing with each sequence's own length (the table is one
context's: pick the context the requests reach), chunked prefill or prefill batched with decode steps,
KV-cache memory beyond `max_batch` (set it to the largest decode batch under the budget), preemption,
paged attention, speculative decoding, and the network and tokenizer."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Sequence

import numpy as np

from sweeper.inference.batching_sim import LatencyCurve


@dataclass(frozen=True)
class Prefill:
    """Seconds to prefill a prompt: the measured prefill time of `measured_tokens` tokens (one sequence),
    scaled linearly to the prompt's length (attention's share grows faster: a long prompt's is an
    underestimate)."""

    measured_seconds: float
    measured_tokens: int

    def seconds(self, tokens: int) -> float:
        return self.measured_seconds * tokens / self.measured_tokens


@dataclass(frozen=True)
class DecodeSimResult:
    max_batch: int
    requests: int
    time_to_first_token_p50: float
    time_to_first_token_p99: float
    time_per_output_token_p50: float  # after the first: (finish - first token) / (tokens - 1)
    time_per_output_token_p99: float
    latency_p50: float  # arrival to the last token
    latency_p99: float
    tokens_per_second: float  # generated tokens over the span from the first arrival to the last token
    mean_batch: float  # active sequences per decode step


def simulate(arrivals: Sequence[float], prompt_tokens: Sequence[int], output_tokens: Sequence[int],
             step: LatencyCurve, prefill: Prefill, max_batch: int) -> DecodeSimResult:
    """Serve the requests (arrival seconds, sorted; their prompt and output lengths) on one replica."""
    n = len(arrivals)
    if n == 0 or not (len(prompt_tokens) == len(output_tokens) == n):
        raise ValueError(f"give one prompt and output length per request: {n} arrivals, {len(prompt_tokens)} "
                         f"prompts, {len(output_tokens)} outputs")
    if max_batch < 1:
        raise ValueError(f"max_batch={max_batch}: must be at least 1")
    if any(o < 1 for o in output_tokens) or any(p < 1 for p in prompt_tokens):
        raise ValueError("every request has a prompt of at least 1 token and at least 1 token to generate")
    if any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise ValueError("arrivals must be sorted")
    first_token = [math.nan] * n
    finish = [math.nan] * n
    left = list(output_tokens)
    waiting: Deque[int] = deque()
    active: List[int] = []
    clock, nxt, steps, batch_sum = 0.0, 0, 0, 0
    while nxt < n or waiting or active:
        while nxt < n and arrivals[nxt] <= clock:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not active:
            clock = arrivals[nxt]  # idle until the next request
            continue
        while waiting and len(active) < max_batch:  # join, and prefill: the first token
            r = waiting.popleft()
            clock += prefill.seconds(prompt_tokens[r])
            first_token[r] = clock
            left[r] -= 1
            if left[r] == 0:
                finish[r] = clock
            else:
                active.append(r)
        if not active:
            continue
        clock += step.seconds(len(active))
        steps, batch_sum = steps + 1, batch_sum + len(active)
        for r in active:
            left[r] -= 1
            if left[r] == 0:
                finish[r] = clock
        active = [r for r in active if left[r] > 0]
    arrive = np.asarray(arrivals, dtype=float)
    ttft = np.asarray(first_token) - arrive
    total = np.asarray(finish) - arrive
    many = [i for i in range(n) if output_tokens[i] > 1]
    tpot = np.asarray([(finish[i] - first_token[i]) / (output_tokens[i] - 1) for i in many]) if many else np.zeros(1)
    return DecodeSimResult(
        max_batch=max_batch, requests=n,
        time_to_first_token_p50=float(np.percentile(ttft, 50)), time_to_first_token_p99=float(np.percentile(ttft, 99)),
        time_per_output_token_p50=float(np.percentile(tpot, 50)),
        time_per_output_token_p99=float(np.percentile(tpot, 99)),
        latency_p50=float(np.percentile(total, 50)), latency_p99=float(np.percentile(total, 99)),
        tokens_per_second=float(sum(output_tokens) / (max(finish) - arrive[0])),
        mean_batch=batch_sum / steps if steps else 0.0,
    )
