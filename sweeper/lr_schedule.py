"""The LR schedule of a point (train.lr_schedule after train.warmup_steps), as the factor its LR is multiplied
by at each optimizer step, counted in samples of the point's budget: every layout of one global batch takes the
same LR at the same sample, and a run continued from a training state (another global batch, a smart rung, a
branch, a batch-size schedule's next span) goes on from where the schedule stood.

Pure (standard library): the worker's step (sweeper.worker.step) applies it to the optimizer's groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# constant: today's (the warm-up, then the point's LR); linear and cosine decay to min_lr_ratio x the LR at the
# budget's end; wsd (warmup-stable-decay) holds the LR, then decays it linearly over the budget's last
# decay_fraction (Hägele et al. 2024's cool-down).
SCHEDULES = ("constant", "linear", "cosine", "wsd")


@dataclass(frozen=True)
class Schedule:
    """A point's schedule in samples. `total_samples`: the budget it spans (where linear and cosine reach
    `min_lr_ratio` and wsd ends its decay); `warmup_samples`: train.warmup_steps x the global batch the point
    started at (0: none)."""

    name: str = "constant"
    total_samples: int = 0
    warmup_samples: int = 0
    min_lr_ratio: float = 0.0
    decay_fraction: float = 0.2

    def factor(self, samples_before: int, global_batch: int) -> float:
        """The LR factor of the step that trains samples [samples_before, samples_before + global_batch).

        The warm-up counts the samples seen *after* the step, (s + G) / warmup (today's: at one global batch
        (step + 1) / warmup_steps, so its first step does not waste its samples at LR 0); the decay counts
        those seen *before* it, so the first step after the warm-up is at the full LR and the budget's last
        step still above the floor (as Hugging Face's schedules count steps)."""
        return self.warmup(samples_before + global_batch) * self.decay(samples_before)

    def warmup(self, samples_after: int) -> float:
        if self.warmup_samples <= 0:
            return 1.0
        return min(1.0, samples_after / self.warmup_samples)

    def decay(self, samples_before: int) -> float:
        """The decay's factor after the warm-up: 1 until its decay starts, then down to min_lr_ratio."""
        if self.name == "constant":
            return 1.0
        start = self.decay_start
        if self.total_samples <= start:  # no room left to decay in: the LR stays
            return 1.0
        progress = min(1.0, max(0.0, (samples_before - start) / (self.total_samples - start)))
        low = self.min_lr_ratio
        if self.name == "cosine":
            return low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - (1.0 - low) * progress  # linear, and wsd's decay phase

    @property
    def decay_start(self) -> float:
        """Samples seen when the decay begins: the warm-up's end (linear, cosine), or the start of the budget's
        last decay_fraction, never inside the warm-up (wsd)."""
        if self.name == "wsd":
            return max(float(self.warmup_samples), self.total_samples * (1.0 - self.decay_fraction))
        return float(self.warmup_samples)

    @property
    def is_constant(self) -> bool:
        """Whether every step takes the point's LR (no warm-up, no decay): nothing to set."""
        return self.name == "constant" and self.warmup_samples <= 0
