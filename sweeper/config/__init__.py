"""Typed, validated configuration: the schema Hydra's YAML fills (every default lives here, once), and
one checker per section run before any point. Everything after `load()` works with these dataclasses,
never with a `DictConfig`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sweeper.errors import ConfigError, first_line
from sweeper.config import report as settings
from sweeper.config.report import LR_SCALING_RULES, ReportConfig, invalid_choice

USE_GPU_CHOICES = ("auto", "true", "false")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
TASKS = ("train", "inference")
BYTE_VOCAB = 256  # data=text's vocabulary: bytes
# Models that take token ids and predict the next token at every position, and the data that makes
# token sequences for them (sweeper/gpt.py, sweeper/text.py).
LANGUAGE_MODELS = ("gpt", "hf")
TOKEN_DATA = ("text", "tokens")

# One sample bigger than this is a typo in model.input_shape (a micro-batch holds many samples and
# their activations), not a workload: refused before anything allocates it.
MAX_SAMPLE_BYTES = 2**30
# The samples data=digits holds in memory (scikit-learn's bundled set); synthetic holds data.num_samples.
DIGITS_SAMPLES = 1797


# The recipe's choices (sweeper.recipe maps each to what torch runs).
OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "blocks")
STRATEGIES = ("grid", "smart", "branch")
# Keys that moved when the optimizer became a config group: their old names get a pointer.
MOVED_KEYS = {"train.lr": "optim.lr", "train.momentum": "optim.momentum", "train.weight_decay": "optim.weight_decay"}

# sweep.micro_batch_sizes=auto searches under a memory budget; a CPU has no device memory to read one
# from. Checked here for use_gpu=false, and by the driver once it knows a Ray cluster has no GPU.
AUTO_NEEDS_BUDGET = (
    "sweep.micro_batch_sizes=auto on CPU needs device.memory_budget_gb: the memory to plan for, "
    "e.g. device.memory_budget_gb=16 for a 16 GB card"
)

@dataclass
class ModelConfig:
    # A torchvision classification model name (resnet18, mobilenet_v3_small, ...), "mlp",
    # or any label when `_target_` names your own factory.
    name: str = MISSING
    # Import path of a factory returning an nn.Module, Hydra `_target_` style; called with
    # `kwargs`, plus `num_classes` if the factory accepts it and `kwargs` does not set it.
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # The shape of one sample the model consumes; the dataset is resized to it. One float32 sample
    # may take at most 1 GiB (MAX_SAMPLE_BYTES). model=gpt: [context], set from model.context.
    input_shape: List[int] = field(default_factory=lambda: [3, 32, 32])
    # model=gpt (sweeper/gpt.py): a decoder-only transformer trained on sequences of `context` tokens;
    # its vocabulary is the data's (256 bytes for data=text, data.vocab_size for data=tokens).
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    context: int = 64
    # model=hf (sweeper/hf.py, the optional extra `.[hf]`): a Hugging Face transformers causal LM of this
    # model type (gpt2, llama, ...) built from its config with random weights, `kwargs` its config's
    # overrides; its vocabulary is the data's, its position table `context`.
    hf_type: str = "gpt2"
    # MLP only. Seed 003's MLP is depth 8, width 1024; 4 is what learns digits in the default 2 epochs
    # (conf/model/mlp.yaml).
    depth: int = 4
    width: int = 1024
    # sweep.activation_checkpointing=blocks wraps torchvision's residual blocks and the MLP's layers;
    # a model of your own names its block classes here (e.g. [MyBlock]).
    checkpoint_modules: List[str] = field(default_factory=list)


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
    # data=tokens: the folder holding nanoGPT's train.bin and val.bin (uint16 token ids), and the
    # vocabulary those ids are below.
    path: Optional[str] = None
    vocab_size: Optional[int] = None
    # torch DataLoader worker processes per training worker (at most 4 per CPU, see check_data).
    loader_workers: int = 0


@dataclass
class SweepConfig:
    # The grid is micro_batch_sizes x accumulation_steps x num_workers. Each of these lists (and
    # global_batch_sizes, inference.batch_sizes, inference.mlp_widths) also takes one integer, read as a
    # one-element list: Hydra's multirun `-m sweep.micro_batch_sizes=16,32` hands each job one value.
    # Typed Any for that reason (OmegaConf has no int-or-list type); to_typed makes them lists.
    # micro_batch_sizes may also be "auto": the memory frontier search (see `frontier`) finds the
    # largest micro-batch that fits device.memory_budget_gb for each worker count, and the grid is
    # built from it (with global_batch_sizes: each global batch with the fewest accumulation steps).
    micro_batch_sizes: Any = field(default_factory=lambda: [16, 32])
    accumulation_steps: Any = field(default_factory=lambda: [1, 2])
    num_workers: Any = field(default_factory=lambda: [1])
    # Keep only grid points whose micro x accumulation x workers is one of these (null: all of them).
    global_batch_sizes: Any = None
    # Trials (worker groups) running at once. null: one per node that holds a whole trial (each sized
    # to fill its node, so 1 on a single machine), so co-located trials never distort each other's
    # throughput.
    max_concurrent_trials: Optional[int] = None
    # Grid points are measured one after another in one Ray Train worker group (one Ray Tune trial)
    # sized to the largest point, so worker start-up (process spawn, torch import, process group
    # init) is paid once per group instead of once per point. null: one group for the whole grid;
    # N: groups of at most N points; 1: a fresh worker group for every point (slowest, most isolated).
    points_per_worker_group: Optional[int] = None
    # Finish the latest sweep of this model and data that did not finish (interrupted, crashed):
    # checked to be the same experiment (its whole recorded config, less resume, cluster.address and
    # report.*), its pending writes replayed, half-written point records measured again; points
    # already recorded are not, and results go to the same parent run.
    resume: bool = False
    # With resume: measure the points recorded `failed` again (e.g. a node that went away); their
    # old runs are kept as sweeper.role=superseded.
    retry_failed: bool = False
    # The recipe's axes, crossed with the layout: fp32 | bf16 | fp16 (autocast around forward and
    # loss; fp16 with a GradScaler) and activation checkpointing none | blocks (each residual block,
    # MLP layer, or model.checkpoint_modules type recomputed in backward). One value or a list.
    precisions: Any = field(default_factory=lambda: ["fp32"])
    activation_checkpointing: Any = field(default_factory=lambda: ["none"])
    # Replicates: every point is measured once per seed (initial weights and sample order), each one
    # child run tagged sweeper.point with the point's key. null: one replicate, train.seed.
    seeds: Any = None
    # The LR as an axis, on top of the scaling rule (batch size and LR are not independent): each
    # point trains at optim.lr x scaling x each multiplier. One value or a list.
    lr_multipliers: Any = field(default_factory=lambda: [1.0])
    # grid: every point trains its whole sample budget. smart: every layout's throughput and memory
    # in a short run, then one representative per accuracy-equivalence class and seed trained for
    # accuracy, in rungs of successive halving (see `smart` and docs/strategy.md). branch: the same short
    # runs, then one trunk per seed at the smallest global batch and short branches from its checkpoints
    # to every larger one: the critical batch size over training and a batch-size schedule (see `branch`).
    strategy: str = "grid"
    # A language model (model=gpt or model=hf): the training sequence lengths as an axis (each point
    # trains and is timed at one), each at most model.context (the model's position table). Every
    # context trains on the same tokens (train.samples counts sequences of model.context); memory and
    # throughput are per context, and smart's accuracy classes never mix contexts. null: model.context
    # alone. One value or a list.
    context_lengths: Any = None


@dataclass
class SmartConfig:
    """sweep.strategy=smart (docs/strategy.md)."""

    # Optimizer steps of each layout's throughput-and-memory run, warm-up included (a point whose
    # whole budget is shorter runs its budget).
    throughput_steps: int = 30
    # Successive halving: rungs train to budget/eta^(rungs-1), ..., budget/eta, budget; after each
    # rung but the last, the best 1/eta of the classes go on (and any within the noise of the best).
    eta: int = 3
    rungs: int = 3
    # The confidence of the interval a class must leave (not overlap the best one's) to be stopped.
    confidence: float = 0.95
    # Whether the model mixes the samples of a micro-batch (BatchNorm): then layouts share a class only
    # with the same micro-batch. auto: found from the model's modules; true/false: your word for it
    # (a layer of your own that couples samples cannot be detected).
    batch_coupled: Any = "auto"
    # A class that goes on continues from its previous rung's training-state checkpoint (saved under
    # <cluster.ray_dir>/results/<sweep>/rungs, deleted when the sweep ends) instead of training again from
    # step 0; false: every rung from step 0, no checkpoint (what the ledger compares against).
    continue_rungs: bool = True


@dataclass
class BranchConfig:
    """sweep.strategy=branch (docs/strategy.md)."""

    # The trunk's global batch: null, the grid's smallest (it must be one of the grid's).
    base_global_batch: Optional[int] = None
    # Where the trunk saves its state and branches, as fractions of the sample budget, each in (0, 1): the
    # critical batch size rises fastest early in training, so the defaults look early and then spread out.
    at: List[float] = field(default_factory=lambda: [0.05, 0.15, 0.3, 0.5, 0.75])
    # Samples each branch trains (null: a twentieth of the budget, at least two steps of the grid's largest
    # global batch), rounded up to a multiple of every global batch compared.
    window: Optional[int] = None
    # The loss rise over the trunk's, at the window's end, that a branch may show and still keep up. null:
    # measured, z(confidence) x the trunk's own loss noise over the window's tail (its standard error).
    tolerance: Optional[float] = None
    confidence: float = 0.95
    # How a branch's LR follows its global batch from the trunk's. auto: train.lr_scaling when it is not
    # none, else the optimizer family's rule (sqrt for Adam-family, linear for SGD); none | linear | sqrt.
    lr_scaling: str = "auto"


@dataclass
class InferenceConfig:
    # task=inference: batch sizes timed under torch.inference_mode(), smallest first (1..512).
    batch_sizes: Any = field(default_factory=lambda: [2**i for i in range(10)])
    # Untimed runs first; then timing goes on until both timed_runs and min_timed_seconds are reached.
    warmup_runs: int = 10
    timed_runs: int = 100
    min_timed_seconds: float = 0.5
    # model=mlp only: also sweep the width (seed 003's experiment: [256,512,1024,2048,4096]);
    # null: model.width.
    mlp_widths: Any = None
    # model=gpt: decode is timed at each of these contexts (cached positions, each at most model.context),
    # batch_sizes concurrent sequences each (docs/inference.md#decode). null: model.context alone.
    contexts: Any = None


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
    # the frontier if the line would extrapolate far), at most max_fit_probes of them; then the
    # predicted frontier is run to verify it, at most max_verifications times (stepping down if needed).
    first_probe: int = 8
    growth: int = 4
    max_fit_probes: int = 3
    max_verifications: int = 3
    # Round the frontier down to a multiple (8 suits tensor cores).
    multiple_of: int = 1
    # The grid's micro-batches stay this far below the largest that fit (a share: 0.05 is 5 %): a size
    # that fit for a few steps can run out of memory later (allocator fragmentation, a longer
    # sequence; Lightning's finder gained `margin` for this, Lightning #20231, #8028).
    margin: float = 0.05
    # A verification probe runs this many steps beyond the warm-up, so allocator growth shows in its
    # peak (on GPU: torch.cuda.max_memory_allocated over all of them).
    verify_steps: int = 10


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
    # stays at the point's LR. 0: no warmup.
    warmup_steps: int = 0
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


@dataclass
class TrackingConfig:
    # null: a SQLite store `mlflow.db` in the working directory.
    uri: Optional[str] = None
    experiment_name: str = "sweeper"


@dataclass
class ClusterConfig:
    # null: start a local Ray; "auto" or "host:port": join an existing cluster (the driver runs on one
    # of its nodes; Ray Client's ray:// is refused, see check_cluster).
    address: Optional[str] = None
    # auto | true | false
    use_gpu: Any = "auto"
    # null: split the machine's CPUs between the largest trial's workers.
    cpus_per_worker: Optional[float] = None
    # CPUs reserved by each trial's own driver (it only waits on its workers).
    cpus_per_trial: float = 0.01
    # Local Ray only: how many CPUs it may use, at most os.cpu_count() (null: all of this machine's).
    num_cpus: Optional[int] = None
    # Ray's results and the local cluster's auth token go here, not into your home directory.
    ray_dir: str = ".sweeper/ray"
    # Where training-state checkpoints go (train.save_state, smart's rungs, a branch sweep's trunk), as Ray
    # Train's storage_path takes it: a folder every node reads (an NFS mount) or a URI (s3://bucket/path,
    # gs://bucket/path, file:///path), under <storage_path>/<sweep>/. null: <ray_dir>/results/<sweep>/ (a local
    # Ray; on a multi-node cluster set it, since a continued run may land on another node).
    storage_path: Optional[str] = None
    # The local Ray's dashboard and its port (1..65535).
    include_dashboard: bool = True
    dashboard_port: int = 8265
    # Where a trial's workers go (Ray placement groups): PACK (fewest nodes, the default), SPREAD
    # (across nodes), STRICT_PACK (all on one node, or wait), STRICT_SPREAD (one node each, or wait).
    placement_strategy: str = "PACK"
    # A worker group whose process dies (a node lost, a worker killed) is restarted this many times;
    # points it had measured are not measured again.
    max_failures: int = 3
    # Finite limits, so nothing waits forever. A worker group that cannot be placed (resources gone
    # after a node loss) fails its points after this many seconds per try (Ray Train retries a start
    # cluster.max_failures times; its own default waits forever).
    start_timeout_seconds: float = 120.0
    # The process group's collective timeout (torch.distributed, gloo/NCCL): a rank stuck this long
    # in an all-reduce raises instead of holding the others.
    collective_timeout_seconds: float = 600.0
    # A point's time limit on a worker; past it the worker ends itself and its group restarts
    # (null: projected from the point's own warm-up, 4x the rest and at least 5 minutes more).
    point_timeout_seconds: Optional[float] = None
    # How often Ray Train's controller polls its workers (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S; Ray's own
    # default is 2 s). Each state change of a worker group (started, running, finished, shut down)
    # waits for the next poll: at 2 s a one-group sweep of 4 tiny points spent ~9 s of its 30 s grid waiting here.
    health_check_seconds: float = 0.5


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


def normalize_use_gpu(value: Any) -> str:
    return str(value).strip().lower()


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
        *check_combinations(cfg),
    ]


def _check(problems: List[str], key: str, value: Any, ok: Callable[[Any], bool], rule: str) -> None:
    """Adds `key=value: rule` when a set value breaks `ok` (None: the setting is null, which its rule
    allows or OmegaConf refused). NaN and infinity break every rule: NaN compares false (`lr <= 0`
    lets it through) and infinity passes `> 0`, and either would reach torch or Ray as a setting."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{key}={value} is not a finite number: {rule}")
    elif not ok(value):
        problems.append(f"{key}={value}: {rule}")


