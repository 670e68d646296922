"""The sweep section and its strategies' sections (sweep, smart, branch, frontier): what is swept and
how the points are chosen, every default once, and each section's checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional

from sweeper.config.report import invalid_choice
from sweeper.config.rules import check_rule, check_choices, is_not_negative, is_positive, check_sizes
from sweeper.config.runtime import is_auto, normalize_batch_coupled
from sweeper.config.training import CHECKPOINTING, PRECISIONS
from sweeper.plan import GRADIENT_SYNCS, PARALLELISMS


STRATEGIES = ("grid", "smart", "branch")
# sweep.parallelism's sharded choices (worker.sharding applies them; measure.sharded_memory prices them), and
# those FSDP2 shards the weights of (zero1 keeps DDP's whole weights and gradients: only its optimizer is sharded)
SHARDED = tuple(p for p in PARALLELISMS if p != "ddp")
FSDP = ("zero2", "zero3", "hsdp")


def parallelism_problems(sweep: SweepConfig, compile_model: bool, gns_enabled: bool, batch_schedule: Any,
                         placement_strategy: str = "PACK") -> List[str]:
    """What a sharded value of sweep.parallelism cannot be combined with, one line each."""
    sharded = [v for v in sweep.parallelism if v in SHARDED] if isinstance(sweep.parallelism, list) else []
    if not sharded:
        return []
    said = f"sweep.parallelism has {', '.join(sharded)}"
    fsdp = [v for v in sharded if v in FSDP]
    found = []
    if compile_model:
        found.append(f"train.compile=true with {said}: torch.compile with a sharded layout is not tested here; set "
                     "train.compile=false, or sweep.parallelism=[ddp]")
    if gns_enabled and fsdp:
        found.append(f"gns.enabled=true with sweep.parallelism has {', '.join(fsdp)}: the noise scale's hooks see the "
                     "unsharded parameters, which FSDP2 replaces by shards; set gns.enabled=false, or "
                     "sweep.parallelism=[ddp] (or zero1)")
    if batch_schedule:
        found.append(f"train.batch_schedule with {said}: a span hands its training state to the next in memory, "
                     "which sharded ranks do not hold whole; drop train.batch_schedule, or sweep.parallelism=[ddp]")
    if "hsdp" in sharded and placement_strategy == "STRICT_SPREAD":
        found.append("sweep.parallelism has hsdp with cluster.placement_strategy=STRICT_SPREAD: every rank on a node "
                     "of its own makes shard groups of one rank, which shard nothing; use PACK or SPREAD, or "
                     "parallelism zero1")
    return found


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
    # How the data-parallel workers hold the model, as an axis crossed with the layout: ddp (every worker
    # holds every weight, gradient and optimizer state), zero2 / zero3 (FSDP2's fully_shard per block:
    # sharded 1/N between steps; zero3 also frees a block's gathered weights after its forward).
    # A list, e.g. [ddp,zero3] (docs/parallelism.md).
    parallelism: Any = field(default_factory=lambda: ["ddp"])
    # How gradient accumulation reduces the gradients, as an axis: final (skip the reduce until the last
    # micro-step: one reduce per optimizer step, the whole model's gradients held unsharded meanwhile) and/or
    # every (reduce at every micro-step: sharded gradients held, a reduce per micro-step). A list, e.g.
    # [final,every]; a point with one micro-step, or one DDP worker, runs final alone (docs/parallelism.md).
    gradient_sync: Any = field(default_factory=lambda: ["final"])


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
    # The margin a branch's loss rise over the trunk's (mean over the window's second half, the trunk read at
    # the branch's position) must be certified within to keep up: its one-sided upper bound at confidence,
    # the trunk's and the branch's own noise counted, at most this. null: 0.375 x the trunk's fall over the
    # window (a branch making half the trunk's progress per sample lags by that much on average there).
    tolerance: Optional[float] = None
    confidence: float = 0.95
    # How a branch's LR follows its global batch from the trunk's. auto: train.lr_scaling when it is not
    # none, else the optimizer family's rule (sqrt for Adam-family, linear for SGD); none | linear | sqrt.
    lr_scaling: str = "auto"


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


def _multipliers(values: Any) -> List[str]:
    key = "sweep.lr_multipliers"
    if not isinstance(values, list) or not values or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    ):
        return [f"{key}={values!r} is invalid: give a list of positive numbers, e.g. {key}=[0.5,1,2]"]
    problems: List[str] = []
    for v in values:
        check_rule(problems, key, v, is_positive, "every multiplier must be a positive number, e.g. [0.5,1,2]")
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
        "sweep.parallelism": sweep.parallelism, "sweep.gradient_sync": sweep.gradient_sync,
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


def check_sweep(sweep: SweepConfig) -> List[str]:
    problems: List[str] = []
    if not is_auto(sweep.micro_batch_sizes):
        problems += check_sizes("sweep.micro_batch_sizes", sweep.micro_batch_sizes, "[32,64]", ", or auto")
    problems += check_sizes("sweep.accumulation_steps", sweep.accumulation_steps, "[1,2]")
    problems += check_sizes("sweep.num_workers", sweep.num_workers, "[1,2]")
    if sweep.global_batch_sizes is not None:
        problems += check_sizes(
            "sweep.global_batch_sizes", sweep.global_batch_sizes, "[64,128]", ", or null to keep the whole grid"
        )
    check_rule(problems, "sweep.max_concurrent_trials", sweep.max_concurrent_trials, is_positive,
               "must be >= 1, or null")
    check_rule(
        problems, "sweep.points_per_worker_group", sweep.points_per_worker_group, is_positive,
        "must be >= 1, or null for one worker group for the whole grid",
    )
    if sweep.seeds is not None:
        problems += check_sizes("sweep.seeds", sweep.seeds, "[0,1,2]", ", or null for train.seed alone", least=0)
    problems += _multipliers(sweep.lr_multipliers)
    if sweep.context_lengths is not None:
        problems += check_sizes("sweep.context_lengths", sweep.context_lengths, "[64,128]",
                           ", or null for model.context alone", least=2)
        if is_auto(sweep.micro_batch_sizes):
            problems.append("sweep.context_lengths with sweep.micro_batch_sizes=auto: the frontier search runs at "
                            "model.context only; give the micro-batch sizes as a list, or sweep one context "
                            "(model.context) per sweep")
    problems += check_choices("sweep.precisions", sweep.precisions, PRECISIONS, "[fp32,bf16]")
    problems += check_choices(
        "sweep.activation_checkpointing", sweep.activation_checkpointing, CHECKPOINTING, "[none,blocks]"
    )
    problems += check_choices("sweep.parallelism", sweep.parallelism, PARALLELISMS, "[ddp,zero3]")
    problems += check_choices("sweep.gradient_sync", sweep.gradient_sync, GRADIENT_SYNCS, "[final,every]")
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


def check_branch(branch: BranchConfig) -> List[str]:
    problems: List[str] = []
    at = branch.at
    if not isinstance(at, list) or not at or not all(isinstance(f, (int, float)) and not isinstance(f, bool)
                                                     and math.isfinite(f) and 0 < f < 1 for f in at):
        problems.append(f"branch.at={at!r}: must be a list of fractions of the budget in (0, 1), e.g. [0.1,0.3,0.6]")
    check_rule(problems, "branch.base_global_batch", branch.base_global_batch, is_positive,
           "must be a positive global batch of the grid, or null (the grid's smallest)")
    check_rule(problems, "branch.window", branch.window, is_positive, "must be positive samples, or null (a twentieth "
           "of the budget)")
    check_rule(problems, "branch.tolerance", branch.tolerance, is_not_negative, "must be >= 0 (a loss rise), or null "
           "(measured from the trunk's noise)")
    check_rule(problems, "branch.confidence", branch.confidence, lambda c: 0 < c < 1, "must be in (0, 1), e.g. 0.95")
    if branch.lr_scaling not in ("auto", "none", "linear", "sqrt"):
        problems.append(f"branch.lr_scaling={branch.lr_scaling!r} is invalid: use auto, none, linear or sqrt")
    return problems


def check_smart(smart: SmartConfig) -> List[str]:
    problems: List[str] = []
    check_rule(problems, "smart.throughput_steps", smart.throughput_steps, is_positive, "must be >= 1, e.g. 30")
    check_rule(problems, "smart.eta", smart.eta, lambda n: n >= 2, "must be >= 2 (keep the best 1/eta), e.g. 3")
    check_rule(problems, "smart.rungs", smart.rungs, is_positive, "must be >= 1 (1: no halving), e.g. 3")
    check_rule(problems, "smart.confidence", smart.confidence, lambda c: 0 < c < 1, "must be in (0, 1), e.g. 0.95")
    if normalize_batch_coupled(smart.batch_coupled) is None:
        problems.append(f"smart.batch_coupled={smart.batch_coupled!r} is invalid: use auto, true or false")
    return problems


def check_frontier(frontier: FrontierConfig) -> List[str]:
    problems: List[str] = []
    for key in ("first_probe", "growth", "max_verifications", "multiple_of"):
        check_rule(problems, f"frontier.{key}", getattr(frontier, key), is_positive, "must be >= 1")
    check_rule(
        problems, "frontier.max_fit_probes", frontier.max_fit_probes, lambda n: n >= 2,
        "a line needs two probes, use >= 2",
    )
    check_rule(problems, "frontier.margin", frontier.margin, lambda m: 0 <= m < 1, "must be in [0, 1), e.g. 0.05")
    check_rule(problems, "frontier.verify_steps", frontier.verify_steps, is_not_negative, "must be >= 0")
    return problems
