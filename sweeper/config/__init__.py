"""Typed, validated configuration: the schema Hydra's YAML fills, and one checker per section run before any
point. Everything after `load()` works with these dataclasses, never with a `DictConfig`.

One module per section, each holding its fields' defaults (once) and its checks: sweep.py (sweep and the
strategies: smart, branch, frontier), training.py (optim, loss, train, eval, divergence, gns, measure),
workload.py (model, data, inference; each built-in model's own fields: model_sections.py), runtime.py (device,
cluster, tracking), report.py, loop.py (your own loop, model=lightning). This module composes them (SweeperConfig),
loads Hydra's config (`load`) and checks what spans sections. Imports only the standard library, Hydra, OmegaConf
and sweeper.errors/plan: every other package reads the config, so it imports none of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, List

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sweeper.config import report as settings
from sweeper.config.report import ReportConfig, invalid_choice
from sweeper.config.workload import check_model_data
from sweeper.errors import ConfigError, first_line

# Each section's module owns its fields and checks; they are re-exported here, so callers write
# `from sweeper.config import ModelConfig` whichever module holds it.
from sweeper.config.sweep import (
    STRATEGIES, SweepConfig, SmartConfig, BranchConfig, FrontierConfig, check_sweep, check_branch, check_smart,
    check_frontier, parallelism_problems,
)
from sweeper.config.training import (
    OPTIMIZERS, PRECISIONS, CHECKPOINTING, OptimConfig, LossConfig, TrainConfig, EvalConfig, DivergenceConfig,
    GnsConfig, MeasureConfig, check_optim, check_loss, check_train, check_eval, check_gns, check_divergence,
    check_measure, metrics_problems,
)
from sweeper.config.workload import (
    BYTE_VOCAB, LANGUAGE_MODELS, TOKEN_DATA, MAX_SAMPLE_BYTES, DIGITS_SAMPLES, ModelConfig, DataConfig,
    InferenceConfig, check_data, check_model, check_inference, is_language_model, is_token_data, sample_bytes,
    check_factory,
)
from sweeper.config.loop import LoopConfig, check_yours, yours
from sweeper.config.runtime import (
    USE_GPU_CHOICES, PLACEMENT_STRATEGIES, DeviceConfig, TrackingConfig, ClusterConfig, normalize_use_gpu,
    normalize_batch_coupled, check_device, check_tracking, check_cluster, physical_memory_bytes, is_auto,
    budget_bytes, tracking_uri,
)


TASKS = ("train", "inference")


# Keys that moved when the optimizer became a config group: their old names get a pointer.
MOVED_KEYS = {"train.lr": "optim.lr", "train.momentum": "optim.momentum", "train.weight_decay": "optim.weight_decay"}


# sweep.micro_batch_sizes=auto searches under a memory budget; a CPU has no device memory to read one
# from. Checked here for use_gpu=false, and by the driver once it knows a Ray cluster has no GPU.
AUTO_NEEDS_BUDGET = (
    "sweep.micro_batch_sizes=auto on CPU needs device.memory_budget_gb: the memory to plan for, "
    "e.g. device.memory_budget_gb=16 for a 16 GB card"
)


@dataclass
class SweeperConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    frontier: FrontierConfig = field(default_factory=FrontierConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    gns: GnsConfig = field(default_factory=GnsConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    smart: SmartConfig = field(default_factory=SmartConfig)
    branch: BranchConfig = field(default_factory=BranchConfig)
    # Lives with its rules in sweeper/config/report.py.
    report: ReportConfig = field(default_factory=ReportConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    # Your own training loop (loop.fn), swept as it is: sweeper/config/loop.py.
    loop: LoopConfig = field(default_factory=LoopConfig)
    # train: the micro-batch x accumulation x workers sweep; inference: latency and throughput per
    # inference batch size, with the roofline's predicted knee.
    task: str = "train"
    # A torch.profiler trace of a few steps of every trial, logged to MLflow (TensorBoard/Perfetto).
    profile: bool = False


# (section, key) of the list settings that also take one integer (see SweepConfig).
LIST_KEYS = (
    ("sweep", "micro_batch_sizes"),
    ("sweep", "accumulation_steps"),
    ("sweep", "num_workers"),
    ("sweep", "global_batch_sizes"),
    ("inference", "batch_sizes"),
    ("inference", "mlp_widths"),
    ("sweep", "seeds"),
    ("sweep", "lr_multipliers"),
    ("sweep", "context_lengths"),
    ("inference", "contexts"),
)


def register() -> None:
    """Register the schema so `conf/config.yaml` can list `sweeper_schema` first in its defaults."""
    ConfigStore.instance().store(name="sweeper_schema", node=SweeperConfig)


def to_typed(cfg: DictConfig) -> SweeperConfig:
    """The composed Hydra config as typed objects (types checked by OmegaConf, values not yet); a
    ConfigError naming the key when OmegaConf rejects it (a value left ???, a wrong type)."""
    try:
        typed = OmegaConf.to_object(cfg)
        if not isinstance(typed, SweeperConfig):  # composed without the schema (e.g. a bare compose)
            typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SweeperConfig), cfg))
    except OmegaConfBaseException as exc:
        raise ConfigError([conversion_problem(exc)]) from exc
    typed.cluster.use_gpu = normalize_use_gpu(typed.cluster.use_gpu)
    if is_language_model(typed.model):  # one home for the sequence length
        typed.model.input_shape = [typed.model.context]
    if is_token_data(typed.data):  # and for the vocabulary
        typed.data.num_classes = BYTE_VOCAB if typed.data.name == "text" else (typed.data.vocab_size or 0)
    for section, key in LIST_KEYS:
        value = getattr(getattr(typed, section), key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(getattr(typed, section), key, [value])
    for key in ("precisions", "activation_checkpointing"):
        if isinstance(getattr(typed.sweep, key), str) and not is_auto(getattr(typed.sweep, key)):
            setattr(typed.sweep, key, [getattr(typed.sweep, key)])
    if typed.loop.fn:  # the model and the data are the loop's own: the sweep's labels say so
        typed.model.name, typed.data.name = "loop", "loop"
    if typed.divergence.confidence is None:  # the worker judges did_not_learn at the report's level
        typed.divergence.confidence = typed.report.confidence
    return typed


def load(cfg: DictConfig) -> SweeperConfig:
    """Typed and validated (raises ConfigError with every problem of the plain values)."""
    typed = to_typed(cfg)
    problems = validate(typed)
    if problems:
        raise ConfigError(problems)
    return typed


def conversion_problem(exc: BaseException) -> str:
    """One line for Hydra's or OmegaConf's own rejection of the config (an unknown key or option, a
    wrong type, a value left ???, an override that does not parse), naming the key where it can."""
    options = getattr(exc, "options", None)  # hydra's MissingConfigException: an unknown group option
    if options:
        missing = first_line(exc).removeprefix("In 'config': ")  # Could not find 'model/nope'
        return f"{missing}: use one of {', '.join(options)}"
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    moved = MOVED_KEYS.get(getattr(cause, "full_key", None))
    if moved:
        return (f"{cause.full_key} moved to {moved} (the optimizer is a config group: optim=sgd | adamw | custom); "
                f"use {moved}")
    if getattr(cause, "full_key", None):
        return f"{cause.full_key}: {first_line(cause)}; fix the override (python -m sweeper --cfg job shows every key)"
    override = getattr(exc, "override", None)  # hydra's OverrideParseException
    lines = [line.strip() for line in str(exc).split("Config search path:")[0].splitlines() if line.strip()]
    text = " ".join(lines) or type(exc).__name__
    return f"{override}: {text}" if override else text


def validate(cfg: SweeperConfig) -> List[str]:
    """Every problem with the plain values of the config, section by section, then the rules that
    join two sections; model/data/cluster reachability are checked by their own modules."""
    local_cpus = os.cpu_count() if cfg.cluster.address is None else None
    return [
        *check_task(cfg.task),
        *check_sweep(cfg.sweep),
        *check_train(cfg.train),
        *check_optim(cfg.optim),
        *check_loss(cfg.loss),
        *check_eval(cfg.eval),
        *check_divergence(cfg.divergence),
        *check_gns(cfg.gns),
        *check_measure(cfg.measure),
        *check_smart(cfg.smart),
        *check_branch(cfg.branch),
        *check_device(cfg.device),
        *check_frontier(cfg.frontier),
        *check_report(cfg.report),
        *check_tracking(cfg.tracking),
        *check_cluster(cfg.cluster),
        *check_data(cfg.data, local_cpus),
        *check_model(cfg.model),
        *check_inference(cfg.inference),
        *check_yours(cfg),
        *check_combinations(cfg),
    ]


def check_task(task: str) -> List[str]:
    problem = invalid_choice("task", task, TASKS)
    return [problem] if problem else []


def check_report(report: ReportConfig, key: Callable[[str], str] = lambda name: f"report.{name}") -> List[str]:
    """The report's settings, by the rules `recommend()` and `python -m sweeper.report` share."""
    return settings.check(report, key)