def _multipliers(values: Any) -> List[str]:
    key = "sweep.lr_multipliers"
    if not isinstance(values, list) or not values or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    ):
        return [f"{key}={values!r} is invalid: give a list of positive numbers, e.g. {key}=[0.5,1,2]"]
    problems: List[str] = []
    for v in values:
        _check(problems, key, v, _positive, "every multiplier must be a positive number, e.g. [0.5,1,2]")
    return problems


def _repeated(sweep: SweepConfig) -> List[str]:
    """A value given twice on a grid axis would make two points with one key (one MLflow child run
    for both, a resume that skips the second): refused. Multipliers compare as their keys print them."""
    axes = {
        "sweep.micro_batch_sizes": None if is_auto(sweep.micro_batch_sizes) else sweep.micro_batch_sizes,
        "sweep.accumulation_steps": sweep.accumulation_steps, "sweep.num_workers": sweep.num_workers,
        "sweep.global_batch_sizes": sweep.global_batch_sizes, "sweep.seeds": sweep.seeds,
        "sweep.precisions": sweep.precisions, "sweep.activation_checkpointing": sweep.activation_checkpointing,
        "sweep.lr_multipliers": sweep.lr_multipliers, "sweep.context_lengths": sweep.context_lengths,
    }
    problems = []
    for key, values in axes.items():
        if not isinstance(values, list):
            continue
        forms = [f"{v:g}" if key == "sweep.lr_multipliers" and isinstance(v, (int, float)) else str(v) for v in values]
        twice = sorted({f for f in forms if forms.count(f) > 1})
        if twice:
            problems.append(f"{key} gives {', '.join(twice)} more than once: list each value once")
    return problems


