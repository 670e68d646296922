"""What a train sweep's point records beside its measurements: its MLflow params (the layout, the recipe,
the LR it trained at: `point_params`), the note its accuracy carries (`accuracy_note`), and the write
itself (`record_point`). Shared by the train sweep (train_sweep.py) and each strategy's driver side
(grid.py, smart.py, branch.py).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from sweeper import plan
from sweeper.config import SweeperConfig
from sweeper.driver.skeleton import Session
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.worker.spec import PointSpec
from sweeper.workloads import models

SYNTHETIC_NOTE = "not measured: synthetic data has random labels, so accuracy would mean nothing"


def record_point(cfg: SweeperConfig, s: Session, spec: PointSpec, point: GridPoint, result: PointResult) -> None:
    """`point`'s MLflow child run: its params (from its spec) and its result; with sweep.retry_failed it
    replaces the point's failed run from before the resume."""
    s.tracker.log_point(point, point_params(cfg, spec, result), result, replace_failed=cfg.sweep.retry_failed)


def accuracy_note(cfg: SweeperConfig) -> Optional[str]:
    """The note on a point's accuracy: synthetic data's labels are random, so its accuracy means nothing."""
    return SYNTHETIC_NOTE if cfg.data.name == "synthetic" and not cfg.data._target_ else None


def point_params(cfg: SweeperConfig, spec: PointSpec, result: Optional[PointResult] = None) -> Dict[str, Any]:
    """The point's MLflow params: what it is, and (`result`) how its worker trained it."""
    point = spec.point
    # How accumulation reduced, as the worker read it back from its model (final | every | none); absent for a
    # point no worker trained (skipped by prediction, failed before its first step).
    done = {"gradient_sync": result.gradient_sync} if result is not None and result.gradient_sync else {}
    return {
        # the point its replicates share (every axis but the seed): group runs by it to compare points
        "point": point.point_key,
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        # the training that is yours: your loop (loop.fn), your LightningModule and DataModule (model=lightning)
        **{key: value for key, value in (("loop_fn", cfg.loop.fn), ("lightning_module", cfg.model.module),
                                         ("lightning_datamodule", cfg.data.datamodule)) if value},
        "micro_batch_size": point.micro_batch_size,
        "accumulation_steps": point.accumulation_steps,
        "num_workers": point.num_workers,
        # how the workers hold the model (absent in older records: ddp) and how accumulation reduced
        "parallelism": point.parallelism,
        **done,
        "global_batch_size": point.global_batch_size,
        "lr": spec.lr,
        "lr_scaling": cfg.train.lr_scaling,
        "epochs": cfg.train.epochs if cfg.train.samples is None else None,
        "train_samples": cfg.train.samples if cfg.train.samples is None or point.context is None
        else plan.sample_budget(0, 0, cfg.train.samples, point.context, cfg.model.context),
        # a language model's sequences: tokens per sample and per optimizer step
        **({"context": models.positions(spec.model),
            "tokens_per_step": point.global_batch_size * models.positions(spec.model)}
           if models.is_language_model(cfg.model) else {}),
        "seed": spec.seed,
        "lr_multiplier": point.lr_multiplier,
        "warmup_steps": cfg.train.warmup_steps,
        "batch_schedule": cfg.train.batch_schedule,
        "bn_recalibration_samples": cfg.train.bn_recalibration_samples,
        # the recipe, as trained
        "precision": point.precision,
        "activation_checkpointing": point.checkpointing,
        "optimizer": optimizer_name(cfg),
        **recipe_params(cfg),
        "compiled": cfg.train.compile,
        "label_smoothing": cfg.loss.label_smoothing if not cfg.loss._target_ else None,
        "loss": cfg.loss._target_ or cfg.loss.name,
    }


def recipe_params(cfg: SweeperConfig) -> Dict[str, Any]:
    """The recipe a point trained beyond its layout (what a trainer snippet must set to train the same): the
    optimizer's own hyperparameters (an SGD's momentum, an AdamW's betas and eps; none of a factory of your
    own), weight decay and what it spares, the LR schedule, clipping ("None": off), your step and collate."""
    optim, train = cfg.optim, cfg.train
    own: Dict[str, Any] = {}
    if not optim._target_ and optim.name == "sgd":
        own = {"momentum": optim.momentum, "nesterov": optim.nesterov}
    elif not optim._target_ and optim.name == "adamw":
        own = {"betas": ",".join(str(b) for b in optim.betas), "eps": optim.eps}
    return {**own, "weight_decay": optim.weight_decay if not optim._target_ else None,
            "no_decay": ",".join(optim.no_decay), "lr_schedule": train.lr_schedule,
            "min_lr_ratio": train.min_lr_ratio, "decay_fraction": train.decay_fraction,
            "grad_clip_norm": train.grad_clip_norm, "step_fn": train.step_fn, "collate_fn": cfg.data.collate_fn}


def optimizer_name(cfg: SweeperConfig) -> str:
    return cfg.optim._target_ or cfg.optim.name