def check_combinations(cfg: SweeperConfig) -> List[str]:
    """Rules that join two sections."""
    problems: List[str] = []
    if is_auto(cfg.sweep.micro_batch_sizes) and cfg.device.memory_budget_gb is None and cfg.cluster.use_gpu == "false":
        problems.append(AUTO_NEEDS_BUDGET)
    workers = cfg.sweep.num_workers if isinstance(cfg.sweep.num_workers, list) else []
    ddp = any(isinstance(w, int) and w > 1 for w in workers)
    if cfg.measure.warmup_steps == 2 and cfg.measure.memory_breakdown and ddp:
        problems.append(
            "measure.warmup_steps=2: with more than one worker the memory-tracked (last warm-up) "
            "step would be the one where DDP rebuilds its gradient buckets; use >= 3, or set "
            "measure.memory_breakdown=false"
        )
    if cfg.inference.mlp_widths is not None and (cfg.model.name != "mlp" or cfg.model._target_):
        problems.append(
            f"inference.mlp_widths={cfg.inference.mlp_widths!r} needs model=mlp (model is "
            f"{cfg.model.name!r}); set it to null for other models"
        )
    target = settings.target_problem(cfg.report.objective, cfg.eval.target_accuracy, cfg.eval.target_loss)
    problems += [target] if target else []
    problems += _check_contexts(cfg)
    problems += parallelism_problems(cfg.sweep, cfg.train.compile, cfg.gns.enabled, cfg.train.batch_schedule,
                                     cfg.cluster.placement_strategy)
    strategy = cfg.sweep.strategy
    if strategy in ("smart", "branch") and (cfg.train.save_state or cfg.train.start_from or cfg.train.batch_schedule):
        problems.append(f"train.save_state / train.start_from / train.batch_schedule with sweep.strategy={strategy}: "
                        "its measurement runs save and continue training states of their own; use "
                        "sweep.strategy=grid")
    if strategy == "branch":
        problems += _branch_problems(cfg)
    if cfg.train.batch_schedule and cfg.train.start_from:
        problems.append("train.batch_schedule with train.start_from: a schedule starts from sample 0; drop one of them")
    problems += _saves_on_the_way_problems(cfg)
    judged, other = ("quality_metric", "null") if cfg.report.quality_metric else ("quality", "auto")
    if getattr(cfg.report, judged) == "val_bits_per_byte" and not (is_token_data(cfg.data) and cfg.data.name == "text"):
        problems.append(f"report.{judged}=val_bits_per_byte needs byte-level text (data=text), not "
                        f"data={cfg.data.name}: use report.{judged}=val_loss (nats per token) or {other}")
    if cfg.report.run_tokens is not None and not is_language_model(cfg.model):
        problems.append(f"report.run_tokens={cfg.report.run_tokens} needs a language model (model=gpt or hf), not "
                        f"model={cfg.model.name}: give the run in samples, report.run_samples")
    return problems + _quality_metric_problems(cfg) + check_model_data(cfg.model, cfg.data)