def _choices(key: str, values: Any, allowed: Sequence[str], example: str) -> List[str]:
    """Problems with a list of names from `allowed` (a recipe axis)."""
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        return [f"{key}={values!r} is invalid: give a list of {', '.join(allowed)}, e.g. {key}={example}"]
    unknown = [v for v in values if v not in allowed]
    return [f"{key} has {', '.join(unknown)}: use {', '.join(allowed)}"] if unknown else []


def _positive(value: Any) -> bool:
    return value > 0


def _not_negative(value: Any) -> bool:
    return value >= 0


def _sizes(key: str, values: Any, example: str, otherwise: str = "", least: int = 1) -> List[str]:
    """Problems with a list of integers of at least `least` (a grid axis, batch sizes, widths, seeds);
    `otherwise` names what else the key accepts."""
    what = "positive integers" if least == 1 else f"integers >= {least}"
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        shown = "null" if values is None else repr(values)
        return [f"{key}={shown} is invalid: give a list of {what} (or one integer), e.g. {key}={example}{otherwise}"]
    if not values:
        return [f"{key}=[] is empty: give at least one value, e.g. {key}={example}{otherwise}"]
    one = "a positive integer" if least == 1 else f"an integer >= {least}"
    return [f"{key} contains {v}: every value must be {one}; remove or fix it" for v in values if v < least]


