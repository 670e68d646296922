"""Typed, validated configuration: the schema Hydra's YAML fills, and the checks run before any trial.

Everything after `load()` works with these dataclasses, never with a `DictConfig`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from sweeper.errors import ConfigError, first_line

LR_SCALING_RULES = ("none", "linear", "sqrt")
USE_GPU_CHOICES = ("auto", "true", "false")
REPORT_OBJECTIVES = ("throughput", "accuracy", "time_to_accuracy")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
TASKS = ("train", "inference")


@dataclass
class ModelConfig:
    # A torchvision classification model name (resnet18, mobilenet_v3_small, ...), "mlp",
    # or any label when `_target_` names your own factory.
    name: str = MISSING
    # Import path of a factory returning an nn.Module, Hydra `_target_` style; called with
    # `kwargs`, plus `num_classes` if the factory accepts it and `kwargs` does not set it.
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # The shape of one sample the model consumes; the dataset is resized to it.
    input_shape: List[int] = field(default_factory=lambda: [3, 32, 32])
    # MLP only (seed 003's MLP is depth 8, width 1024).
    depth: int = 8
    width: int = 1024


@dataclass
class DataConfig:
    # digits | cifar10 | synthetic, or any label when `_target_` names your own factory.
    name: str = MISSING
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    num_classes: int = 10
    # cifar10: torchvision's on-disk layout under `root`.
    root: str = "data"
    download: bool = False
    # cifar10: check the archive's MD5 sums as torchvision does; false accepts any files in
    # CIFAR-10's on-disk format (a re-pickled or reduced copy, or the tests' tiny archive).
    verify_checksums: bool = True
    # digits / synthetic: the held-out share used for validation accuracy.
    val_fraction: float = 0.2
    # synthetic: how many random samples.
    num_samples: int = 2048
    # torch DataLoader worker processes per training worker.
    loader_workers: int = 0


@dataclass
class SweepConfig:
    # A list of sizes, or "auto": the memory frontier search (see `frontier`) finds the largest
    # micro-batch that fits device.memory_budget_gb for each worker count, and the grid is built
    # from it (with global_batch_sizes: each global batch with the fewest accumulation steps).
    micro_batch_sizes: Any = field(default_factory=lambda: [32, 64])
    accumulation_steps: List[int] = field(default_factory=lambda: [1, 2])
    num_workers: List[int] = field(default_factory=lambda: [1])
    # Keep only grid points whose micro x accumulation x workers is one of these.
    global_batch_sizes: Optional[List[int]] = None
    # Trials (worker groups) running at once. null: one per node that holds a whole trial (each sized
    # to fill its node), so co-located trials never distort each other's throughput.
    max_concurrent_trials: Optional[int] = None
    # Grid points are measured one after another in one Ray Train worker group (one Ray Tune trial)
    # sized to the largest point, so worker start-up (process spawn, torch import, process group
    # init) is paid once per group instead of once per point. null: one group for the whole grid;
    # N: groups of at most N points; 1: a fresh worker group for every point (slowest, most isolated).
    points_per_worker_group: Optional[int] = None
    # Finish the latest interrupted sweep (same config): Ray Tune restores its experiment, points
    # already recorded in MLflow are not measured again, and results go to the same parent run.
    resume: bool = False


@dataclass
class InferenceConfig:
    # task=inference: batch sizes timed under torch.inference_mode(), smallest first.
    batch_sizes: List[int] = field(default_factory=lambda: [2**i for i in range(10)])
    # Untimed runs first; then timing goes on until both timed_runs and min_timed_seconds are reached.
    warmup_runs: int = 10
    timed_runs: int = 100
    min_timed_seconds: float = 0.5
    # model=mlp only: also sweep the width (seed 003's experiment: 256..4096); null: model.width.
    mlp_widths: Optional[List[int]] = None


@dataclass
class DeviceConfig:
    # GiB each worker's training step may hold. GPU: enforced for real with
    # torch.cuda.set_per_process_memory_fraction. CPU: simulated against the step's tracked peak
    # tensor memory (the memory-tracked last warm-up step), so a sweep here plans for a 16 or 24 GB
    # card; the op that would cross it raises an out-of-memory error, as an allocator does.
    # null: no budget (a GPU's whole memory).
    memory_budget_gb: Optional[float] = None


@dataclass
class FrontierConfig:
    # sweep.micro_batch_sizes=auto: fit probes at first_probe and first_probe x growth (a third near
    # the frontier if the line would extrapolate far), then verify the predicted frontier.
    first_probe: int = 8
    growth: int = 4
    max_fit_probes: int = 3
    max_verifications: int = 3
    # Round the frontier down to a multiple (8 suits tensor cores).
    multiple_of: int = 1


@dataclass
class TrainConfig:
    epochs: int = 1
    lr: float = 0.05
    lr_scaling: str = "none"
    base_batch_size: int = 32
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0
    # Before validation, BatchNorm running statistics are re-estimated over this many training
    # samples (torch.optim.swa_utils.update_bn), so val_accuracy judges the trained weights and
    # not how many running-average updates a layout took (0: keep the statistics as trained).
    bn_recalibration_samples: int = 1024


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


@dataclass
class ReportConfig:
    # What "best" means: throughput | accuracy | time_to_accuracy (needs min_accuracy).
    objective: str = "throughput"
    # Trials under this validation accuracy are not recommended (null: no minimum).
    min_accuracy: Optional[float] = None
    # Objectives throughput and time_to_accuracy: trials whose validation accuracy is more than this
    # below the best trial's are not recommended, so a fast layout that learns less never wins
    # (a fraction: 0.02 is 2 points; null: the objective alone decides).
    max_accuracy_drop: Optional[float] = 0.02
    # Trials whose peak_memory_bytes exceeds this are not recommended (null: no budget).
    memory_budget_gb: Optional[float] = None
    # The knee of a throughput curve: the first micro-batch after which doubling gains less.
    knee_min_gain: float = 0.10


@dataclass
class TrackingConfig:
    # null: a SQLite store `mlflow.db` in the working directory.
    uri: Optional[str] = None
    experiment_name: str = "sweeper"


@dataclass
class ClusterConfig:
    # null: start a local Ray; "auto" or "host:port": join an existing cluster (the driver runs on one
    # of its nodes; Ray Client's ray:// is refused, see validate).
    address: Optional[str] = None
    # auto | true | false
    use_gpu: Any = "auto"
    # null: split the machine's CPUs between the largest trial's workers.
    cpus_per_worker: Optional[float] = None
    # CPUs reserved by each trial's own driver (it only waits on its workers).
    cpus_per_trial: float = 0.01
    # Local Ray only: how many CPUs it may use (null: all of this machine's).
    num_cpus: Optional[int] = None
    # Ray's results and the local cluster's auth token go here, not into your home directory.
    ray_dir: str = ".sweeper/ray"
    include_dashboard: bool = True
    dashboard_port: int = 8265
    # Where a trial's workers go (Ray placement groups): PACK (fewest nodes, the default), SPREAD
    # (across nodes), STRICT_PACK (all on one node, or wait), STRICT_SPREAD (one node each, or wait).
    placement_strategy: str = "PACK"
    # A worker group whose process dies (a node lost, a worker killed) is restarted this many times;
    # points it had measured are not measured again.
    max_failures: int = 3


@dataclass
class SweeperConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    frontier: FrontierConfig = field(default_factory=FrontierConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    # train: the micro-batch x accumulation x workers sweep; inference: latency and throughput per
    # inference batch size, with the roofline's predicted knee.
    task: str = "train"
    # A torch.profiler trace of a few steps of every trial, logged to MLflow (TensorBoard/Perfetto).
    profile: bool = False


def register() -> None:
    """Register the schema so `conf/config.yaml` can list `sweeper_schema` first in its defaults."""
    ConfigStore.instance().store(name="sweeper_schema", node=SweeperConfig)


def to_typed(cfg: DictConfig) -> SweeperConfig:
    """The composed Hydra config as typed objects (types checked by OmegaConf, values not yet)."""
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, SweeperConfig):  # composed without the schema (e.g. a bare compose)
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SweeperConfig), cfg))
    typed.cluster.use_gpu = normalize_use_gpu(typed.cluster.use_gpu)
    return typed


def load(cfg: DictConfig) -> SweeperConfig:
    """Typed and validated (raises ConfigError with every problem of the plain values)."""
    typed = to_typed(cfg)
    problems = validate(typed)
    if problems:
        raise ConfigError(problems)
    return typed


def normalize_use_gpu(value: Any) -> str:
    return str(value).strip().lower()


def check_report(report: "ReportConfig", key: Callable[[str], str] = lambda name: f"report.{name}") -> List[str]:
    """Every problem with the report's settings, each naming the setting by `key(field name)`: the
    sweep's `report.*` by default, `python -m sweeper.report` passes its option names."""
    problems: List[str] = []
    if report.objective not in REPORT_OBJECTIVES:
        problems.append(
            f"{key('objective')}={report.objective!r} is invalid: use one of {', '.join(REPORT_OBJECTIVES)}"
        )
    elif report.objective == "time_to_accuracy" and report.min_accuracy is None:
        problems.append(
            f"{key('objective')}=time_to_accuracy needs {key('min_accuracy')} (the accuracy to reach), "
            f"e.g. {key('min_accuracy')}=0.9"
        )
    if report.min_accuracy is not None and not (0.0 <= report.min_accuracy <= 1.0):
        problems.append(f"{key('min_accuracy')}={report.min_accuracy}: must be between 0 and 1, or null")
    if report.max_accuracy_drop is not None and not (0.0 <= report.max_accuracy_drop <= 1.0):
        problems.append(
            f"{key('max_accuracy_drop')}={report.max_accuracy_drop}: must be between 0 and 1 (0.02 is 2 points "
            "of accuracy), or null"
        )
    if report.memory_budget_gb is not None and report.memory_budget_gb <= 0:
        problems.append(f"{key('memory_budget_gb')}={report.memory_budget_gb}: must be positive, or null")
    if not (0.0 < report.knee_min_gain < 1.0):
        problems.append(f"{key('knee_min_gain')}={report.knee_min_gain}: must be between 0 and 1, e.g. 0.1")
    return problems


