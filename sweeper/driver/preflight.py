"""Everything checked and prepared before Ray starts: the config's values, the model and data, the
store, the grid, and a PointSpec per point (with the model's FLOPs and memory estimated once).

All problems are collected into one ConfigError, so a bad sweep stops with one `error:` line each.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from sweeper import plan, recipe, tracking
from sweeper.cluster import storage
from sweeper.cluster.connect import Cluster
from sweeper.cluster.resources import capacity_problems
from sweeper.config import (AUTO_NEEDS_BUDGET, SweeperConfig, budget_bytes, is_auto, normalize_batch_coupled,
                            tracking_uri, validate, yours)
from sweeper.driver import console, predicted
from sweeper.driver.strategy import strategy_of
from sweeper.errors import ConfigError, first_line
from sweeper.measure import fake_memory, flops
from sweeper.plan import GridPoint
from sweeper.worker.spec import PointSpec, Span
from sweeper.workloads import datasets, models, streaming

NEEDS_BUDGET = AUTO_NEEDS_BUDGET


@dataclass
class Prepared:
    """What the checks before any point found out: the grid (empty until the frontier search when
    sweep.micro_batch_sizes=auto) and the facts of the data and model it is built from."""

    points: List[GridPoint]
    num_train: int
    num_classes: int
    # FLOPs per sample by activation checkpointing mode (its hardware FLOPs count the recompute).
    flop_counts: Dict[str, flops.FlopCount]
    # sweep.strategy=smart: the model's layers that mix a micro-batch's samples (smart.batch_coupled).
    batch_coupled: List[str] = field(default_factory=list)
    num_val: int = 0  # the held-out split's size (0: none)
    data_identity: Optional[str] = None  # what the data's config does not pin down (e.g. data=text's corpus digest)
    # sweep.context_lengths: per context, the training sequences at it and its FLOP counts (the fields
    # above are the model's own context's).
    contexts: Dict[int, Tuple[int, Dict[str, flops.FlopCount]]] = field(default_factory=dict)
    # A sweep with a sharded parallelism and a budget: the points predicted over it, each with its line
    # (driver.predicted: recorded out of memory, never launched).
    over_budget: Dict[GridPoint, str] = field(default_factory=dict)
    # Even ZeRO-3 at the largest worker count predicted over the budget: why data parallelism cannot hold the
    # model (driver.predicted.beyond_data_parallelism), said at the start and in the answer.
    beyond_data_parallelism: Optional[str] = None
    # Why the batches are the sweep's own (your collate, dict samples, your step), which the fake-tensor FLOP
    # count and memory estimate (built from model.input_shape) do not describe; None: they describe them.
    own_batches: Optional[str] = None
    # What makes the training yours (loop.fn=..., model=lightning): its model and data are its own, so nothing
    # of sweeper's model or data is built, counted or predicted; None: sweeper's own loop.
    yours: Optional[str] = None

    def at(self, context: Optional[int]) -> Tuple[int, Dict[str, flops.FlopCount]]:
        """(training samples, FLOP counts by checkpointing mode) at a point's context."""
        return self.contexts[context] if context is not None else (self.num_train, self.flop_counts)

    @property
    def auto(self) -> bool:
        return not self.points