def check_task(task: str) -> List[str]:
    problem = invalid_choice("task", task, TASKS)
    return [problem] if problem else []


def check_sweep(sweep: SweepConfig) -> List[str]:
    problems: List[str] = []
    if not is_auto(sweep.micro_batch_sizes):
        problems += _sizes("sweep.micro_batch_sizes", sweep.micro_batch_sizes, "[32,64]", ", or auto")
    problems += _sizes("sweep.accumulation_steps", sweep.accumulation_steps, "[1,2]")
    problems += _sizes("sweep.num_workers", sweep.num_workers, "[1,2]")
    if sweep.global_batch_sizes is not None:
        problems += _sizes(
            "sweep.global_batch_sizes", sweep.global_batch_sizes, "[64,128]", ", or null to keep the whole grid"
        )
    _check(problems, "sweep.max_concurrent_trials", sweep.max_concurrent_trials, _positive, "must be >= 1, or null")
    _check(
        problems, "sweep.points_per_worker_group", sweep.points_per_worker_group, _positive,
        "must be >= 1, or null for one worker group for the whole grid",
    )
    if sweep.seeds is not None:
        problems += _sizes("sweep.seeds", sweep.seeds, "[0,1,2]", ", or null for train.seed alone", least=0)
    problems += _multipliers(sweep.lr_multipliers)
    if sweep.context_lengths is not None:
        problems += _sizes("sweep.context_lengths", sweep.context_lengths, "[64,128]",
                           ", or null for model.context alone", least=2)
        if is_auto(sweep.micro_batch_sizes):
            problems.append("sweep.context_lengths with sweep.micro_batch_sizes=auto: the frontier search runs at "
                            "model.context only; give the micro-batch sizes as a list, or sweep one context "
                            "(model.context) per sweep")
    problems += _choices("sweep.precisions", sweep.precisions, PRECISIONS, "[fp32,bf16]")
    problems += _choices(
        "sweep.activation_checkpointing", sweep.activation_checkpointing, CHECKPOINTING, "[none,blocks]"
    )
    problem = invalid_choice("sweep.strategy", sweep.strategy, STRATEGIES)
    if problem:
        problems.append(problem)
    problems += _repeated(sweep)
    if sweep.retry_failed and not sweep.resume:
        problems.append(
            "sweep.retry_failed=true needs sweep.resume=true: it retries the failed points of a resumed sweep"
        )
    if sweep.resume and is_auto(sweep.micro_batch_sizes):
        problems.append(
            "sweep.resume=true with sweep.micro_batch_sizes=auto: resume needs the grid; give the sizes the "
            "frontier search chose (the parent run's frontier_* metrics) as a list"
        )
    return problems