def validate(cfg: SweeperConfig) -> List[str]:
    """Every problem with the plain values of the config; model/data/cluster reachability are checked
    by their own modules."""
    problems: List[str] = []
    if cfg.task not in TASKS:
        problems.append(f"task={cfg.task!r} is invalid: use one of {', '.join(TASKS)}")
    inference = cfg.inference
    if not inference.batch_sizes or any(b <= 0 for b in inference.batch_sizes):
        problems.append(
            f"inference.batch_sizes={list(inference.batch_sizes)}: give positive batch sizes, e.g. [1,2,4,8]"
        )
    for key in ("timed_runs",):
        if getattr(inference, key) < 1:
            problems.append(f"inference.{key}={getattr(inference, key)}: must be >= 1")
    if inference.warmup_runs < 0 or inference.min_timed_seconds < 0:
        problems.append("inference.warmup_runs and inference.min_timed_seconds must be >= 0")
    if inference.mlp_widths is not None:
        if cfg.model.name != "mlp" or cfg.model._target_:
            problems.append(
                f"inference.mlp_widths={list(inference.mlp_widths)} needs model=mlp (model is "
                f"{cfg.model.name!r}); set it to null for other models"
            )
        if not inference.mlp_widths or any(w <= 0 for w in inference.mlp_widths):
            problems.append(f"inference.mlp_widths={list(inference.mlp_widths)}: give positive widths, or null")
    sweep, train = cfg.sweep, cfg.train

    keys = ["accumulation_steps", "num_workers"]
    if is_auto(sweep.micro_batch_sizes):
        if cfg.device.memory_budget_gb is None and cfg.cluster.use_gpu == "false":
            problems.append(
                "sweep.micro_batch_sizes=auto on CPU needs device.memory_budget_gb: the memory to plan "
                "for, e.g. device.memory_budget_gb=16 for a 16 GB card"
            )
    elif isinstance(sweep.micro_batch_sizes, str) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in sweep.micro_batch_sizes
    ):
        problems.append(
            f"sweep.micro_batch_sizes={sweep.micro_batch_sizes!r} is invalid: give a list of positive "
            "integers, e.g. [32,64], or auto"
        )
    else:
        keys.insert(0, "micro_batch_sizes")
    for key in keys:
        values = getattr(sweep, key)
        if not values:
            problems.append(f"sweep.{key}=[] is empty: give at least one value, e.g. sweep.{key}=[1]")
        for v in values:
            if v <= 0:
                problems.append(
                    f"sweep.{key} contains {v}: every value must be a positive integer; remove or fix it"
                )
    if sweep.global_batch_sizes is not None:
        if not sweep.global_batch_sizes:
            problems.append(
                "sweep.global_batch_sizes=[] keeps nothing: set it to null to keep the whole grid"
            )
        for v in sweep.global_batch_sizes:
            if v <= 0:
                problems.append(
                    f"sweep.global_batch_sizes contains {v}: global batch sizes must be positive"
                )
    if cfg.device.memory_budget_gb is not None and cfg.device.memory_budget_gb <= 0:
        problems.append(
            f"device.memory_budget_gb={cfg.device.memory_budget_gb}: must be positive (GiB), or null for no budget"
        )
    for key in ("first_probe", "growth", "max_verifications", "multiple_of"):
        if getattr(cfg.frontier, key) < 1:
            problems.append(f"frontier.{key}={getattr(cfg.frontier, key)}: must be >= 1")
    if cfg.frontier.max_fit_probes < 2:
        problems.append(f"frontier.max_fit_probes={cfg.frontier.max_fit_probes}: a line needs two probes, use >= 2")
    if sweep.max_concurrent_trials is not None and sweep.max_concurrent_trials <= 0:
        problems.append(
            f"sweep.max_concurrent_trials={sweep.max_concurrent_trials}: must be >= 1"
        )

    positive = {
        "train.epochs": train.epochs,
        "train.lr": train.lr,
        "train.base_batch_size": train.base_batch_size,
        "measure.windows": cfg.measure.windows,
        "measure.stable_windows": cfg.measure.stable_windows,
        "measure.stability_tolerance": cfg.measure.stability_tolerance,
        "measure.utilization_interval_seconds": cfg.measure.utilization_interval_seconds,
        "measure.profile_steps": cfg.measure.profile_steps,
    }
    for key, v in positive.items():
        if v <= 0:
            problems.append(f"{key}={v}: must be positive")
    if train.bn_recalibration_samples < 0:
        problems.append(
            f"train.bn_recalibration_samples={train.bn_recalibration_samples}: must be >= 0 "
            "(0 keeps BatchNorm's running statistics as trained)"
        )
    if cfg.measure.warmup_steps < 2:
        problems.append(
            f"measure.warmup_steps={cfg.measure.warmup_steps}: must be >= 2 (the first step builds "
            "the optimizer state, the last warm-up step is the one whose memory is broken down)"
        )
    if (
        cfg.measure.warmup_steps == 2
        and cfg.measure.memory_breakdown
        and any(w > 1 for w in sweep.num_workers)
    ):
        problems.append(
            "measure.warmup_steps=2: with more than one worker the memory-tracked (last warm-up) "
            "step would be the one where DDP rebuilds its gradient buckets; use >= 3, or set "
            "measure.memory_breakdown=false"
        )
    if 0 < cfg.measure.windows < cfg.measure.stable_windows:
        problems.append(
            f"measure.windows={cfg.measure.windows} is fewer than measure.stable_windows="
            f"{cfg.measure.stable_windows}: the stability rule could never be met; raise "
            "measure.windows or lower measure.stable_windows"
        )
    if sweep.points_per_worker_group is not None and sweep.points_per_worker_group <= 0:
        problems.append(
            f"sweep.points_per_worker_group={sweep.points_per_worker_group}: must be >= 1, or null "
            "for one worker group for the whole grid"
        )
    problems += check_report(cfg.report)
    if train.lr_scaling not in LR_SCALING_RULES:
        problems.append(
            f"train.lr_scaling={train.lr_scaling!r} is invalid: use one of {', '.join(LR_SCALING_RULES)}"
        )

    if cfg.cluster.use_gpu not in USE_GPU_CHOICES:
        problems.append(
            f"cluster.use_gpu={cfg.cluster.use_gpu!r} is invalid: use one of {', '.join(USE_GPU_CHOICES)}"
        )
    if cfg.cluster.cpus_per_worker is not None and cfg.cluster.cpus_per_worker <= 0:
        problems.append(
            f"cluster.cpus_per_worker={cfg.cluster.cpus_per_worker}: must be positive, or null for auto"
        )
    if cfg.cluster.cpus_per_trial <= 0:
        problems.append(
            f"cluster.cpus_per_trial={cfg.cluster.cpus_per_trial}: must be positive "
            "(Ray rejects an empty resource request), e.g. 0.01"
        )
    if cfg.cluster.address and cfg.cluster.address.startswith("ray://"):
        # Under Ray Client, Tune runs the experiment in an actor on the head node: results would not
        # reach this process, which alone writes to MLflow.
        problems.append(
            f"cluster.address={cfg.cluster.address!r}: Ray Client (ray://) is not supported, because Tune "
            "would run on the head node where sweeper cannot record its results; run the sweep on a "
            "node of the cluster with cluster.address=auto (or submit it: ray job submit -- python -m sweeper ...)"
        )
    if cfg.cluster.placement_strategy not in PLACEMENT_STRATEGIES:
        problems.append(
            f"cluster.placement_strategy={cfg.cluster.placement_strategy!r} is invalid: use one of "
            f"{', '.join(PLACEMENT_STRATEGIES)}"
        )
    if cfg.cluster.max_failures < 0:
        problems.append(f"cluster.max_failures={cfg.cluster.max_failures}: must be >= 0 (0: no restarts)")
    if cfg.sweep.resume and is_auto(cfg.sweep.micro_batch_sizes):
        problems.append(
            "sweep.resume=true with sweep.micro_batch_sizes=auto: resume needs the grid; give the sizes the "
            "frontier search chose (the parent run's frontier_* metrics) as a list"
        )
    if cfg.cluster.num_cpus is not None and cfg.cluster.num_cpus <= 0:
        problems.append(f"cluster.num_cpus={cfg.cluster.num_cpus}: must be positive, or null")

    if not (0.0 < cfg.data.val_fraction < 1.0):
        problems.append(f"data.val_fraction={cfg.data.val_fraction}: must be between 0 and 1")
    if cfg.data.num_samples <= 0:
        problems.append(f"data.num_samples={cfg.data.num_samples}: must be positive")
    if cfg.data.num_classes <= 1:
        problems.append(f"data.num_classes={cfg.data.num_classes}: must be at least 2")
    if cfg.data.loader_workers < 0:
        problems.append(f"data.loader_workers={cfg.data.loader_workers}: must be >= 0")

    if not cfg.model.input_shape or any(d <= 0 for d in cfg.model.input_shape):
        problems.append(
            f"model.input_shape={list(cfg.model.input_shape)}: every dimension must be positive, "
            "e.g. [3,32,32]"
        )
    if cfg.model.name == "mlp":
        for key in ("depth", "width"):
            if getattr(cfg.model, key) <= 0:
                problems.append(f"model.{key}={getattr(cfg.model, key)}: must be positive")
    return problems


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def budget_bytes(cfg: DeviceConfig) -> Optional[int]:
    """device.memory_budget_gb in bytes (GiB: a "16 GB" card reports 16384 MiB)."""
    return None if cfg.memory_budget_gb is None else int(cfg.memory_budget_gb * 2**30)


def check_factory(key: str, path: str, returns: str) -> List[str]:
    """Problems with a Hydra `_target_`-style import path: not importable, or not callable."""
    from hydra.utils import get_method

    try:
        factory = get_method(path)
    except Exception as exc:  # Hydra wraps import errors in its own types
        return [
            f"{key}={path!r} cannot be imported ({first_line(exc)}): give the import path of a "
            f"function returning {returns}, importable from where you run the sweep"
        ]
    return [] if callable(factory) else [f"{key}={path!r} is not callable"]


def tracking_uri(cfg: TrackingConfig, cwd: Optional[str] = None) -> str:
    """The tracking URI to use: the configured one, else a SQLite store in the working directory."""
    if cfg.uri:
        return cfg.uri
    return f"sqlite:///{os.path.join(cwd or os.getcwd(), 'mlflow.db')}"
