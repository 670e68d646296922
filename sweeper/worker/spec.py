"""What a worker is told to do (picklable specs, sent to every worker) and where it stands in its group.

Knows torch only through the specs' types; no Ray, no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from sweeper.config import (
    DataConfig,
    DivergenceConfig,
    EvalConfig,
    GnsConfig,
    LoopConfig,
    LossConfig,
    MeasureConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
)
from sweeper.measure.flops import FlopCount, PeakFlops
from sweeper.plan import GridPoint, frontier_label


@dataclass(frozen=True)
class Span:
    """One span of a batch-size schedule: from `start_samples` on, `steps` optimizer steps at `point`'s
    layout (its global batch) and `lr`."""

    start_samples: int
    point: GridPoint
    lr: float
    steps: int


@dataclass
class PointSpec:
    """Everything a worker needs to measure one grid point."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    point: GridPoint
    lr: float  # optim.lr after the LR-scaling rule, for this point's global batch
    steps: int
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    # The recipe beyond the point's own axes (precision, checkpointing: on `point`).
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    # Evaluations during training and the target; what makes a point diverged.
    eval: EvalConfig = field(default_factory=EvalConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    gns: GnsConfig = field(default_factory=GnsConfig)
    use_gpu: bool = False
    # FLOPs per sample of this model, counted once per sweep by the driver (None: not counted).
    flop_count: Optional[FlopCount] = None
    # profile=true: a torch.profiler trace of `measure.profile_steps` untimed steps, written under
    # `profile_dir` (the driver sets it once it knows where Ray keeps results).
    profile: bool = False
    profile_dir: Optional[str] = None
    # device.memory_budget_gb in bytes: enforced on GPU, simulated against the tracked step on CPU.
    memory_budget_bytes: Optional[int] = None
    # The fake-tensor estimate of this point's tracked peak (measure.memory.estimate_step), to report its error.
    memory_estimate_bytes: Optional[int] = None
    # measure.sharded_memory's predicted peak per worker (a sweep with a sharded parallelism), to report its error.
    memory_predicted_bytes: Optional[int] = None
    # measure.communication's bytes a worker sends per optimizer step, against the collectives it counts.
    communication_predicted_bytes: Optional[int] = None
    # False for frontier probes: memory only, no validation pass.
    evaluate: bool = True
    # cluster.point_timeout_seconds: the point's time limit on a worker (None: projected from its
    # warm-up; worker.deadline).
    timeout_seconds: Optional[float] = None
    # sweep.strategy=smart's rungs before the last: training goes on past these steps (in a later
    # rung), so neither did_not_learn nor a spike still unrecovered at the end is judged here.
    partial: bool = False
    # Continue from a training-state checkpoint (a folder sweeper.worker.state wrote): its weights,
    # optimizer state and position in the sample stream, at this point's layout and LR. None: from scratch.
    start_from: Optional[str] = None
    # Save this run's training state into this folder at its end (None: no checkpoint).
    save_state_to: Optional[str] = None
    # Save the training state on the way too: samples seen (from sample 0, at a step boundary of this run)
    # -> the folder (sweep.strategy=branch: the trunk's checkpoints its branches start from).
    save_states_at: Dict[int, str] = field(default_factory=dict)
    # True when save_states_at are a point's saves for its own retry (cluster.checkpoint_every_steps,
    # sweeper/cluster/recovery.py): continued from when its group is lost, deleted once it is recorded. A
    # branch sweep's trunk checkpoints are not: its branches start from them after the trunk is recorded.
    saves_for_retry: bool = False
    # train.batch_schedule: the spans after this spec's own (its point and steps are the first span's),
    # each continuing the one before at a layout of its global batch with its LR and its optimizer steps.
    later_spans: List["Span"] = field(default_factory=list)
    # The samples train.lr_schedule spans: the point's whole sample budget, whatever part of it this run trains
    # (a smart rung, a branch, a schedule's span, a run continued from a checkpoint). None: the samples of this
    # run and its later spans, from where it starts.
    schedule_samples: Optional[int] = None
    # loop.fn: your training loop, which trains the point instead of sweeper's (worker.user_loop).
    loop: LoopConfig = field(default_factory=LoopConfig)

    @property
    def seed(self) -> int:
        """This replicate's seed (initial weights, sample order): the point's, else train.seed."""
        return self.train.seed if self.point.seed is None else self.point.seed

    @property
    def profile_steps(self) -> int:
        """Steps the profiler records (0: not profiling)."""
        return self.measure.profile_steps if self.profile else 0

    @property
    def first_timed_step(self) -> int:
        """Warm-up steps, then (when profiling) one profiler warm-up step and the profiled steps."""
        return self.measure.warmup_steps + (self.profile_steps + 1 if self.profile else 0)


@dataclass
class FrontierSpec:
    """A frontier search on one worker count: probes are `template` at another micro-batch, run for
    its warm-up steps only (the last one memory-tracked, under the budget)."""

    template: PointSpec
    budget_bytes: Optional[int]  # None: the device's whole memory (GPU only)
    search: Dict[str, int]  # measure.frontier.FrontierSearch's knobs (frontier.* in the config)
    upper: int  # the largest micro-batch the data allows: one worker's share of the training set
    # The grid the frontier is for: whether it will accumulate decides if that frontier is searched too.
    accumulation_steps: List[int] = field(default_factory=lambda: [1])
    global_batch_sizes: Optional[List[int]] = None
    verify_steps: int = 0  # frontier.verify_steps: a verification probe's steps beyond the warm-up

    @property
    def num_workers(self) -> int:
        return self.template.point.num_workers

    @property
    def label(self) -> str:
        """w2, or w2-bf16-ckpt: the worker count and the recipe this search is for."""
        return frontier_label(self.template.point)


@dataclass
class WorkerContext:
    """This worker's place in the process group a point trains with: the whole worker group, or
    (for a point with fewer workers than the group) the sub-group of its first ranks."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    group: Any = None  # a torch.distributed ProcessGroup; None: the default (whole) group
    # A gloo group of the same ranks with a short timeout, for agreeing on a point's status.
    status_group: Any = None
    # The node this worker runs on (Ray's node id), to record how many nodes a point spanned.
    node: str = ""
    # An hsdp point's mesh over its ranks by node (collectives.node_meshes); None for other layouts.
    mesh: Optional["NodeMesh"] = None


@dataclass
class NodeMesh:
    """An hsdp point's 2-D mesh (plan.mesh_by_node): `rows`, one per node, of global ranks (a shard group each),
    and this rank's two process groups: its column across the nodes (`replicate`) and its row (`shard`)."""

    rows: List[List[int]]
    replicate: Any
    shard: Any


@dataclass(frozen=True)
class GroupFacts:
    """Measured once per worker group and shared by its points: the device's peak FLOP/s in each
    precision its points train in (a table entry on GPU, the faster of a matmul and a convolution
    measured on this worker's CPU share)."""

    peaks: Dict[str, PeakFlops] = field(default_factory=dict)