def check_optim(optim: OptimConfig) -> List[str]:
    problems: List[str] = []
    if not optim._target_ and optim.name not in OPTIMIZERS:
        problems.append(
            f"optim.name={optim.name!r} is unknown: use optim=sgd or optim=adamw, or optim=custom with "
            "optim._target_ set to your factory"
        )
    _check(problems, "optim.lr", optim.lr, _positive, "must be positive")
    _check(problems, "optim.weight_decay", optim.weight_decay, _not_negative, "must be >= 0")
    _check(problems, "optim.momentum", optim.momentum, lambda m: 0 <= m < 1, "must be in [0, 1), e.g. 0.9")
    _check(problems, "optim.eps", optim.eps, _positive, "must be positive, e.g. 1e-8")
    if not isinstance(optim.betas, list) or len(optim.betas) != 2:
        problems.append(f"optim.betas={optim.betas!r}: give two decay rates, e.g. optim.betas=[0.9,0.999]")
    else:
        for i, beta in enumerate(optim.betas):
            _check(problems, f"optim.betas[{i}]", beta, lambda b: 0 <= b < 1, "must be in [0, 1), e.g. 0.9")
    if optim._target_:
        problems += check_factory("optim._target_", optim._target_, "a torch.optim.Optimizer")
    return problems


def check_loss(loss: LossConfig) -> List[str]:
    problems: List[str] = []
    if not loss._target_ and loss.name != "cross_entropy":
        problems.append(
            f"loss.name={loss.name!r} is unknown: the built-in loss is cross_entropy; give loss._target_ for another"
        )
    _check(problems, "loss.label_smoothing", loss.label_smoothing, lambda s: 0 <= s < 1, "must be in [0, 1), e.g. 0.1")
    if loss._target_:
        problems += check_factory("loss._target_", loss._target_, "a loss(logits, targets) callable")
    return problems


def check_train(train: TrainConfig) -> List[str]:
    problems: List[str] = []
    for key in ("epochs", "base_batch_size"):
        _check(problems, f"train.{key}", getattr(train, key), _positive, "must be positive")
    _check(
        problems, "train.bn_recalibration_samples", train.bn_recalibration_samples, _not_negative,
        "must be >= 0 (0 keeps BatchNorm's running statistics as trained)",
    )
    _check(problems, "train.warmup_steps", train.warmup_steps, _not_negative, "must be >= 0 (0: no LR warmup)")
    if train.samples is not None:
        _check(problems, "train.samples", train.samples, _positive, "must be positive, or null for train.epochs")
    problem = invalid_choice("train.lr_scaling", train.lr_scaling, LR_SCALING_RULES)
    return problems + ([problem] if problem else []) + _check_schedule(train.batch_schedule)


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
    _check(problems, "eval.every_samples", evaluation.every_samples, _positive, "must be positive, or null")
    _check(problems, "eval.target_accuracy", evaluation.target_accuracy, lambda a: 0 < a <= 1,
           "must be a fraction in (0, 1], e.g. 0.9, or null")
    _check(problems, "eval.target_loss", evaluation.target_loss, _positive, "must be positive, or null")
    if evaluation.target_accuracy is not None and evaluation.target_loss is not None:
        problems.append("eval.target_accuracy and eval.target_loss are both set: give one target, or neither")
    if evaluation.stop_at_target and evaluation.target_accuracy is None and evaluation.target_loss is None:
        problems.append("eval.stop_at_target=true needs a target: set eval.target_accuracy or eval.target_loss")
    return problems


def check_gns(gns: GnsConfig) -> List[str]:
    problems: List[str] = []
    _check(problems, "gns.ema_beta", gns.ema_beta, lambda b: 0 <= b < 1, "must be in [0, 1), e.g. 0.9")
    _check(problems, "gns.every_steps", gns.every_steps, _positive, "must be >= 1 (1: every step)")
    return problems


