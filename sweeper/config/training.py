"""The training recipe's sections (optim, loss, train, eval, divergence, gns, measure): every default
once, and each section's checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sweeper.config.report import LR_SCALING_RULES, invalid_choice
from sweeper.config.rules import check_rule, is_not_negative, is_positive
from sweeper.config.workload import check_factory
from sweeper.errors import first_line
from sweeper.lr_schedule import SCHEDULES


# The recipe's choices (sweeper.recipe maps each to what torch runs).
OPTIMIZERS = ("sgd", "adamw")


PRECISIONS = ("fp32", "bf16", "fp16")


CHECKPOINTING = ("none", "blocks")


@dataclass
class OptimConfig:
    # The optimizer every point trains with: a config group, optim=sgd | adamw | custom (conf/config.yaml
    # picks adamw). Defaults are SGD's; conf/optim/adamw.yaml sets AdamW's. custom: `_target_` names a
    # factory called as factory(params, lr=<optim.lr after lr scaling>, **kwargs) that returns a
    # torch.optim.Optimizer.
    name: str = "sgd"
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # The LR at train.base_batch_size; train.lr_scaling moves it with global batch / base.
    lr: float = 0.05
    weight_decay: float = 0.0
    # sgd: momentum in [0, 1) and Nesterov's variant.
    momentum: float = 0.9
    nesterov: bool = False
    # adamw: the moving averages' decay rates (each in [0, 1)) and the denominator's epsilon.
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    # Parameters that get no weight decay (sgd, adamw: a second parameter group with weight_decay 0): one whose
    # dotted name or whose module's class name holds an entry, case-insensitive. The default spares biases and
    # normalization weights (LayerNorm, BatchNorm2d, RMSNorm, ...), as most recipes do; [] decays every one.
    no_decay: List[str] = field(default_factory=lambda: ["bias", "norm"])


@dataclass
class LossConfig:
    # Cross-entropy, with label smoothing in [0, 1); or `_target_`: a factory called with `kwargs`
    # that returns a callable loss(logits, targets) -> scalar tensor.
    name: str = "cross_entropy"
    label_smoothing: float = 0.0
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    # The sample budget: every point trains epochs x train-set size samples, to within one global batch.
    epochs: int = 2
    # Or a budget in samples (sequences for a language model), whatever the train set's size: what a
    # corpus larger than the sweep's budget needs. null: train.epochs.
    samples: Optional[int] = None
    # The LR itself is optim.lr (at base_batch_size); lr_scaling (none | linear | sqrt) moves it with
    # global batch / base.
    lr_scaling: str = "none"
    base_batch_size: int = 32
    # The LR rises linearly from 0 over this many optimizer steps (Goyal et al. 2017's warmup), then
    # follows lr_schedule. 0: no warmup. Counted in samples: warmup_steps x the point's global batch.
    warmup_steps: int = 0
    # After the warmup: constant (the point's LR), linear or cosine (down to min_lr_ratio x the LR at the end
    # of the point's sample budget), or wsd (warmup-stable-decay: the LR held, then a linear decay to
    # min_lr_ratio x it over the budget's last decay_fraction). Counted in samples of the budget, so every
    # layout of one global batch has the same LR at the same sample (sweeper/lr_schedule.py).
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    decay_fraction: float = 0.2
    # Clip the whole gradient's 2-norm to this after the last micro-step's reduction (all ranks' gradients
    # averaged, fp16's unscaled; under zero2/zero3 the norm over every shard). null: no clipping.
    grad_clip_norm: Optional[float] = None
    # Import path of your step, `fn(model, batch) -> loss` or `(loss, {name: value})`, replacing the built-in
    # one; sweeper keeps accumulation, loss scaling, autocast, gradient sync, timing and memory around it. A
    # returned "items" (e.g. the tokens that are not padding) says the loss is a SUM over that many items:
    # sweeper then divides by the items of the whole global batch. null: the model's own loss for a batch
    # mapping with `labels` (Hugging Face's `model(**batch).loss`), else loss(model(inputs), targets).
    step_fn: Optional[str] = None
    # torch.compile the model. Compilation (and recompilation per batch size) happens in the first,
    # untimed warm-up step and is recorded as compile_step_seconds, never inside the timed windows.
    compile: bool = False
    # Seeds the initial weights and the sample order.
    seed: int = 0
    # Before validation, BatchNorm running statistics are re-estimated over this many training
    # samples (torch.optim.swa_utils.update_bn), so val_accuracy judges the trained weights and
    # not how many running-average updates a layout took (0: keep the statistics as trained).
    bn_recalibration_samples: int = 1024
    # Save every point's training state at its end (weights, optimizer state, position in the sample
    # stream, RNG: sweeper/worker/state.py) under <cluster.ray_dir>/results/<sweep>/checkpoints/<point>,
    # recorded on its MLflow run (tag sweeper.checkpoint). On a cluster, cluster.ray_dir on storage every
    # node reads.
    save_state: bool = False
    # Continue every point from this training-state checkpoint (a folder train.save_state wrote) at its own
    # layout and LR: the sample stream goes on where it stood, and the point trains what is left of the
    # sample budget. It must be of the same model, data, optimizer and seed. null: from scratch.
    start_from: Optional[str] = None
    # A batch-size schedule: [[samples seen, global batch], ...] from [0, <the grid's global batch>], e.g.
    # [[0,32],[4096,64],[16384,128]]: every point keeps its micro-batch and workers and raises its
    # accumulation to reach each span's global batch (the LR by train.lr_scaling for it), continuing its
    # own training state in memory; a span's start must be a multiple of the span before's global batch.
    # null: one global batch throughout.
    batch_schedule: Any = None


@dataclass
class EvalConfig:
    # Evaluate during training every this many samples, rounded up to whole global batches (as
    # MLPerf does), for the accuracy curve and the time to a target; evaluation time is on the time
    # to target's clock and out of the throughput windows. null: once, after training.
    every_samples: Optional[int] = None
    # The target a point's time to target is measured to: a validation accuracy (a fraction), or a
    # validation loss to get under. At most one; null: no target.
    target_accuracy: Optional[float] = None
    target_loss: Optional[float] = None
    # Stop a point's training once it reaches the target (its throughput comes from the windows
    # timed before then).
    stop_at_target: bool = False
    # Validation samples per forward on each worker. null: the point's own micro-batch (it trained at
    # that size, so its forward fits). A language model's loss is computed in chunks of rows either
    # way (sweeper/worker/scoring.py), so the fp32 logits of a whole batch never exist at once; its
    # logits in the model's dtype do: batch x context x vocabulary values.
    batch_size: Optional[int] = 256
    # Score this many validation samples, a seeded subset fixed for the whole sweep (every point and
    # every seed sees the same samples, which the paired rule needs). null: the whole split.
    max_samples: Optional[int] = None
    # Metrics of your own: the import path of a class (or a factory called with no arguments) whose
    # objects have `update(outputs, batch) -> {count name: tensor with one entry per sample}`,
    # `compute(totals) -> {metric: float}` and `higher_is_better = {metric: bool}`. Counts are summed
    # over every batch and rank before `compute`, so an F1 is the whole split's, not a mean of
    # batches'; each metric's interval is a bootstrap over the validation samples (docs/recommendation.md).
    # Recorded as val_metric/<name>; report.quality_metric may judge by one. null: none.
    metrics_fn: Optional[str] = None


@dataclass
class DivergenceConfig:
    # A point whose loss or gradient norm goes NaN or infinite is `diverged` (reason nonfinite) and
    # stops at the next check (the timed windows' edges: no host sync per step).
    check: bool = True
    # spike: `spike_steps` steps in a row with a loss over `spike_factor` x the mean of the
    # `spike_window` steps before them (llm-foundry's rule, sized for short points) that does not
    # come back under that bar within `recover_steps` steps of its start (or by the end of training).
    # A spike that comes back is a warning on the point (tag sweeper.spike_warning), not a divergence.
    spike_factor: float = 2.0
    spike_steps: int = 3
    spike_window: int = 10
    recover_steps: int = 20
    # A point whose validation hits are not separated from a guess (1 / classes) at this level (a
    # one-sided exact binomial test) is `did_not_learn`. null: report.confidence, filled in when the
    # config is loaded, so the worker and the report judge at one level.
    confidence: Optional[float] = None


@dataclass
class GnsConfig:
    # The gradient noise scale B_simple of every point with more than one micro-batch per step
    # (accumulation x workers > 1), from its own micro-gradients (sweeper/worker/gns.py).
    enabled: bool = True
    # The moving averages' decay over steps: points are ~100 steps, so ~0.9 (gpt-neox's 0.99 would
    # still remember its initial state).
    ema_beta: float = 0.9
    # Measure on one optimizer step in this many (1: every step). Each measured step reads every
    # micro-gradient once more: on a GPU a fraction of a percent of a step, on a memory-bound CPU
    # ~2 % (ResNet-18, micro-batch 32; scripts/bench_step_costs.py). 2 halves that cost and the steps
    # the averages see (gpt-neox's estimator also skips steps).
    every_steps: int = 1


@dataclass
class MeasureConfig:
    # Optimizer steps excluded from timing (allocator warm-up, lazy init, optimizer state). The last
    # one runs under torch's MemTracker for the memory breakdown: after step 0 the optimizer state
    # exists, after step 1 DDP has rebuilt its gradient buckets, so 3 gives the steady state.
    warmup_steps: int = 3
    # The timed steps (whole optimizer steps, data loading included) are cut into this many windows.
    windows: int = 5
    # perf_analyzer's stability rule: if the last `stable_windows` windows all lie within
    # `stability_tolerance` of their mean, throughput is the rate over them; otherwise the trial is
    # recorded with the median of all windows and marked unstable.
    stable_windows: int = 3
    stability_tolerance: float = 0.05
    # Per-category memory of one warm-up step (torch MemTracker); FLOPs per sample and MFU.
    memory_breakdown: bool = True
    flops: bool = True
    # How often CPU (psutil) and GPU (pynvml) utilization are sampled during the timed windows.
    utilization_interval_seconds: float = 0.2
    # With profile=true: how many steps (after warm-up, untimed) the torch.profiler trace covers.
    profile_steps: int = 3


def check_optim(optim: OptimConfig) -> List[str]:
    problems: List[str] = []
    if not optim._target_ and optim.name not in OPTIMIZERS:
        problems.append(
            f"optim.name={optim.name!r} is unknown: use optim=sgd or optim=adamw, or optim=custom with "
            "optim._target_ set to your factory"
        )
    check_rule(problems, "optim.lr", optim.lr, is_positive, "must be positive")
    check_rule(problems, "optim.weight_decay", optim.weight_decay, is_not_negative, "must be >= 0")
    check_rule(problems, "optim.momentum", optim.momentum, lambda m: 0 <= m < 1, "must be in [0, 1), e.g. 0.9")
    check_rule(problems, "optim.eps", optim.eps, is_positive, "must be positive, e.g. 1e-8")
    if not isinstance(optim.betas, list) or len(optim.betas) != 2:
        problems.append(f"optim.betas={optim.betas!r}: give two decay rates, e.g. optim.betas=[0.9,0.999]")
    else:
        for i, beta in enumerate(optim.betas):
            check_rule(problems, f"optim.betas[{i}]", beta, lambda b: 0 <= b < 1, "must be in [0, 1), e.g. 0.9")
    if not isinstance(optim.no_decay, list) or not all(isinstance(n, str) and n for n in optim.no_decay):
        problems.append(f"optim.no_decay={optim.no_decay!r}: give a list of name parts, e.g. "
                        "optim.no_decay=[bias,norm], or [] to decay every parameter")
    if optim._target_:
        problems += check_factory("optim._target_", optim._target_, "a torch.optim.Optimizer")
    return problems


def check_loss(loss: LossConfig) -> List[str]:
    problems: List[str] = []
    if not loss._target_ and loss.name != "cross_entropy":
        problems.append(
            f"loss.name={loss.name!r} is unknown: the built-in loss is cross_entropy; give loss._target_ for another"
        )
    check_rule(problems, "loss.label_smoothing", loss.label_smoothing, lambda s: 0 <= s < 1,
               "must be in [0, 1), e.g. 0.1")
    if loss._target_:
        problems += check_factory("loss._target_", loss._target_, "a loss(logits, targets) callable")
    return problems


def check_train(train: TrainConfig) -> List[str]:
    problems: List[str] = []
    for key in ("epochs", "base_batch_size"):
        check_rule(problems, f"train.{key}", getattr(train, key), is_positive, "must be positive")
    check_rule(
        problems, "train.bn_recalibration_samples", train.bn_recalibration_samples, is_not_negative,
        "must be >= 0 (0 keeps BatchNorm's running statistics as trained)",
    )
    check_rule(problems, "train.warmup_steps", train.warmup_steps, is_not_negative, "must be >= 0 (0: no LR warmup)")
    if train.samples is not None:
        check_rule(problems, "train.samples", train.samples, is_positive, "must be positive, or null for train.epochs")
    problem = invalid_choice("train.lr_scaling", train.lr_scaling, LR_SCALING_RULES)
    return problems + ([problem] if problem else []) + _check_recipe(train) + _check_schedule(train.batch_schedule)


def _check_recipe(train: TrainConfig) -> List[str]:
    """The LR schedule, clipping and the step of your own."""
    problems: List[str] = []
    problem = invalid_choice("train.lr_schedule", train.lr_schedule, SCHEDULES)
    problems += [problem] if problem else []
    check_rule(problems, "train.min_lr_ratio", train.min_lr_ratio, lambda r: 0 <= r <= 1,
               "must be in [0, 1]: the LR at the budget's end as a fraction of the point's, e.g. 0.1")
    check_rule(problems, "train.decay_fraction", train.decay_fraction, lambda f: 0 < f <= 1,
               "must be in (0, 1]: wsd's share of the budget spent decaying, e.g. 0.2")
    check_rule(problems, "train.grad_clip_norm", train.grad_clip_norm, is_positive,
               "must be a positive norm, e.g. 1.0, or null for no clipping")
    if train.step_fn:
        problems += check_factory("train.step_fn", train.step_fn, "the loss of a batch (fn(model, batch) -> loss "
                                  "or (loss, {name: value}))")
    return problems


def _check_schedule(schedule: Any) -> List[str]:
    """train.batch_schedule: pairs of integers, from sample 0, samples rising, global batches positive."""
    if schedule is None:
        return []
    example = "e.g. train.batch_schedule=[[0,32],[4096,64]]"
    pairs = schedule if isinstance(schedule, list) else None
    if not pairs or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                     for v in p) for p in pairs):
        return [f"train.batch_schedule={schedule!r} is invalid: give [samples seen, global batch] pairs, {example}"]
    if pairs[0][0] != 0:
        return [f"train.batch_schedule starts at {pairs[0][0]} samples: its first span starts at 0, {example}"]
    if any(b[0] <= a[0] for a, b in zip(pairs, pairs[1:])):
        return [f"train.batch_schedule={pairs}: each span must start after the one before (samples rising)"]
    if any(g < 1 for _, g in pairs):
        return [f"train.batch_schedule={pairs}: every global batch must be positive"]
    return []


def check_eval(evaluation: EvalConfig) -> List[str]:
    problems: List[str] = []
    check_rule(problems, "eval.every_samples", evaluation.every_samples, is_positive, "must be positive, or null")
    check_rule(problems, "eval.target_accuracy", evaluation.target_accuracy, lambda a: 0 < a <= 1,
           "must be a fraction in (0, 1], e.g. 0.9, or null")
    check_rule(problems, "eval.target_loss", evaluation.target_loss, is_positive, "must be positive, or null")
    if evaluation.target_accuracy is not None and evaluation.target_loss is not None:
        problems.append("eval.target_accuracy and eval.target_loss are both set: give one target, or neither")
    if evaluation.stop_at_target and evaluation.target_accuracy is None and evaluation.target_loss is None:
        problems.append("eval.stop_at_target=true needs a target: set eval.target_accuracy or eval.target_loss")
    check_rule(problems, "eval.batch_size", evaluation.batch_size, is_positive,
               "must be a positive number of samples per forward, e.g. 64, or null (the point's micro-batch)")
    check_rule(problems, "eval.max_samples", evaluation.max_samples, is_positive,
               "must be a positive number of validation samples, or null (the whole split)")
    if evaluation.metrics_fn:
        problems += metrics_problems(evaluation.metrics_fn)[1]
    return problems


METRICS_API = ("a class whose objects have update(outputs, batch) -> {count: per-sample tensor}, "
               "compute(totals) -> {metric: float} and higher_is_better = {metric: bool}")


def metrics_problems(path: str, key: str = "eval.metrics_fn") -> Tuple[Dict[str, bool], List[str]]:
    """(each metric's direction: True when higher is better, problems) of eval.metrics_fn, made once
    (its class called with no arguments) to read what it declares."""
    from hydra.utils import get_method

    try:
        made = get_method(path)()
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises is told in one line
        return {}, [f"{key}={path!r} could not be imported and made ({type(exc).__name__}: {first_line(exc)}): "
                    f"give the import path of {METRICS_API}"]
    missing = [name for name in ("update", "compute") if not callable(getattr(made, name, None))]
    directions = getattr(made, "higher_is_better", None)
    if not isinstance(directions, dict) or not directions or not all(
            isinstance(k, str) and isinstance(v, bool) for k, v in directions.items()):
        missing.append("higher_is_better (a non-empty {metric name: bool})")
    if missing:
        return {}, [f"{key}={path!r} lacks {', '.join(missing)}: give {METRICS_API}"]
    return dict(directions), []


def check_gns(gns: GnsConfig) -> List[str]:
    problems: List[str] = []
    check_rule(problems, "gns.ema_beta", gns.ema_beta, lambda b: 0 <= b < 1, "must be in [0, 1), e.g. 0.9")
    check_rule(problems, "gns.every_steps", gns.every_steps, is_positive, "must be >= 1 (1: every step)")
    return problems


def check_divergence(divergence: DivergenceConfig) -> List[str]:
    problems: List[str] = []
    check_rule(problems, "divergence.spike_factor", divergence.spike_factor, lambda f: f > 1, "must be > 1, e.g. 2")
    for key in ("spike_steps", "spike_window", "recover_steps"):
        check_rule(problems, f"divergence.{key}", getattr(divergence, key), is_positive, "must be >= 1")
    if divergence.confidence is not None:
        check_rule(problems, "divergence.confidence", divergence.confidence, lambda c: 0.5 <= c < 1,
               "must be a level in [0.5, 1), e.g. 0.95, or null (report.confidence)")
    return problems


def check_measure(measure: MeasureConfig) -> List[str]:
    problems: List[str] = []
    check_rule(
        problems, "measure.warmup_steps", measure.warmup_steps, lambda n: n >= 2,
        "must be >= 2 (the first step builds the optimizer state, the last warm-up step is the one whose "
        "memory is broken down)",
    )
    for key in ("windows", "stable_windows", "stability_tolerance", "utilization_interval_seconds", "profile_steps"):
        check_rule(problems, f"measure.{key}", getattr(measure, key), is_positive, "must be positive")
    if 0 < measure.windows < measure.stable_windows:
        problems.append(
            f"measure.windows={measure.windows} is fewer than measure.stable_windows={measure.stable_windows}: "
            "the stability rule could never be met; raise measure.windows or lower measure.stable_windows"
        )
    return problems
