"""A team's own pieces, as a sweep names them by import path (model._target_, data._target_, data.collate_fn,
train.step_fn): dict samples of varying length, a collate that pads each batch to its longest, steps of its own,
models without BatchNorm that sweeper can shard (their blocks named in model.checkpoint_modules), and a tiny
Hugging Face sequence classifier. Small enough to train in a unit test on the CPU; nothing is downloaded.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, VOCAB = 8, 16
PAD_LABEL = -100  # Hugging Face's ignore_index


# ---------------------------------------------------------------------------------------------------------------
# A classifier of dict samples {"x": features, "y": class}


def dict_samples(count: int = 512, num_classes: int = 4, seed: int = 0) -> List[Dict[str, Any]]:
    """Features whose class is the argmax of their first `num_classes` values, plus noise: learnable in a few
    steps."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, FEATURES, generator=generator)
    y = x[:, :num_classes].argmax(dim=1)
    return [{"x": x[i], "y": int(y[i])} for i in range(count)]


def dict_data(num_classes: int = 4):
    """data._target_: (train, val) of dict samples."""
    return dict_samples(512, num_classes, 0), dict_samples(128, num_classes, 1)


def pair_data(num_classes: int = 4):
    """data._target_: (dict inputs, label) pairs, as many datasets of transformers users are."""
    return [({"x": s["x"]}, s["y"]) for s in dict_samples(512, num_classes, 0)], None


class Block(nn.Module):
    """What ZeRO shards one at a time (model.checkpoint_modules=[Block])."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.linear(x))


class BlockNet(nn.Module):
    """A BatchNorm-free classifier: layouts of one global batch train it alike."""

    def __init__(self, num_classes: int = 4, width: int = 32):
        super().__init__()
        self.inp = nn.Linear(FEATURES, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (dict inputs, label) samples: called as model(x=...)
        return self.head(self.norm(self.blocks(self.inp(x))))


def block_net(num_classes: int = 4) -> nn.Module:
    return BlockNet(num_classes)


def classify_step(model: nn.Module, batch: Dict[str, torch.Tensor]):
    """train.step_fn: the mean cross-entropy of a dict batch, and its accuracy beside it."""
    logits = model(batch["x"])
    return F.cross_entropy(logits, batch["y"]), {"accuracy": (logits.argmax(dim=1) == batch["y"]).float().mean()}


# ---------------------------------------------------------------------------------------------------------------
# Token sequences of varying length, padded per batch: a loss that counts items


def token_samples(count: int = 256, seed: int = 0) -> List[Dict[str, torch.Tensor]]:
    """Sequences of 2 to 12 tokens; each label is the next token of a counting pattern (t + 1 mod VOCAB)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 13, (count,), generator=generator)
    starts = torch.randint(0, VOCAB, (count,), generator=generator)
    out = []
    for length, start in zip(lengths.tolist(), starts.tolist()):
        ids = (start + torch.arange(length)) % VOCAB
        out.append({"input_ids": ids, "labels": (ids + 1) % VOCAB})
    return out


def token_data():
    return token_samples(256, 0), None


def one_long_token_data():
    """80 short sequences (2 to 12 tokens), one of them 40 long: the stream's largest batch is the one that
    holds it."""
    samples = token_samples(80, 2)
    ids = torch.arange(40) % VOCAB
    samples[0] = {"input_ids": ids, "labels": (ids + 1) % VOCAB}
    return samples, None


def pad_collate(samples: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """data.collate_fn: dynamic padding to the batch's longest sequence (labels padded with -100, so the loss
    skips them), with the attention mask."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), PAD_LABEL, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = s["input_ids"], s["labels"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class TokenNet(nn.Module):
    """Per-token logits (each position alone, so padding changes nothing else), and with `labels` its own loss:
    the mean over the labels that are not -100, returned as Hugging Face models return theirs."""

    def __init__(self, num_classes: int = VOCAB, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.Sequential(Block(width))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, labels: Any = None) -> Dict[str, Any]:
        logits = self.head(self.blocks(self.embed(input_ids)))
        out: Dict[str, Any] = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD_LABEL)
        return out


def token_net(num_classes: int = VOCAB) -> nn.Module:
    return TokenNet(num_classes)


def token_step_sum(model: nn.Module, batch: Dict[str, torch.Tensor]):
    """train.step_fn: the loss summed over the tokens that are not padding, and their count as its items."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    labels = batch["labels"]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD_LABEL, reduction="sum")
    return loss, {"items": labels.ne(PAD_LABEL).sum()}


def token_step_counted(model: nn.Module, batch: Dict[str, torch.Tensor]):
    """token_step_sum with a figure beside it: the next-token accuracy over the tokens that are not padding."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    labels = batch["labels"]
    kept = labels.ne(PAD_LABEL)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD_LABEL, reduction="sum")
    correct = (logits.argmax(dim=-1) == labels) & kept
    return loss, {"items": kept.sum(), "accuracy": correct.sum() / kept.sum().clamp(min=1)}


def token_step_mean(model: nn.Module, batch: Dict[str, torch.Tensor]):
    """The naive step: each micro-batch's mean over its own tokens (what layouts do not agree on)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["logits"]
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=PAD_LABEL)


# ---------------------------------------------------------------------------------------------------------------
# A Hugging Face sequence classifier (transformers, tiny config: nothing downloaded)


def sentence_data():
    """Sentences of 3 to 16 token ids (from 4 up; 0 is padding, 1 the [CLS] token) labelled 1 when token 5 is in
    them."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(384):
        length = int(torch.randint(3, 17, (1,), generator=generator))
        ids = torch.randint(4, 12, (length,), generator=generator)
        out.append({"input_ids": torch.cat([torch.tensor([1]), ids]), "label": int((ids == 5).any())})
    return out, None


def sentence_collate(samples: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """Dynamic padding for a sequence classifier: input_ids and attention_mask to the batch's longest, labels
    one per sentence (Hugging Face's names)."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, :len(s["input_ids"])], mask[i, :len(s["input_ids"])] = s["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["label"] for s in samples])}


def tiny_bert(num_classes: int = 2) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=num_classes,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


# ---------------------------------------------------------------------------------------------------------------
# A one-weight model whose gradient is known: clipping worked out by hand


class ScalarNet(nn.Module):
    def __init__(self, num_classes: int = 2):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def scalar_net(num_classes: int = 2) -> nn.Module:
    return ScalarNet()


def threes():
    """Every sample x = 3: the loss w * mean(x) has the gradient 3 at every step."""
    return [{"x": torch.tensor(3.0)} for _ in range(256)], None


def scalar_step(model: nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["x"]).mean()


def named_sgd(named_parameters, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
    """optim._target_ of a factory that takes the model's named parameters: weight decay on matrices only."""
    matrices = [p for name, p in named_parameters if p.dim() >= 2]
    others = [p for name, p in named_parameters if p.dim() < 2]
    named_sgd.names = [name for name, _ in named_parameters]
    return torch.optim.SGD([{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
                           lr=lr, **kwargs)