def check_divergence(divergence: DivergenceConfig) -> List[str]:
    problems: List[str] = []
    _check(problems, "divergence.spike_factor", divergence.spike_factor, lambda f: f > 1, "must be > 1, e.g. 2")
    for key in ("spike_steps", "spike_window", "recover_steps"):
        _check(problems, f"divergence.{key}", getattr(divergence, key), _positive, "must be >= 1")
    if divergence.confidence is not None:
        _check(problems, "divergence.confidence", divergence.confidence, lambda c: 0.5 <= c < 1,
               "must be a level in [0.5, 1), e.g. 0.95, or null (report.confidence)")
    return problems


def check_measure(measure: MeasureConfig) -> List[str]:
    problems: List[str] = []
    _check(
        problems, "measure.warmup_steps", measure.warmup_steps, lambda n: n >= 2,
        "must be >= 2 (the first step builds the optimizer state, the last warm-up step is the one whose "
        "memory is broken down)",
    )
    for key in ("windows", "stable_windows", "stability_tolerance", "utilization_interval_seconds", "profile_steps"):
        _check(problems, f"measure.{key}", getattr(measure, key), _positive, "must be positive")
    if 0 < measure.windows < measure.stable_windows:
        problems.append(
            f"measure.windows={measure.windows} is fewer than measure.stable_windows={measure.stable_windows}: "
            "the stability rule could never be met; raise measure.windows or lower measure.stable_windows"
        )
    return problems


def check_branch(branch: BranchConfig) -> List[str]:
    problems: List[str] = []
    at = branch.at
    if not isinstance(at, list) or not at or not all(isinstance(f, (int, float)) and not isinstance(f, bool)
                                                     and math.isfinite(f) and 0 < f < 1 for f in at):
        problems.append(f"branch.at={at!r}: must be a list of fractions of the budget in (0, 1), e.g. [0.1,0.3,0.6]")
    _check(problems, "branch.base_global_batch", branch.base_global_batch, _positive,
           "must be a positive global batch of the grid, or null (the grid's smallest)")
    _check(problems, "branch.window", branch.window, _positive, "must be positive samples, or null (a twentieth "
           "of the budget)")
    _check(problems, "branch.tolerance", branch.tolerance, _not_negative, "must be >= 0 (a loss rise), or null "
           "(measured from the trunk's noise)")
    _check(problems, "branch.confidence", branch.confidence, lambda c: 0 < c < 1, "must be in (0, 1), e.g. 0.95")
    if branch.lr_scaling not in ("auto", "none", "linear", "sqrt"):
        problems.append(f"branch.lr_scaling={branch.lr_scaling!r} is invalid: use auto, none, linear or sqrt")
    return problems


def check_smart(smart: SmartConfig) -> List[str]:
    problems: List[str] = []
    _check(problems, "smart.throughput_steps", smart.throughput_steps, _positive, "must be >= 1, e.g. 30")
    _check(problems, "smart.eta", smart.eta, lambda n: n >= 2, "must be >= 2 (keep the best 1/eta), e.g. 3")
    _check(problems, "smart.rungs", smart.rungs, _positive, "must be >= 1 (1: no halving), e.g. 3")
    _check(problems, "smart.confidence", smart.confidence, lambda c: 0 < c < 1, "must be in (0, 1), e.g. 0.95")
    if normalize_batch_coupled(smart.batch_coupled) is None:
        problems.append(f"smart.batch_coupled={smart.batch_coupled!r} is invalid: use auto, true or false")
    return problems


def normalize_batch_coupled(value: Any) -> Optional[str]:
    """auto | true | false (YAML may hand over a bool); None when it is none of them."""
    text = str(value).lower()
    return text if text in ("auto", "true", "false") else None


def check_device(device: DeviceConfig) -> List[str]:
    problems: List[str] = []
    _check(
        problems, "device.memory_budget_gb", device.memory_budget_gb, _positive,
        "must be positive (GiB), or null for no budget",
    )
    return problems


def check_frontier(frontier: FrontierConfig) -> List[str]:
    problems: List[str] = []
    for key in ("first_probe", "growth", "max_verifications", "multiple_of"):
        _check(problems, f"frontier.{key}", getattr(frontier, key), _positive, "must be >= 1")
    _check(
        problems, "frontier.max_fit_probes", frontier.max_fit_probes, lambda n: n >= 2,
        "a line needs two probes, use >= 2",
    )
    _check(problems, "frontier.margin", frontier.margin, lambda m: 0 <= m < 1, "must be in [0, 1), e.g. 0.05")
    _check(problems, "frontier.verify_steps", frontier.verify_steps, _not_negative, "must be >= 0")
    return problems


def check_report(report: ReportConfig, key: Callable[[str], str] = lambda name: f"report.{name}") -> List[str]:
    """The report's settings, by the rules `recommend()` and `python -m sweeper.report` share."""
    return settings.check(report, key)


def check_tracking(tracking: TrackingConfig) -> List[str]:
    if tracking.experiment_name.strip():
        return []
    return [f"tracking.experiment_name={tracking.experiment_name!r} is empty: name the MLflow experiment, e.g. sweeper"]


