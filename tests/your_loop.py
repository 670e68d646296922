"""A team's own training as it already is, for loop.fn and model=lightning: a Ray Train-style
`train_loop_per_worker` with its prepare and report lines swapped for sweeper.loop's (docs/your-training.md shows
it beside the plain Ray Train one), and a LightningModule with its LightningDataModule written as Lightning's
docs write them. BatchNorm-free (tests/your_training.BlockNet), so every layout of one global batch trains the
same model. Small enough to train in a unit test on the CPU; nothing is downloaded.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import sweeper.loop
from tests.your_training import BlockNet, dict_samples

NUM_CLASSES = 4


def blobs() -> Tuple[TensorDataset, TensorDataset]:
    """(train, val): features whose class is the argmax of their first four values, as tensors."""
    def tensors(samples):
        return TensorDataset(torch.stack([s["x"] for s in samples]), torch.tensor([s["y"] for s in samples]))
    return tensors(dict_samples(512, NUM_CLASSES, 0)), tensors(dict_samples(128, NUM_CLASSES, 1))


def blob_data():
    """data._target_ of the built-in loop over the same samples: (train, val) of (features, class) pairs."""
    return blobs()


def block_net(num_classes: int = NUM_CLASSES) -> torch.nn.Module:
    return BlockNet(num_classes)


# ---------------------------------------------------------------------------------------------------------------
# Your loop (loop.fn): a Ray Train train_loop_per_worker with sweeper.loop's prepare and report


def train_loop_per_worker(config):
    train_set, val_set = blobs()
    model = BlockNet(NUM_CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True)
    val_loader = DataLoader(val_set, batch_size=64)

    model, optimizer, loader = sweeper.loop.prepare(model, optimizer, loader)
    device = sweeper.loop.device()

    for epoch in range(config["epochs"]):  # noqa: B007 - as Ray Train loops are written
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sweeper.loop.report(loss=loss)

        model.eval()
        correct, total, loss_sum = 0, 0, 0.0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                logits = model(x)
                loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(dim=1) == y).sum().item()
                total += len(y)
        sweeper.loop.report(val_loss=loss_sum / total, val_accuracy=correct / total, hit_rate=correct / total)


def accelerate_style_loop(config):
    """The same training written as Accelerate users write it: the accumulation context and sweeper.loop's
    backward and step."""
    train_set, _ = blobs()
    model = BlockNet(NUM_CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    model, optimizer, loader = sweeper.loop.prepare(model, optimizer, DataLoader(train_set, batch_size=8))
    for _ in range(config["epochs"]):
        for x, y in loader:
            with sweeper.loop.accumulate(model):
                sweeper.loop.backward(F.cross_entropy(model(x), y))
            sweeper.loop.step()


def loop_that_stops_early(config):
    """Returns after its first pass's first step: the point's budget is not trained."""
    train_set, _ = blobs()
    model = BlockNet(NUM_CLASSES)
    model, optimizer, loader = sweeper.loop.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                    DataLoader(train_set))
    for x, y in loader:
        sweeper.loop.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        break


def loop_without_loss(config):
    """Never reports its loss."""
    train_set, _ = blobs()
    model = BlockNet(NUM_CLASSES)
    model, optimizer, loader = sweeper.loop.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                    DataLoader(train_set))
    for _ in range(config["epochs"]):
        for x, y in loader:
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