def preflight(cfg: SweeperConfig) -> Tuple[Prepared, Dict[GridPoint, PointSpec]]:
    """Every check that needs no cluster, all problems collected into one ConfigError."""
    said = yours(cfg)  # your loop's or your LightningModule's model and data are theirs: not built here
    problems = validate(cfg)
    if said is None:
        problems += models.check(cfg.model, cfg.data.num_classes) + datasets.check(cfg.data, cfg.model.context)
    problems += tracking.check(tracking_uri(cfg.tracking))
    problems += [p for p in [storage.check(cfg.cluster.storage_path)] if p]
    if not problems and said is None:
        problems += check_recipe(cfg)
    auto = is_auto(cfg.sweep.micro_batch_sizes)
    if auto and cfg.device.memory_budget_gb is None and cfg.cluster.use_gpu == "auto" and cfg.cluster.address is None:
        import torch

        if not torch.cuda.is_available():  # a local Ray on a machine without a GPU: CPU workers
            problems.append(NEEDS_BUDGET)
    if not problems:
        # Before the grid: a layout the machine can never hold is the first thing to say (not, say,
        # that its points get too few steps).
        problems += local_capacity(cfg)
    points = [] if auto or problems else grid(cfg, problems)
    if points:
        problems += strategy_of(cfg.sweep.strategy).grid_problems(cfg, points)
    if problems:
        raise ConfigError(problems)
    warn_emulated(cfg)
    if said is not None:
        return your_training(cfg, points, said)
    splits = datasets.built(cfg.data, cfg.model.input_shape)  # the check's, for a factory: built once
    own = own_batches(cfg, splits.train)
    if own and (cfg.measure.flops or cfg.measure.memory_breakdown):
        console.warn(f"FLOPs (MFU) and the fake-tensor memory estimate are skipped: {own}; the points measure "
                     "throughput and memory as ever")
    counts = count_flops(cfg, splits.num_classes) if cfg.measure.flops and not own else {}
    prepared = Prepared(points, len(splits.train), splits.num_classes, counts, coupled_layers(cfg),
                        len(splits.val) if splits.val is not None else 0, splits.identity, own_batches=own)
    for context in cfg.sweep.context_lengths or []:
        at = at_context(cfg, context)
        train = len(datasets.built(cfg.data, at.model.input_shape).train)
        prepared.contexts[context] = (train, count_flops(at, splits.num_classes) if cfg.measure.flops else {})
    return prepared, (build_specs(cfg, prepared, points) if points else {})


def your_training(cfg: SweeperConfig, points: List[GridPoint], said: str
                  ) -> Tuple[Prepared, Dict[GridPoint, PointSpec]]:
    """The points of a sweep whose training is yours (`said`: loop.fn=..., model=lightning): the budget is
    train.samples, and nothing of a model or data is built, counted or estimated here (each point measures its
    throughput, memory and your evaluations as ever)."""
    own = f"the training is yours ({said})"
    if cfg.measure.flops or cfg.measure.memory_breakdown:
        console.warn(f"FLOPs (MFU) and the fake-tensor memory estimate are skipped: {own}; the points measure "
                     "throughput and memory as ever")
    prepared = Prepared(points, 0, 0, {}, own_batches=own, yours=said)
    return prepared, build_specs(cfg, prepared, points)


def own_batches(cfg: SweeperConfig, train: Any) -> Optional[str]:
    """Why the sweep's batches are its own, not the (input of model.input_shape, label) pairs sweeper's FLOP
    counter and memory estimate make up, in words; None when they are those."""
    if cfg.train.step_fn:
        return f"the loss is your step's (train.step_fn={cfg.train.step_fn})"
    if cfg.data.collate_fn:
        return f"batches are made by data.collate_fn={cfg.data.collate_fn}"
    if cfg.data._target_ and len(train):
        # a streamed train set has no index: its first sample, read as its loader would
        sample = next(iter(train)) if streaming.is_stream(train) else train[0]
        if isinstance(sample, Mapping) or (isinstance(sample, (tuple, list)) and isinstance(sample[0], Mapping)):
            return f"the samples of data._target_={cfg.data._target_} are mappings"
    return None


def at_context(cfg: SweeperConfig, context: Optional[int]) -> SweeperConfig:
    """The sweep as a point of `context` (sweep.context_lengths) sees it: samples of `context` tokens, the
    model itself (its position table, model.context) unchanged. None: the sweep as configured."""
    if context is None:
        return cfg
    return replace(cfg, model=replace(cfg.model, input_shape=[int(context)]))


