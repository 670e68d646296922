"""A Hugging Face sequence classifier fine-tuned from a CSV of (text, label) rows: everything a team writes to
point sweeper at its own model, data, batches and metric (docs/your-training.md walks through it; the e2e test
tests/e2e/test_your_training.py runs it through the CLI).

    python -m sweeper model=custom model._target_=examples.hf_classifier.build_model \
        data=custom data._target_=examples.hf_classifier.load_csv data.num_classes=2 \
        +data.kwargs.train_path=train.csv +data.kwargs.val_path=val.csv \
        data.collate_fn=examples.hf_classifier.collate \
        eval.metrics_fn=examples.hf_classifier.F1 report.quality_metric=f1 \
        optim=adamw optim.weight_decay=0.01 optim.no_decay=[bias,LayerNorm] \
        train.lr_schedule=cosine train.warmup_steps=4 train.grad_clip_norm=1.0

Nothing here is downloaded. A real project loads its tokenizer and weights with
`AutoTokenizer.from_pretrained(...)` and `AutoModelForSequenceClassification.from_pretrained(...)`; this example
hashes words into a fixed vocabulary and builds a small BERT from its config, so it runs anywhere.
"""

from __future__ import annotations

import csv
import zlib
from typing import Any, Dict, List, Optional, Tuple

import torch

PAD, CLS = 0, 1  # the ids BERT's embedding reserves here; words hash into [2, vocab_size)


def tokenize(text: str, vocab_size: int, max_words: int) -> torch.Tensor:
    """[CLS] then each word's id: a stable hash (crc32) into the vocabulary, the same on every worker."""
    words = text.lower().split()[:max_words]
    return torch.tensor([CLS] + [2 + zlib.crc32(w.encode()) % (vocab_size - 2) for w in words])


def read_rows(path: str, vocab_size: int, max_words: int) -> List[Dict[str, Any]]:
    """A CSV with the columns `text` and `label` (an integer class) as samples {input_ids, label}: dicts of
    varying length, padded per batch by `collate`."""
    with open(path, newline="") as f:
        return [{"input_ids": tokenize(row["text"], vocab_size, max_words), "label": int(row["label"])}
                for row in csv.DictReader(f)]


def load_csv(train_path: str, val_path: Optional[str] = None, vocab_size: int = 512,
             max_words: int = 32) -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """data._target_: (train, validation) samples from the two CSV files."""
    train = read_rows(train_path, vocab_size, max_words)
    return train, read_rows(val_path, vocab_size, max_words) if val_path else None


def collate(samples: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """data.collate_fn: dynamic padding to the batch's longest sentence, in Hugging Face's names (the model
    computes its own loss from `labels`)."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), longest), PAD, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n], mask[i, :n] = s["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["label"] for s in samples])}


def build_model(num_classes: int = 2, vocab_size: int = 512, hidden_size: int = 32, layers: int = 2):
    """model._target_: a BERT classifier from its config (a real project: from_pretrained)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=64,
                        num_labels=num_classes, pad_token_id=PAD)
    return BertForSequenceClassification(config)


class F1:
    """eval.metrics_fn: the positive class's F1 over the whole validation split. `update` returns counts with one
    entry per sample; sweeper sums them over every batch and worker and calls `compute` once on the totals (an F1
    of the split, not a mean of per-batch F1s), and bootstraps its interval over the samples."""

    higher_is_better = {"f1": True, "precision": True, "recall": True}

    def update(self, outputs, batch) -> Dict[str, torch.Tensor]:
        predicted, labels = outputs.logits.argmax(dim=-1), batch["labels"]
        return {"tp": (predicted == 1) & (labels == 1), "fp": (predicted == 1) & (labels == 0),
                "fn": (predicted == 0) & (labels == 1)}

    def compute(self, totals: Dict[str, Any]) -> Dict[str, float]:
        tp, fp, fn = (float(totals[k]) for k in ("tp", "fp", "fn"))
        return {"f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
                "precision": tp / (tp + fp) if tp + fp else 0.0, "recall": tp / (tp + fn) if tp + fn else 0.0}