def check_cluster(cluster: ClusterConfig) -> List[str]:
    problems = [
        invalid_choice("cluster.use_gpu", cluster.use_gpu, USE_GPU_CHOICES),
        invalid_choice("cluster.placement_strategy", cluster.placement_strategy, PLACEMENT_STRATEGIES),
    ]
    problems = [p for p in problems if p] + _check_cpus(cluster)
    if cluster.address and cluster.address.startswith("ray://"):
        # Under Ray Client, Tune runs the experiment in an actor on the head node: results would not
        # reach this process, which alone writes to MLflow.
        problems.append(
            f"cluster.address={cluster.address!r}: Ray Client (ray://) is not supported, because Tune "
            "would run on the head node where sweeper cannot record its results; run the sweep on a "
            "node of the cluster with cluster.address=auto (or submit it: ray job submit -- python -m sweeper ...)"
        )
    _check(problems, "cluster.max_failures", cluster.max_failures, _not_negative, "must be >= 0 (0: no restarts)")
    for key in ("start_timeout_seconds", "collective_timeout_seconds", "point_timeout_seconds", "health_check_seconds"):
        _check(problems, f"cluster.{key}", getattr(cluster, key), _positive, "must be a positive number of seconds")
    _check(
        problems, "cluster.dashboard_port", cluster.dashboard_port, lambda port: 1 <= port <= 65535,
        "a TCP port must be between 1 and 65535, e.g. 8265",
    )
    return problems


def _check_cpus(cluster: ClusterConfig) -> List[str]:
    problems: List[str] = []
    _check(
        problems, "cluster.cpus_per_worker", cluster.cpus_per_worker, _positive, "must be positive, or null for auto"
    )
    _check(
        problems, "cluster.cpus_per_trial", cluster.cpus_per_trial, _positive,
        "must be positive (Ray rejects an empty resource request), e.g. 0.01",
    )
    _check(problems, "cluster.num_cpus", cluster.num_cpus, _positive, "must be positive, or null")
    cores = os.cpu_count()
    if cluster.address is None and cores and cluster.num_cpus is not None and cluster.num_cpus > cores:
        # A local Ray told of CPUs it does not have runs that many workers on fewer cores, and every
        # throughput it measures is then the oversubscription's.
        problems.append(
            f"cluster.num_cpus={cluster.num_cpus}: this machine has {cores} CPUs (os.cpu_count()); a local "
            f"Ray may use at most those: use cluster.num_cpus<={cores}, or null for all of them"
        )
    return problems


def check_data(data: DataConfig, local_cpus: Optional[int]) -> List[str]:
    """`local_cpus`: this machine's CPUs when the points run on it (a local Ray), else None."""
    problems: List[str] = []
    _check(problems, "data.val_fraction", data.val_fraction, lambda f: 0 < f < 1, "must be between 0 and 1")
    _check(problems, "data.num_samples", data.num_samples, _positive, "must be positive")
    if not is_token_data(data):  # token data: its vocabulary (sweeper.text)
        _check(problems, "data.num_classes", data.num_classes, lambda n: n >= 2, "must be at least 2")
    # Each DataLoader worker is a process with its own copy of the dataset object, per training
    # worker; torch warns past one per CPU. Four per CPU leaves room for loaders that wait on disk or
    # network; thousands only exhaust memory and the process limit. A cluster's nodes are not known
    # before Ray connects: 1024 is four per CPU of a 256-core node.
    limit = 4 * local_cpus if local_cpus else 1024
    where = f"4 per CPU of this machine's {local_cpus}" if local_cpus else "4 per CPU of a 256-core node"
    _check(
        problems, "data.loader_workers", data.loader_workers, lambda n: 0 <= n <= limit,
        f"must be between 0 and {limit} ({where}), e.g. 0 for loading in the training process",
    )
    return problems


def check_model(model: ModelConfig) -> List[str]:
    problems: List[str] = []
    shape = list(model.input_shape)
    if not shape or any(d <= 0 for d in shape):
        problems.append(f"model.input_shape={shape}: every dimension must be positive, e.g. [3,32,32]")
    elif sample_bytes(shape) > MAX_SAMPLE_BYTES:
        problems.append(
            f"model.input_shape={shape}: one float32 sample would take {sample_bytes(shape) / 2**30:,.1f} GiB "
            f"({' x '.join(map(str, shape))} x 4 bytes), over the {MAX_SAMPLE_BYTES / 2**30:g} GiB a sample may "
            "take: give the shape of one sample, e.g. [3,32,32]"
        )
    if model.name == "mlp" and not model._target_:
        for key in ("depth", "width"):
            _check(problems, f"model.{key}", getattr(model, key), _positive, "must be positive")
    if is_language_model(model):
        problems += _check_language_model(model)
    return problems


