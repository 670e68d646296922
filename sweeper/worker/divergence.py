"""Whether a point's training diverged, decided where the device is synchronized anyway (the timed
windows' edges), never with a host sync per step, and agreed by every rank: a rank that sees NaN
alone must not leave the others waiting in a collective.

Reasons: `nonfinite` (the loss, or the gradient's norm, NaN or infinite), `spike` (several steps in a
row far above the running loss that do not come back under it within `divergence.recover_steps`),
`worse_than_guess` (the final validation loss above a uniform guess's, ln(classes), by more than its
noise). A spike that comes back is a warning on the point (`spike_warning`), not a divergence; so is
one that began within `recover_steps` of the end and had no steps left to come back in (unresolved:
the point is judged by its final quality). A point whose final validation accuracy is not separated
from a guess is `did_not_learn` (`did_not_learn`), not diverged. Ray Tune has mishandled NaN metrics
for years; the status is decided here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from sweeper.config import DivergenceConfig
from sweeper.config.report import ReportConfig
from sweeper.stats import above_chance
from sweeper.worker import collectives as comm
from sweeper.worker.step import Training

NONFINITE, SPIKE, WORSE_THAN_GUESS = "nonfinite", "spike", "worse_than_guess"
DID_NOT_LEARN = "did_not_learn"  # a status of its own, not a divergence reason
# Fewer steps than this say too little about learning for the did_not_learn rule: a point that has
# hardly started (a frontier probe, a test's toy point) is not judged.
CHANCE_MIN_STEPS = 20


@dataclass(frozen=True)
class Diverged:
    step: int  # the first optimizer step (0-based) that shows it
    reason: str  # nonfinite | spike
    detail: str  # the numbers, in words


@dataclass(frozen=True)
class Spike:
    """`spike_steps` losses in a row over the bar (max(spike_factor x the running mean, the untrained
    loss)), from `step` on."""

    step: int  # the first step over the bar
    mean: float  # the mean of the `spike_window` losses before it
    bar: float
    peak: float  # the highest loss from `step` until it came back (or to the end)
    recovered_after_steps: Optional[int]  # from `step` to the first loss back under the bar; None: never

    @property
    def peak_over_mean(self) -> float:
        return self.peak / self.mean

    def recovered(self, cfg: DivergenceConfig) -> bool:
        return self.recovered_after_steps is not None and self.recovered_after_steps <= cfg.recover_steps


def check(run: Training, cfg: DivergenceConfig, final: bool = False) -> Optional[Diverged]:
    """Divergence in the steps done so far, the same on every rank (call it on every rank, at a point
    where all are: the window edges). `final`: training has ended, so a spike still over its bar is a
    divergence even if fewer than `recover_steps` steps followed it."""
    done = run.steps_done
    if not cfg.check or done == 0:
        return None
    losses = run.step_losses[:done]
    bad = ~torch.isfinite(losses)
    # Under fp16 a non-finite gradient is the GradScaler's business (it skips the step and lowers
    # the scale); only the loss says the run itself went wrong.
    if run.grad_norms is not None and run.scaler is None:
        bad |= ~torch.isfinite(run.grad_norms[:done])
    first = torch.where(bad.any(), bad.to(torch.int64).argmax(), torch.tensor(done, device=bad.device))
    first = first.to(torch.int64).reshape(1)
    comm.all_reduce(first, run.ctx, dist.ReduceOp.MIN)
    if int(first.item()) < done:
        step = int(first.item())
        return Diverged(step, NONFINITE, f"the loss or the gradient's norm was not finite at step {step}")
    before = prior_losses(run)
    return find_spike(before + global_losses(run), cfg, final, offset=len(before))


def prior_losses(run: Training) -> List[float]:
    """The global losses of the steps before a continued run (its checkpoint's history; [] for a run
    from step 0): the untrained loss and the running mean go on from them."""
    return list(run.history.losses) if run.history is not None else []


def global_losses(run: Training) -> List[float]:
    """The global batch's loss at each step done so far: every worker's micro-batches averaged; for a loss that
    counts items, every micro-batch's sum over the global batch's items."""
    done = run.steps_done
    if run.counts_items:
        both = torch.stack([run.step_losses[:done], run.step_items[:done]])
        comm.all_reduce(both, run.ctx, dist.ReduceOp.SUM)
        return (both[0] / both[1].clamp(min=1)).cpu().tolist()
    losses = run.step_losses[:done].clone() / run.spec.point.accumulation_steps
    comm.all_reduce(losses, run.ctx, dist.ReduceOp.SUM)
    return (losses / run.ctx.world_size).cpu().tolist()


def spikes(losses: Sequence[float], cfg: DivergenceConfig) -> List[Spike]:
    """Every run of `spike_steps` consecutive losses each above `spike_factor` x the mean of the
    `spike_window` losses before the run began (llm-foundry's rule: a loss >= 2x the running mean,
    several times in a row) and above the untrained model's loss (the first step's), in order, each
    with how long the loss took to come back under its bar; the scan stops at one that never does.
    The second condition is for small batches: once a classifier's mean loss is small, a few hard
    micro-batches in a row exceed twice it while the run is fine; a diverging run climbs past where
    it started."""
    window, run_length = cfg.spike_window, cfg.spike_steps
    start_loss = losses[0] if losses else math.inf
    found: List[Spike] = []
    start = window
    while start <= len(losses) - run_length:
        mean = sum(losses[start - window:start]) / window
        bar = max(cfg.spike_factor * mean, start_loss)
        if not (mean > 0 and all(losses[start + i] > bar for i in range(run_length))):
            start += 1
            continue
        back = next((j for j in range(start + run_length, len(losses)) if losses[j] <= bar), None)
        peak = max(losses[start:back if back is not None else len(losses)])
        found.append(Spike(start, mean, bar, peak, None if back is None else back - start))
        if back is None:
            break
        start = back
    return found


def find_spike(losses: Sequence[float], cfg: DivergenceConfig, final: bool = True,
               offset: int = 0) -> Optional[Diverged]:
    """The first spike (`spikes`) whose loss did not come back under its bar within `recover_steps`
    steps of its start, as a divergence. A spike still over its bar with fewer than `recover_steps`
    steps after its start is never one: before the end of training (`final` False) it may still come
    back; at the end (`final`) it had no room to, so it is unresolved (`unresolved_spike`), a warning,
    and the point is judged by its final quality. (`final` is kept for the callers' sake: the rule is
    the same.) `offset`: how many of `losses` came before this run (a continued run's history); the
    step named is this run's (0 for a spike that began before it and never came back)."""
    for spike in spikes(losses, cfg):
        if spike.recovered(cfg):
            continue
        if _no_room(spike, losses, cfg):
            return None
        where = ("by the end of training" if spike.recovered_after_steps is None
                 else f"for {spike.recovered_after_steps} steps")
        step = max(spike.step - offset, 0)
        return Diverged(step, SPIKE, (
            f"the loss went over {cfg.spike_factor:g}x the mean of the {cfg.spike_window} steps before step "
            f"{step} ({spike.mean:.4g}) and over the untrained loss ({losses[0]:.4g}) and did not come back "
            f"under within {cfg.recover_steps} steps (it stayed over {where}; peak {spike.peak:.4g})"
        ))
    return None


def _no_room(spike: Spike, losses: Sequence[float], cfg: DivergenceConfig) -> bool:
    """Still over its bar at the last loss, with fewer than `recover_steps` steps after its start: it
    could not yet have come back in time, so nothing is decided by it."""
    return spike.recovered_after_steps is None and len(losses) - 1 - spike.step < cfg.recover_steps


def unresolved_spike(losses: Sequence[float], cfg: DivergenceConfig, offset: int = 0) -> Optional[Spike]:
    """At the end of training, a spike still over its bar that began within `recover_steps` steps of
    the end: no steps were left to see whether it comes back. Not a divergence (the ResNet recipe's
    short budget once ended in one and was recorded diverged although it had learned); the point is
    judged by its final quality, and the spike's height is kept. `offset` as in `recovered_spike`."""
    if not cfg.check:
        return None
    found = spikes(losses, cfg)
    if not found or not _no_room(found[-1], losses, cfg) or any(
            not s.recovered(cfg) for s in found[:-1]):
        return None
    spike = found[-1]
    return replace(spike, step=max(spike.step - offset, 0)) if offset else spike


def unresolved_warning(spike: Spike, cfg: DivergenceConfig) -> str:
    return (f"an unresolved loss spike from step {spike.step}: {cfg.spike_steps}+ steps over {cfg.spike_factor:g}x "
            f"the running mean ({spike.mean:.4g}), peak {spike.peak_over_mean:.3g}x it, still over at the end of "
            f"training with fewer than divergence.recover_steps={cfg.recover_steps} steps left to come back in; "
            "not a divergence: the point is judged by its final validation quality")


def recovered_spike(losses: Sequence[float], cfg: DivergenceConfig, offset: int = 0) -> Optional[Spike]:
    """The first spike that came back under its bar within `recover_steps`: a warning, not a divergence.
    `offset`: how many of `losses` came before this run; only a spike that began in this run counts, its
    step this run's."""
    if not cfg.check:
        return None
    found = next((s for s in spikes(losses, cfg) if s.recovered(cfg) and s.step >= offset), None)
    return replace(found, step=found.step - offset) if found is not None and offset else found


def spike_warning(spike: Spike, cfg: DivergenceConfig) -> str:
    return (f"a loss spike from step {spike.step}: {cfg.spike_steps}+ steps over {cfg.spike_factor:g}x the running "
            f"mean ({spike.mean:.4g}), peak {spike.peak_over_mean:.3g}x it; back under after "
            f"{spike.recovered_after_steps} steps, so not a divergence")


def confidence(cfg: DivergenceConfig) -> float:
    """The level a point's accuracy is tested against a guess at: report.confidence (copied into
    divergence.confidence when the config is loaded), else the report's default."""
    return ReportConfig().confidence if cfg.confidence is None else cfg.confidence


def did_not_learn(accuracy: float, samples: int, num_classes: int, steps: int,
                  cfg: DivergenceConfig) -> Optional[str]:
    """Why a point learned nothing, or None: its validation hits (accuracy x samples) are not separated
    from a guess (1 / classes) by a one-sided exact binomial test at `confidence(cfg)`, whatever its
    loss did (a loss that falls while the accuracy stays at a guess has still learned nothing to
    show). Not judged: a point of fewer than CHANCE_MIN_STEPS steps, one with no validation samples
    or classes to guess among, or with divergence.check off."""
    if not cfg.check or steps < CHANCE_MIN_STEPS or num_classes < 2 or not samples or not math.isfinite(accuracy):
        return None
    level, hits = confidence(cfg), int(round(accuracy * samples))
    if above_chance(hits, samples, 1.0 / num_classes, level):
        return None
    return (f"validation accuracy {accuracy:.3f} ({hits}/{samples}) is not separated from a guess "
            f"(1/{num_classes}) at {level * 100:g} %")


def worse_than_guess(loss: Optional[float], loss_se: Optional[float], num_classes: Optional[int], steps: int,
                     cfg: DivergenceConfig) -> Optional[Diverged]:
    """A final validation loss (nats per sample, or per token) above a uniform guess's, ln(classes) (the
    vocabulary for a language model), by more than its noise (loss - z x standard error > ln(classes),
    z the one-sided normal quantile at `confidence(cfg)`): the model does worse than predicting nothing,
    so it diverged (`worse_than_guess`), whatever its accuracy. A non-finite loss is `nonfinite`. Not
    judged as did_not_learn is not (too few steps, no figures, divergence.check off)."""
    if not cfg.check or steps < CHANCE_MIN_STEPS or loss is None or not num_classes or num_classes < 2:
        return None
    if not math.isfinite(loss):
        return Diverged(steps - 1, NONFINITE, f"the final validation loss was {loss}")
    level, guess = confidence(cfg), math.log(num_classes)
    # 1e-6 relative: a model that predicts a guess exactly scores ln(classes) up to float32's rounding.
    if loss - NormalDist().inv_cdf(level) * (loss_se or 0.0) <= guess * (1 + 1e-6):
        return None
    return Diverged(steps - 1, WORSE_THAN_GUESS, (
        f"the final validation loss {loss:.3f} nats is above a uniform guess's, ln({num_classes}) = {guess:.3f}, "
        f"at {level * 100:g} %: the model predicts worse than knowing nothing"))


def did_not_learn_tokens(loss: float, loss_se: Optional[float], unigram_bits: Optional[float], steps: int,
                         cfg: DivergenceConfig) -> Optional[str]:
    """A language model's rule: why it learned nothing beyond which tokens are common, or None. Its
    validation loss (nats per token) must lie below the training stream's unigram entropy by more than
    its noise: loss + z x standard error < entropy, z the one-sided normal quantile at `confidence(cfg)`.
    Against the unigram entropy, not a uniform guess's ln(vocabulary): a byte model reaches the latter
    by counting bytes, which is not what its batch layout is being chosen to learn. Not judged as
    did_not_learn is not (too few steps, no figures, divergence.check off)."""
    if not cfg.check or steps < CHANCE_MIN_STEPS or unigram_bits is None or not math.isfinite(loss):
        return None
    level, entropy = confidence(cfg), unigram_bits * math.log(2)
    bound = loss + NormalDist().inv_cdf(level) * (loss_se or 0.0)
    if bound < entropy:
        return None
    return (f"validation loss {loss:.3f} nats per token ({loss / math.log(2):.3f} bits) is not below the training "
            f"stream's unigram entropy {entropy:.3f} nats ({unigram_bits:.3f} bits) at {level * 100:g} %: it "
            "learned no more than which tokens are common")