def local_capacity(cfg: SweeperConfig) -> List[str]:
    """A local Ray's capacity is this machine's (cluster.num_cpus or every CPU, every visible GPU) and it
    cannot grow: a worker group larger than it is refused before Ray starts. A joined cluster is
    checked once connected (plan_resources), where an autoscaling one waits instead."""
    if cfg.cluster.address is not None:
        return []
    import torch

    gpus = torch.cuda.device_count() if cfg.cluster.use_gpu != "false" else 0
    local = Cluster("local", float(cfg.cluster.num_cpus or os.cpu_count() or 1), float(gpus), None, None, "")
    return capacity_problems(cfg.cluster, local, cfg.sweep.num_workers)


def coupled_layers(cfg: SweeperConfig) -> List[str]:
    """What makes the model's layouts train differently at equal global batch, found from its modules
    (smart.batch_coupled=auto) or as the user says: smart's accuracy classes, and the report's (every
    strategy records it as param batch_coupled_layers)."""
    said = normalize_batch_coupled(cfg.smart.batch_coupled)
    if said != "auto":
        return ["smart.batch_coupled=true"] if said == "true" else []
    return models.batch_coupled_layers(models.build_on_meta(cfg.model, cfg.data.num_classes))


def grid(cfg: SweeperConfig, problems: List[str]) -> List[GridPoint]:
    """The grid's points; a problem when sweep.global_batch_sizes keeps none of them."""
    sweep = cfg.sweep
    points = plan.expand_grid(
        sweep.micro_batch_sizes, sweep.accumulation_steps, sweep.num_workers, sweep.global_batch_sizes,
        sweep.precisions, sweep.activation_checkpointing, sweep.lr_multipliers, sweep.seeds, sweep.context_lengths,
        sweep.parallelism, sweep.gradient_sync,
    )
    if not points:
        unfiltered = plan.expand_grid(sweep.micro_batch_sizes, sweep.accumulation_steps, sweep.num_workers)
        available = sorted({p.global_batch_size for p in unfiltered})
        problems.append(
            f"sweep.global_batch_sizes={list(sweep.global_batch_sizes or [])} keeps no grid point "
            f"(micro x accumulation x workers gives {available}): choose from those or set it to null"
        )
    return points


def _point_spec(cfg: SweeperConfig, point: GridPoint, steps: int, flop_counts: Dict,
                estimate: Optional[int], prediction: Optional[Any] = None, budget: Optional[int] = None,
                communication: Optional[int] = None) -> PointSpec:
    """What one point's workers are told: its slice of the config, its scaled LR, its step budget (and the
    samples of its whole budget, which its LR schedule spans)."""
    return PointSpec(
        model=at_context(cfg, point.context).model,
        data=cfg.data,
        train=cfg.train,
        measure=cfg.measure,
        point=point,
        lr=point.lr_multiplier * plan.scaled_lr(
            cfg.optim.lr, point.global_batch_size, cfg.train.base_batch_size, cfg.train.lr_scaling
        ),
        steps=steps,
        optim=cfg.optim,
        loss=cfg.loss,
        eval=cfg.eval,
        divergence=cfg.divergence,
        gns=cfg.gns,
        profile=cfg.profile,
        flop_count=flop_counts.get(point.checkpointing),
        memory_budget_bytes=budget_bytes(cfg.device),
        memory_estimate_bytes=estimate,
        # the tensors' prediction, against the tracked step's (CUDA's margin is for the skip alone)
        memory_predicted_bytes=prediction.tensor_bytes if prediction is not None else None,
        communication_predicted_bytes=communication,
        timeout_seconds=cfg.cluster.point_timeout_seconds,
        start_from=cfg.train.start_from,
        schedule_samples=budget,
        loop=cfg.loop,
    )