def _check_language_model(model: ModelConfig) -> List[str]:
    problems: List[str] = []
    _check(problems, "model.context", model.context, lambda n: n >= 2,
           "must be at least 2 (a sequence of one token has no next token to predict within it), e.g. 64")
    if model.name != "gpt":
        return problems  # model=hf: its config's own rules (sweeper.hf.check)
    for key in ("n_layer", "n_head", "d_model"):
        _check(problems, f"model.{key}", getattr(model, key), _positive, "must be positive")
    if not problems and model.d_model % model.n_head:
        problems.append(f"model.n_head={model.n_head} does not divide model.d_model={model.d_model}: each head "
                        f"takes d_model / n_head dimensions; e.g. model.n_head={_divisor(model.d_model, model.n_head)}")
    return problems


def _divisor(n: int, near: int) -> int:
    """The divisor of `n` closest to `near`."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), d))


def check_inference(inference: InferenceConfig) -> List[str]:
    problems = _sizes("inference.batch_sizes", inference.batch_sizes, "[1,2,4,8]")
    if inference.mlp_widths is not None:
        problems += _sizes("inference.mlp_widths", inference.mlp_widths, "[256,1024]", ", or null")
    if inference.contexts is not None:
        problems += _sizes("inference.contexts", inference.contexts, "[64,256]", ", or null for model.context",
                           least=2)
    _check(problems, "inference.timed_runs", inference.timed_runs, lambda n: n >= 1, "must be >= 1")
    _check(problems, "inference.warmup_runs", inference.warmup_runs, _not_negative, "must be >= 0")
    _check(
        problems, "inference.min_timed_seconds", inference.min_timed_seconds, _not_negative, "must be >= 0 (seconds)"
    )
    return problems


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
    strategy = cfg.sweep.strategy
    if strategy in ("smart", "branch") and (cfg.train.save_state or cfg.train.start_from or cfg.train.batch_schedule):
        problems.append(f"train.save_state / train.start_from / train.batch_schedule with sweep.strategy={strategy}: "
                        "its measurement runs save and continue training states of their own; use "
                        "sweep.strategy=grid")
    if strategy == "branch":
        problems += _branch_problems(cfg)
    if cfg.train.batch_schedule and cfg.train.start_from:
        problems.append("train.batch_schedule with train.start_from: a schedule starts from sample 0; drop one of them")
    if cfg.report.quality == "val_bits_per_byte" and not (is_token_data(cfg.data) and cfg.data.name == "text"):
        problems.append(f"report.quality=val_bits_per_byte needs byte-level text (data=text), not "
                        f"data={cfg.data.name}: "
                        "use report.quality=val_loss (nats per token) or auto")
    return problems + _check_model_data(cfg.model, cfg.data)


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


def _check_model_data(model: ModelConfig, data: DataConfig) -> List[str]:
    """The built-in datasets make samples of model.input_shape: digits and cifar10 resize images to
    it; digits and synthetic hold all of theirs in memory (cifar10 transforms each as it is read).
    Token data trains a language model, and a language model trains on token data."""
    tokens, language_model = is_token_data(data), is_language_model(model)
    if tokens and not language_model and not model._target_:
        return [f"data={data.name} makes token sequences, which model={model.name} does not take: use model=gpt "
                "(or model=hf)"]
    if language_model and not tokens and not data._target_:
        return [f"model={model.name} trains on token sequences, which data={data.name} does not make: use "
                "data=text (bytes "
                "of the Python standard library) or data=tokens data.path=DIR (your nanoGPT train.bin/val.bin)"]
    if tokens or language_model:
        return []
    shape = list(model.input_shape)
    if data._target_ or not shape or any(d <= 0 for d in shape) or sample_bytes(shape) > MAX_SAMPLE_BYTES:
        return []  # check_model's problems
    if data.name in ("digits", "cifar10") and len(shape) > 3:
        return [f"model.input_shape={shape}: data={data.name} makes images, so 1 to 3 dimensions (C x H x W)"]
    if data.name == "cifar10" and len(shape) == 3 and shape[0] not in (1, 3):
        return [f"model.input_shape={shape}: data=cifar10 has 1 (grayscale) or 3 (RGB) channels, not {shape[0]}"]
    samples = {"digits": DIGITS_SAMPLES, "synthetic": data.num_samples}.get(data.name, 0)
    held, memory = samples * sample_bytes(shape), physical_memory_bytes()
    if not memory or held <= memory:
        return []
    return [
        f"model.input_shape={shape}: data={data.name} holds its {samples} samples in memory at that shape, "
        f"{held / 2**30:,.1f} GiB, more than this machine's {memory / 2**30:,.1f} GiB: use a smaller "
        "model.input_shape" + (" or data.num_samples" if data.name == "synthetic" else "")
    ]


def is_language_model(model: ModelConfig) -> bool:
    return model.name in LANGUAGE_MODELS and not model._target_


def is_token_data(data: DataConfig) -> bool:
    return data.name in TOKEN_DATA and not data._target_


def sample_bytes(shape: List[int]) -> int:
    """Bytes of one float32 sample of `shape`."""
    return 4 * math.prod(shape)


def physical_memory_bytes() -> Optional[int]:
    """This machine's RAM, or None where the OS does not say (sysconf is POSIX)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


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
