"""sweeper's own decoder-only transformer (nanoGPT's shape): token and position embeddings, pre-norm
blocks of causal self-attention (torch's scaled_dot_product_attention) and a 4x MLP, a final
LayerNorm and an output head tied to the token embedding. Knows torch (and its config section) only.

LayerNorm works on each position alone, so nothing couples the sequences of a micro-batch: layouts
of one global batch train the same model (sweep.strategy=smart treats it as batch-free).
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sweeper.config import ModelConfig


class KVCache:
    """Every layer's keys and values of `batch` sequences of up to `length` positions, allocated once
    (batch x heads x length x head dim, two tensors per layer): what decoding reads at every step
    instead of recomputing the prefix. `position` is how many positions it holds."""

    def __init__(self, n_layer: int, batch: int, n_head: int, length: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None):
        shape = (batch, n_head, length, head_dim)
        self.keys: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.length = length
        self.position = 0

    @property
    def nbytes(self) -> int:
        """The bytes the cache's tensors hold (allocated: the whole length, whatever `position`)."""
        return sum(t.untyped_storage().nbytes() for t in (*self.keys, *self.values))


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None, layer: int = 0) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # The new positions' keys and values go into the cache; attention reads every cached one.
            start, end = cache.position, cache.position + t
            cache.keys[layer][:b, :, start:end] = k
            cache.values[layer][:b, :, start:end] = v
            keys, values = cache.keys[layer][:b, :, :end], cache.values[layer][:b, :, :end]
            if t == 1:  # decoding one token: it may see every cached position, so no mask
                y = F.scaled_dot_product_attention(q, keys, values)
            else:  # a prompt (prefill) after `start` cached positions: causal within it
                mask = torch.ones(t, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
                y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GPTBlock(nn.Module):
    """One pre-norm transformer block: the unit activation checkpointing (`blocks`) wraps."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids (batch x positions, positions <= context) to next-token logits (batch x positions x
    vocabulary)."""

    def __init__(self, vocab_size: int, context: int, n_layer: int, n_head: int, d_model: int):
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(GPTBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied (GPT-2)
        self.apply(_init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """Logits of every position of `idx`; with a `cache`, `idx` continues the sequences it holds
        (a prompt to prefill, or one token to decode) and the cache takes their keys and values."""
        t = idx.shape[1]
        start = 0 if cache is None else cache.position
        if start + t > self.context:
            raise ValueError(f"a sequence of {start + t} tokens is longer than the model's context of {self.context}")
        x = self.wte(idx) + self.wpe(torch.arange(start, start + t, device=idx.device))
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        if cache is not None:
            cache.position += t
        return self.head(self.ln_f(x))

    def new_cache(self, batch: int, length: Optional[int] = None) -> KVCache:
        """An empty cache for `batch` sequences of up to `length` positions (the context by default), in
        the model's dtype and device."""
        weight = self.wte.weight
        attn = self.blocks[0].attn
        d_model = weight.shape[1]
        return KVCache(len(self.blocks), batch, attn.n_head, length or self.context, d_model // attn.n_head,
                       weight.dtype, weight.device)


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def kv_cache_bytes_per_sequence(n_layer: int, d_model: int, context: int, bytes_per_value: int = 4,
                                kv_heads_fraction: float = 1.0) -> float:
    """The KV cache of one sequence: keys and values (2) of every layer, d_model values per position
    each (times the share of heads that keep their own keys and values: 1 without grouped-query
    attention), for `context` positions, `bytes_per_value` each (fp32 4, bf16 2)."""
    return 2 * n_layer * d_model * kv_heads_fraction * context * bytes_per_value


def decode_flops_per_token(vocab_size: int, context: int, n_layer: int, d_model: int) -> float:
    """Forward FLOPs of decoding one token at `context` cached positions: 2N for the weights, and
    attention's 4 L d T (scores against T keys and the weighted sum of T values, 2 FLOPs a multiply-add)."""
    return 2 * matmul_parameters(vocab_size, n_layer, d_model) + 4 * n_layer * d_model * context


def matmul_parameters(vocab_size: int, n_layer: int, d_model: int) -> int:
    """N of the closed form: the weights every token multiplies (12 d^2 per block: attention's 4 d^2,
    the MLP's 8 d^2; the tied head's vocabulary x d). Embedding lookups, biases and norms are not
    matmuls."""
    return 12 * n_layer * d_model * d_model + vocab_size * d_model


def train_flops_per_token(vocab_size: int, context: int, n_layer: int, d_model: int) -> float:
    """Training FLOPs per token in PaLM's closed form (Chowdhery et al. 2022, appendix B): 6N for the
    weights' forward and backward, plus attention's 12 L d T (scores and weighted values, forward and
    backward, counted over the whole T x T square as torch's FLOP counter counts a causal SDPA)."""
    return 6 * matmul_parameters(vocab_size, n_layer, d_model) + 12 * n_layer * d_model * context


def from_config(cfg: ModelConfig, num_classes: int) -> GPT:
    """model=gpt: its vocabulary is the data's (`num_classes`), its context model.context."""
    return GPT(num_classes, cfg.context, cfg.n_layer, cfg.n_head, cfg.d_model)


def check_config(cfg: ModelConfig, num_classes: int) -> List[str]:
    return []  # its fields' rules are config checks (config.model_sections.check_gpt, before Ray starts)