def _quality_metric_problems(cfg: SweeperConfig) -> List[str]:
    """report.quality_metric must name a metric the sweep records: a built-in quality, or one that
    eval.metrics_fn declares (its class is made once to read them; its own problems are eval's)."""
    named = cfg.report.quality_metric
    if not isinstance(named, str) or not named.strip() or named in settings.QUALITY_CHOICES[1:]:
        return []
    recorded = ", ".join(settings.QUALITY_CHOICES[1:])
    if not cfg.eval.metrics_fn:
        return [f"report.quality_metric={named} is not a metric this sweep records (eval.metrics_fn is null, so it "
                f"records {recorded}): set eval.metrics_fn to a metrics class that computes {named}, or "
                "report.quality_metric=null"]
    declared, problems = metrics_problems(cfg.eval.metrics_fn)
    if problems or named in declared:
        return []
    return [f"report.quality_metric={named} is not a metric eval.metrics_fn={cfg.eval.metrics_fn} declares "
            f"(its higher_is_better has {', '.join(sorted(declared))}; built-in: {recorded}): name one of them"]


def _branch_problems(cfg: SweeperConfig) -> List[str]:
    """sweep.strategy=branch measures one trunk per seed and branches at the grid's global batches: the LR
    follows branch.lr_scaling, not multipliers; one context; a grid whose micro-batches are listed."""
    problems: List[str] = []
    multipliers = cfg.sweep.lr_multipliers
    if isinstance(multipliers, list) and [float(m) for m in multipliers if isinstance(m, (int, float))] != [1.0]:
        problems.append(f"sweep.lr_multipliers={multipliers} with sweep.strategy=branch: a branch's LR follows its "
                        "global batch by branch.lr_scaling; set sweep.lr_multipliers=[1]")
    contexts = cfg.sweep.context_lengths
    if isinstance(contexts, list) and len(contexts) > 1:
        problems.append(f"sweep.context_lengths={contexts} with sweep.strategy=branch: one trunk trains at one "
                        "context; run one sweep per context")
    if cfg.sweep.micro_batch_sizes == "auto":
        problems.append("sweep.micro_batch_sizes=auto with sweep.strategy=branch: list the micro-batches "
                        "(the frontier search's grid is not branched yet)")
    if cfg.task != "train":
        problems.append(f"sweep.strategy=branch with task={cfg.task}: branching measures training; use task=train")
    return problems