def build_specs(cfg: SweeperConfig, prepared: Prepared, points: List[GridPoint]) -> Dict[GridPoint, PointSpec]:
    """A PointSpec per point, or a ConfigError naming every point too large for the data to time."""
    problems: List[str] = []
    estimates: Dict[GridPoint, int] = {}
    for context in sorted({p.context for p in points}, key=lambda c: c or 0) if not prepared.own_batches else []:
        # The fake-tensor step is a whole model's: a sharded point's is its prediction (driver.predicted).
        estimates.update(estimate_memory(at_context(cfg, context), [p for p in points if p.context == context
                                                                    and p.parallelism == "ddp"],
                                         prepared.num_classes))
    device = predicted.device_type(cfg)
    # Your loop's (loop.fn, model=lightning) memory is its own: measured, never predicted from sweeper's step.
    predictions = {} if prepared.yours is not None else predicted.predict(cfg, points, prepared.num_classes,
                                                                          at_context, device)
    sent = predicted.communication_per_step(cfg, points, prepared.num_classes)
    if not prepared.auto:  # a frontier's grid is measured to fit: never skipped by prediction
        prepared.over_budget = predicted.over_budget(predictions, budget_bytes(cfg.device))
        if prepared.yours is None:
            prepared.beyond_data_parallelism = predicted.beyond_data_parallelism(cfg, points, prepared.num_classes,
                                                                                 at_context, device)
    specs: Dict[GridPoint, PointSpec] = {}
    meta = start_meta(cfg, problems)
    start = int(meta["position"]["samples_seen"]) if meta else 0
    for point in points:
        num_train, counts = prepared.at(point.context)
        budget = plan.sample_budget(num_train, cfg.train.epochs, cfg.train.samples, point.context, cfg.model.context)
        # A continued point trains what is left of the budget after the checkpoint's samples.
        steps = plan.optimizer_steps(budget - start, 1, point.global_batch_size)
        spec = _point_spec(cfg, point, steps, counts, estimates.get(point), predictions.get(point), budget,
                           sent.get(point))
        problem = continuation_problem(cfg, spec, meta)
        if problem:  # the checkpoint's, the same for every point: said once
            problems.append(problem)
            break
        if cfg.train.batch_schedule:
            spans, problem = schedule_spans(cfg, point, budget)
            if problem:
                problems.append(problem)
                continue
            first_steps = spans[0].start_samples // point.global_batch_size if spans else steps
            spec = replace(spec, steps=first_steps, later_spans=spans)
            steps = min([first_steps, *(s.steps for s in spans)])
        # Enough timed windows for the stability rule to be met at all.
        need = spec.first_timed_step + cfg.measure.stable_windows
        if steps < need:
            untimed = "measure.warmup_steps" + (" + measure.profile_steps + 1" if cfg.profile else "")
            said = (f"train.samples={cfg.train.samples}" if cfg.train.samples is not None else
                    f"train.epochs={cfg.train.epochs}")
            problems.append(
                f"{said}: {point.key} (global batch {point.global_batch_size}) "
                f"gets {steps} optimizer steps from {budget - start} training samples"
                f"{' (a span of train.batch_schedule)' if cfg.train.batch_schedule else ''}, fewer than "
                f"{untimed} + measure.stable_windows = {need}; raise {said.split('=')[0]} or lower those"
            )
        specs[point] = spec
    if problems:
        raise ConfigError(problems)
    return specs


