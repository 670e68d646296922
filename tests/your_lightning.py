"""A team's LightningModule and LightningDataModule, written as Lightning's docs write them (model=lightning
model.module=tests.your_lightning.LitClassifier data=lightning data.datamodule=tests.your_lightning.BlobDataModule):
nothing in them knows sweeper. BatchNorm-free; small enough to fit in a unit test on the CPU.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.your_loop import NUM_CLASSES, blobs
from tests.your_training import BlockNet


class LitClassifier(L.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.model = BlockNet(NUM_CLASSES)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class BlobDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str):
        self.train_set, self.val_set = blobs()

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)