def _check_contexts(cfg: SweeperConfig) -> List[str]:
    """sweep.context_lengths (training) and inference.contexts (decode) are a language model's axes, each
    context within its position table; decode with a KV cache is sweeper's GPT's."""
    problems: List[str] = []
    for key, lengths in (("sweep.context_lengths", cfg.sweep.context_lengths),
                         ("inference.contexts", cfg.inference.contexts if cfg.task == "inference" else None)):
        if lengths is None or not isinstance(lengths, list) or not all(isinstance(n, int) for n in lengths):
            continue  # check_sweep's / check_inference's problems
        if not is_language_model(cfg.model):
            problems.append(f"{key}={lengths}: model={cfg.model.name} has no context; it is an axis of a "
                            "language model (model=gpt), so remove it")
            continue
        above = [n for n in lengths if n > cfg.model.context]
        if above:
            problems.append(f"{key} has {', '.join(map(str, above))}, above model.context={cfg.model.context} "
                            f"(the model's position table): raise model.context to {max(above)} or drop "
                            f"{'it' if len(above) == 1 else 'them'}")
    if cfg.task == "inference" and is_language_model(cfg.model) and cfg.model.name != "gpt":
        problems.append(f"task=inference with model={cfg.model.name}: decode with a KV cache is measured for "
                        "sweeper's GPT (model=gpt); time a transformers model's training instead (task=train)")
    return problems


def _saves_on_the_way_problems(cfg: "SweeperConfig") -> List[str]:
    """cluster.checkpoint_every_steps: a grid point's saves on the way, continued by the same point retried."""
    every, problems = cfg.cluster.checkpoint_every_steps, []
    if every is None:
        return problems
    others = [key for key, on in (("sweep.strategy=" + cfg.sweep.strategy, cfg.sweep.strategy != "grid"),
                                  ("train.start_from", bool(cfg.train.start_from)),
                                  ("train.batch_schedule", bool(cfg.train.batch_schedule))) if on]
    if others:
        problems.append(f"cluster.checkpoint_every_steps={every} with {', '.join(others)}: saves on the way are "
                        "built for a grid point trained from step 0 in one span; set it to null")
    if cfg.cluster.storage_path and "://" in cfg.cluster.storage_path:
        problems.append(f"cluster.checkpoint_every_steps={every} with cluster.storage_path={cfg.cluster.storage_path}: "
                        "saves on the way go to a folder every node reads (an NFS mount); a URI is uploaded only "
                        "at a point's end: use a mounted folder, or null")
    return problems