def schedule_spans(cfg: SweeperConfig, point: GridPoint, budget: int) -> Tuple[List[Span], Optional[str]]:
    """train.batch_schedule's spans after the first for `point` (its micro-batch and workers kept, the
    accumulation raised to each span's global batch, the LR scaled for it), or the problem in one line."""
    pairs = [(int(s), int(g)) for s, g in cfg.train.batch_schedule]
    key = f"train.batch_schedule={[list(p) for p in pairs]}"
    if point.global_batch_size != pairs[0][1]:
        return [], (f"{key} starts at global batch {pairs[0][1]}, but {point.key} trains at {point.global_batch_size}: "
                    f"keep the points at it, e.g. sweep.global_batch_sizes=[{pairs[0][1]}]")
    ends = [s for s, _ in pairs[1:]] + [budget]
    if ends[-1] <= pairs[-1][0]:
        return [], f"{key}: its last span starts at {pairs[-1][0]} samples, at or past the budget of {budget}"
    spans: List[Span] = []
    per_layout = point.micro_batch_size * point.num_workers
    for (start, batch), end in zip(pairs, ends):
        if batch % per_layout:
            return [], (f"{key}: global batch {batch} is not a whole number of {point.key}'s micro-batch x workers "
                        f"({per_layout}), so no accumulation reaches it")
        last = end == ends[-1]
        if not last and (end - start) % batch:
            return [], (f"{key}: the span from {start} samples at global batch {batch} must end on a whole step: "
                        f"make {end} a multiple of {batch} above {start}")
        if start == 0:
            continue
        at = replace(point, accumulation_steps=batch // per_layout)
        lr = point.lr_multiplier * plan.scaled_lr(cfg.optim.lr, batch, cfg.train.base_batch_size, cfg.train.lr_scaling)
        spans.append(Span(start, at, lr, (end - start) // batch))
    return spans, None


def start_meta(cfg: SweeperConfig, problems: List[str]) -> Optional[Dict[str, Any]]:
    """train.start_from's identity and position, read once (None without it); a problem when it is not a
    checkpoint."""
    if cfg.train.start_from is None:
        return None
    from sweeper.worker import state

    try:
        where = cfg.train.start_from
        if storage.is_uri(where):  # on cluster.storage_path's kind of storage: read here through Ray Train
            where = storage.fetch(where, {})
        meta = state.read_meta(where)
        if "identity" not in meta or "samples_seen" not in meta.get("position", {}):
            raise KeyError("its meta.json has no identity or position")
        return meta
    except Exception as exc:  # noqa: BLE001 - a missing, unreadable or foreign folder or URI: one line
        problems.append(f"train.start_from={cfg.train.start_from!r}: {first_line(exc)}; give a folder "
                        "train.save_state=true wrote (its path is the point's sweeper.checkpoint tag)")
        return None


def continuation_problem(cfg: SweeperConfig, spec: PointSpec, meta: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why `spec` cannot continue train.start_from's checkpoint (`meta`: another model, data, optimizer or
    seed, or no budget left), or None."""
    if meta is None:
        return None  # no checkpoint, or start_meta's problem
    from sweeper.worker import state

    mismatch = state.mismatch(meta["identity"], state.identity(spec))
    if mismatch:
        return (f"train.start_from={cfg.train.start_from!r} was saved by another {mismatch} ({spec.point.key}): "
                "continue from a checkpoint of the same model, data, optimizer and seed")
    if spec.steps <= 0:
        return (f"train.start_from={cfg.train.start_from!r} is at {meta['position']['samples_seen']} samples, less "
                f"than one global batch ({spec.point.global_batch_size}) short of this sweep's budget or past it: "
                "raise train.samples or train.epochs")
    return None


def estimate_memory(cfg: SweeperConfig, points: List[GridPoint], num_classes: int) -> Dict[GridPoint, int]:
    """Each point's fake-tensor estimate of its tracked peak, checked against the measured one in its
    worker (memory_estimate_error); nothing when the points do not track memory or the model cannot
    be traced on fake tensors."""
    if not cfg.measure.memory_breakdown:
        return {}
    try:
        return fake_memory.point_estimates(cfg, points, num_classes)
    except Exception as exc:  # noqa: BLE001 - an estimate is extra; the points measure regardless
        console.warn(f"memory not estimated for model {cfg.model.name!r}: {first_line(exc)}")
        return {}


def count_flops(cfg: SweeperConfig, num_classes: int) -> Dict[str, flops.FlopCount]:
    """FLOPs per sample for each activation checkpointing mode, counted once for the sweep on a
    model traced with fake tensors (nothing is computed or allocated): the model's own (MFU), and
    with checkpointing what the hardware computes, the recomputed forward included (HFU). A model
    that cannot be counted is measured without FLOPs, MFU and HFU."""
    def build(mode: str):
        def made():
            model = models.build(cfg.model, num_classes)
            recipe.apply_checkpointing(model, mode, cfg.model.checkpoint_modules)
            return model
        return made

    counts: Dict[str, flops.FlopCount] = {}
    try:
        samples = models.samples(cfg.model, num_classes)
        plain = flops.count_flops(build("none"), samples)
        for mode in cfg.sweep.activation_checkpointing:
            hardware = plain if mode == "none" else flops.count_flops(build(mode), samples)
            counts[mode] = replace(plain, hardware_per_sample=hardware.train_per_sample)
    except Exception as exc:  # the points themselves will say whether the model works
        console.warn(f"FLOPs not counted for model {cfg.model.name!r}: {first_line(exc)}")
    return counts


def check_recipe(cfg: SweeperConfig) -> List[str]:
    """What the recipe asks of the model and the device, tried before any worker starts:
    checkpointing and sharding need blocks to wrap, fp16 needs its ops on the device that will run them
    (and is refused under sharding)."""
    problems: List[str] = []
    model = models.build_on_meta(cfg.model, cfg.data.num_classes)
    if "blocks" in cfg.sweep.activation_checkpointing and not recipe.wrappable(model, cfg.model.checkpoint_modules):
        problems.append(
            f"sweep.activation_checkpointing=blocks: model {cfg.model.name!r} has no block to wrap (looked for "
            f"{', '.join(recipe.BLOCK_TYPES)}): name its block classes in model.checkpoint_modules, e.g. "
            "model.checkpoint_modules=[MyBlock], or use none"
        )
    problems += _sharding_problems(cfg, model)
    if "fp16" in cfg.sweep.precisions and cfg.cluster.use_gpu != "true" and not _gpu_here(cfg):
        failure = recipe.try_step(lambda: models.build(cfg.model, cfg.data.num_classes),
                                  models.samples(cfg.model, cfg.data.num_classes), "fp16")
        if failure:
            problems.append(
                f"sweep.precisions has fp16, which this model cannot train in on CPU ({failure}): use bf16 on "
                "CPU, or run on GPUs (cluster.use_gpu=true)"
            )
    return problems


def _sharding_problems(cfg: SweeperConfig, model) -> List[str]:
    """worker.sharding's refusals for every sharded parallelism x precision, each line once."""
    from sweeper.worker import sharding

    found: List[str] = []
    for parallelism in cfg.sweep.parallelism:
        for precision in cfg.sweep.precisions:
            found += sharding.problems(parallelism, precision, model, cfg.model.checkpoint_modules)
    return list(dict.fromkeys(found))


def warn_emulated(cfg: SweeperConfig) -> None:
    """One warning line per precision this machine's CPU only emulates, when the points train on it (a local Ray
    without GPUs): their throughput is labelled emulated, never the recipe's. A cluster's workers label their own."""
    if cfg.cluster.address is not None or cfg.cluster.use_gpu == "true" or not isinstance(cfg.sweep.precisions, list):
        return
    if cfg.cluster.use_gpu == "auto" and _gpu_here(cfg):
        return
    import torch

    for precision in cfg.sweep.precisions:
        reason = recipe.emulated_precision(precision, torch.device("cpu"))
        if reason:
            console.warn(f"sweep.precisions has {precision}: {reason}; its points are labelled emulated (tag "
                         "sweeper.throughput_emulated) and never ranked as the recipe's throughput")


def _gpu_here(cfg: SweeperConfig) -> bool:
    """Whether the points may run on a GPU: a cluster's GPUs are not known yet; a local Ray's are."""
    if cfg.cluster.address is not None:
        return True
    import torch

    return torch.cuda.is_available()
