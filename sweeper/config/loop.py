"""Training that is yours, swept as it is: the `loop` section (loop.fn: a training loop of your own, run on every
worker with the small API of sweeper.loop) and the rules for it and for model=lightning (a LightningModule and
LightningDataModule run by Lightning's own Trainer): what sweeper's own machinery would otherwise do that they
do themselves, refused in one line each. Pure: reads the whole config duck-typed (config/__init__.py imports
this module, so this module cannot import its SweeperConfig).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from sweeper.config.workload import check_factory

# loop.metrics: which way each evaluation metric your loop reports is better.
DIRECTIONS = ("higher", "lower")
LIGHTNING = "lightning"  # model=lightning's model.name


@dataclass
class LoopConfig:
    # Import path of your training loop, fn(config), run on every worker of every point, as Ray Train runs a
    # train_loop_per_worker: `config` holds the point's layout (micro_batch_size, accumulation_steps,
    # num_workers, parallelism, precision, lr, seed, the budget as steps and samples, epochs: the passes
    # the prepared loader makes) and loop.kwargs; sweeper.loop.prepare(model, optimizer, loader) wraps the
    # model and streams the point's samples (docs/your-training.md). Needs train.samples. null: sweeper's
    # own loop.
    fn: Optional[str] = None
    # Your settings, passed in `config` beside the point's (Ray Train's train_loop_config).
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # Which way each evaluation metric your loop reports (sweeper.loop.report between the loader's passes)
    # is better, {name: higher | lower}, so report.quality_metric may judge by it. val_accuracy and val_loss
    # need none.
    metrics: Dict[str, str] = field(default_factory=dict)


def yours(cfg: Any) -> Optional[str]:
    """What makes the training yours, as a key to name in a problem (loop.fn=..., model=lightning); None for
    sweeper's own loop."""
    if cfg.loop.fn:
        return f"loop.fn={cfg.loop.fn}"
    if cfg.model.name == LIGHTNING:
        return "model=lightning"
    return None


def check_yours(cfg: Any) -> List[str]:
    """Every problem of a sweep whose training is yours (loop.fn, model=lightning); [] for sweeper's own."""
    problems = _lightning_keys(cfg)
    said = yours(cfg)
    if said is None:
        return problems
    if cfg.loop.fn and cfg.model.name == LIGHTNING:
        return problems + ["loop.fn with model=lightning: Lightning's Trainer runs the LightningModule's own loop; "
                           "drop one of them"]
    if cfg.loop.fn:
        problems += check_factory("loop.fn", cfg.loop.fn, "nothing (your training loop, fn(config))")
    problems += [f"loop.metrics.{name}={way!r}: give higher or lower" for name, way in cfg.loop.metrics.items()
                 if way not in DIRECTIONS]
    if cfg.train.samples is None:
        problems.append(f"{said} with train.samples=null: your data is your own, so the budget is given in samples; "
                        "set train.samples, e.g. train.samples=4096")
    if cfg.train.step_fn:
        problems.append(f"{said} with train.step_fn={cfg.train.step_fn}: the step is your loop's; drop train.step_fn")
    for key, value in (("data.collate_fn", cfg.data.collate_fn), ("data.samples_fn", cfg.data.samples_fn)):
        if value:
            problems.append(f"{said} with {key}={value}: your DataLoader brings its own collate_fn; drop {key}")
    return problems + _strategy_problems(cfg, said) + (_lightning_problems(cfg) if not cfg.loop.fn else [])


def _strategy_problems(cfg: Any, said: str) -> List[str]:
    """What continues or saves a training state, which your loop's state cannot yet be (sweeper.loop has no
    state_dict to save and load), and the frontier search's probes of sweeper's own model."""
    problems: List[str] = []
    if cfg.sweep.strategy != "grid":
        problems.append(f"{said} with sweep.strategy={cfg.sweep.strategy}: its runs continue saved training "
                        "states, which a loop of yours cannot hand over yet; use sweep.strategy=grid")
    saving = [key for key, on in (("train.save_state", cfg.train.save_state),
                                  ("train.start_from", cfg.train.start_from),
                                  ("train.batch_schedule", cfg.train.batch_schedule),
                                  ("cluster.checkpoint_every_steps", cfg.cluster.checkpoint_every_steps)) if on]
    if saving:
        problems.append(f"{said} with {', '.join(saving)}: a loop of yours cannot save or continue a training "
                        "state yet; set them to their defaults")
    if cfg.sweep.micro_batch_sizes == "auto":
        problems.append(f"{said} with sweep.micro_batch_sizes=auto: the frontier search probes sweeper's own model; "
                        "list the micro-batches")
    if cfg.task != "train":
        problems.append(f"{said} with task={cfg.task}: your loop trains; use task=train")
    if cfg.loop.fn and isinstance(cfg.sweep.parallelism, list) and "zero1" in cfg.sweep.parallelism:
        # zero1 replaces the optimizer (ZeroRedundancyOptimizer), which your loop built and may schedule itself
        problems.append(f"{said} with sweep.parallelism=zero1: your loop's optimizer is not split per rank; "
                        "use ddp or zero2")
    return problems


def _lightning_keys(cfg: Any) -> List[str]:
    """model.module and data.datamodule belong to model=lightning, which needs both."""
    lightning = cfg.model.name == LIGHTNING
    problems: List[str] = []
    if cfg.model.module and not lightning:
        problems.append(f"model.module={cfg.model.module} is a LightningModule: use model=lightning, or drop it")
    if cfg.data.datamodule and not lightning:
        problems.append(f"data.datamodule={cfg.data.datamodule} is a LightningDataModule: use model=lightning "
                        "data=lightning, or drop it")
    if not lightning:
        return problems
    if cfg.data.name != LIGHTNING:
        problems.append(f"model=lightning with data={cfg.data.name}: Lightning trains on your LightningDataModule; "
                        "add data=lightning data.datamodule=<its import path>")
    for key, path, what in (("model.module", cfg.model.module, "a LightningModule"),
                            ("data.datamodule", cfg.data.datamodule, "a LightningDataModule")):
        if not path:
            problems.append(f"model=lightning needs {key}: the import path of {what} class (or factory)")
        else:
            problems += check_factory(key, path, what)
    return problems


def _lightning_problems(cfg: Any) -> List[str]:
    """What Lightning's Trainer does its own way here: the LightningModule's configure_optimizers gives the
    optimizer and its schedule; sharding, checkpointing and compilation are the module's or the strategy's."""
    problems: List[str] = []
    sharded = [p for p in cfg.sweep.parallelism if p != "ddp"] if isinstance(cfg.sweep.parallelism, list) else []
    if sharded:
        problems.append(f"model=lightning with sweep.parallelism={sharded[0]}: sharded points are not run under "
                        "Lightning's ModelParallelStrategy yet; use sweep.parallelism=[ddp]")
    if isinstance(cfg.sweep.activation_checkpointing, list) and "blocks" in cfg.sweep.activation_checkpointing:
        problems.append("model=lightning with sweep.activation_checkpointing=blocks: checkpoint inside your "
                        "LightningModule; use sweep.activation_checkpointing=[none]")
    if cfg.train.compile:
        problems.append("model=lightning with train.compile=true: compile inside your LightningModule; "
                        "set train.compile=false")
    if cfg.train.lr_schedule != "constant" or cfg.train.warmup_steps:
        problems.append("model=lightning with train.lr_schedule / train.warmup_steps: configure_optimizers gives "
                        "the schedule; set train.lr_schedule=constant train.warmup_steps=0")
    return problems
