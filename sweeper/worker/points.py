"""The point loop of a worker group: its points measured one after another, each one's failure agreed
by every rank, smaller points trained on the group's first ranks.

Knows torch only and reports through a callable (the cluster layer passes Ray Train's report).
"""

from __future__ import annotations

import datetime
import gc
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from sweeper.workloads import datasets, models
from sweeper import errors
from sweeper.measure import flops, telemetry
from sweeper.plan import GridPoint
from sweeper.schema import STATUSES, PointResult
from sweeper.worker import collectives as comm
from sweeper.worker.deadline import Deadline
from sweeper.worker.spec import GroupFacts, PointSpec, WorkerContext
from sweeper.worker.train import train_point

STATUS_ORDER = STATUSES  # the worst status over ranks wins
# Ranks that failed together reach the status exchange within seconds of each other; a rank still
# training after this long means the failure was one rank's alone.
STATUS_TIMEOUT = datetime.timedelta(seconds=120)

Report = Callable[[PointResult], None]


def run_points(
    specs: Sequence[PointSpec],
    ctx: WorkerContext,
    report: Report,
    group_start_time: Optional[float] = None,
    threads: int = 1,
    status_timeout: datetime.timedelta = STATUS_TIMEOUT,
    data: Optional[Dict[str, datasets.Splits]] = None,
) -> None:
    """Measure grid points one after another in this worker group, calling `report(result)` on every
    rank after each. The data and the per-group facts are loaded and measured once.

    A point with fewer workers than the group trains on ranks 0..n-1 (a sub-group) while the other
    ranks wait in `report`, Ray Train's own barrier: they hold no model and use no CPU meanwhile.

    Where a group's start-up goes (from `group_start_time`, the Tune trial's start) is logged on
    its first point; on every later point, the harness's gap since the previous one
    (`between_points_seconds`: reporting it, the checkpoint, Ray Train's report barrier).

    `data`: the splits the driver built, by datasets.key (cluster.shared_data): used instead of building
    them here.
    """
    entered = time.time()
    first = specs[0]
    device = telemetry.select(first.use_gpu, ctx.local_rank)
    # The data packed at each context the group trains (one for a sweep without sweep.context_lengths).
    loaded = {tuple(s.model.input_shape): None for s in specs}
    for shape in loaded:  # your loop's data, and your LightningDataModule's, are theirs to load
        if not yours(first):
            given = (data or {}).get(datasets.key(first.data, list(shape)))
            loaded[shape] = given if given is not None else datasets.load(first.data, list(shape))
    facts = group_facts(specs, device, ctx, threads)
    subgroups = comm.subgroups(sorted({s.point.num_workers for s in specs}), ctx, status_timeout)
    nodes = comm.gather_objects(ctx.node, ctx) if ctx.node else []
    meshes = comm.node_meshes(sorted({s.point.num_workers for s in specs if s.point.parallelism == "hsdp"}),
                              nodes or [ctx.node] * ctx.world_size, ctx)
    freeze_long_lived_objects()
    deadline = Deadline(first.timeout_seconds)
    ready = time.time()
    out_of_memory: List[GridPoint] = []
    previous_end: Optional[float] = None
    for i, spec in enumerate(specs):
        point_start = time.time()
        members = spec.point.num_workers
        result = _one_point(spec, ctx, subgroups, device, loaded[tuple(spec.model.input_shape)], facts, deadline,
                            out_of_memory, meshes)
        result.cost.worker_group_points = len(specs)
        if nodes:
            result.cost.update(placement(nodes[:members]))
        if i == 0 and group_start_time is not None:
            # Paid once by the group (Ray trial start to a worker ready to train): logged on the
            # group's first point only, so summing it over points does not count it twice.
            result.cost.update(startup_split(group_start_time, telemetry.process_start_time(), entered, ready))
        if previous_end is not None:
            result.cost.between_points_seconds = point_start - previous_end
        # Stamped before reporting: the report's round trip is the harness's cost between points.
        previous_end = time.time()
        report(result)


def placement(rank_nodes: Sequence[str]) -> Dict[str, Any]:
    """Where a point's ranks ran (Cost's figures): how many nodes, each rank's node as an index into the nodes
    in the order they first appear ("0,0,1,1": node by node, as Ray Train numbers ranks), and the nodes' ids."""
    order = list(dict.fromkeys(rank_nodes))
    return dict(num_nodes=len(order), rank_nodes=",".join(str(order.index(n)) for n in rank_nodes),
                nodes=",".join(order))


def _one_point(spec: PointSpec, ctx: WorkerContext, subgroups, device, splits, facts, deadline: Deadline,
               out_of_memory: List[GridPoint], meshes=None) -> PointResult:
    """This rank's result for one point of the group: measured on its members, idle on the other ranks,
    or oom without running when a point it needs no more memory than already ran out (`out_of_memory`,
    which a measured oom joins); failed on every rank, unrun, when its ranks make no hsdp mesh (`meshes`)."""
    members = spec.point.num_workers
    mesh = (meshes or {}).get(members) if spec.point.parallelism == "hsdp" else None
    if isinstance(mesh, str):  # every rank found the same nodes: the same line, agreed without a collective
        return PointResult(trial_key=spec.point.key, status="failed", error=mesh)
    cause = implied_oom(spec.point, out_of_memory)
    if cause is not None:
        # Every member saw the same agreed oom, so every member skips the same points.
        return PointResult(
            trial_key=spec.point.key, status="oom", oom_implied_by=cause.key,
            error=f"oom (implied): {cause.key} ran out of memory and this point needs at least as much",
        )
    if ctx.rank >= members:
        return PointResult(trial_key=spec.point.key, status="idle")  # rank 0's result is the one used
    group, status_group = subgroups.get(members, (ctx.group, None))
    member = WorkerContext(ctx.rank, members, ctx.local_rank, group, status_group, node=ctx.node, mesh=mesh)
    result = run_point(spec, member, device, splits, facts, deadline)
    if result.status == "oom":
        out_of_memory.append(spec.point)
    return result


def startup_split(group_start: float, process_start: Optional[float], entered: float, ready: float) -> Dict[str, float]:
    """A worker group's start-up, from the Tune trial's start to a worker ready to train, in its
    parts (wall-clock seconds; the clocks are one machine's when the trial and rank 0 share a node):
    launch, the Ray Train controller and worker actors up to the worker's process (0 when Ray reused
    a process it had started before the trial, and for a worker that runs in its trial's process);
    init, that process's imports (torch, Ray Train) and Ray Train's process-group setup, up to the
    training function; setup, the group's own work: the dataset, the peak FLOP/s measurement, the
    sub-groups."""
    launched = min(max(process_start, group_start), entered) if process_start is not None else group_start
    split = {
        "worker_group_startup_seconds": ready - group_start,
        "worker_group_init_seconds": entered - launched,
        "worker_group_setup_seconds": ready - entered,
    }
    if process_start is not None:
        split["worker_group_launch_seconds"] = launched - group_start
    return split


def freeze_long_lived_objects() -> None:
    # The collection after each point (its model and optimizer must go) would otherwise walk every
    # object torch, Ray and the data left behind: ~0.2 s a point here. They live as long as the
    # process, so move them out of the collector's sight.
    gc.collect()
    gc.freeze()


def implied_oom(point: GridPoint, out_of_memory: Sequence[GridPoint]) -> Optional[GridPoint]:
    """The point already out of memory that implies `point` is too: same workers, parallelism and recipe
    (precision, checkpointing), the same gradient sync or `every` for a `final` point (holding unsharded
    gradients never takes less memory than holding sharded ones), a context at least as long, a micro-batch at
    least as large, and accumulation if it accumulated
    (from the second micro-step on, the accumulated gradients are alive beside the next
    micro-batch's activations)."""
    for seen in out_of_memory:
        if (seen.num_workers, seen.parallelism, seen.recipe) != (point.num_workers, point.parallelism, point.recipe) \
                or seen == point:
            continue
        if (seen.gradient_sync != point.gradient_sync
                and (seen.gradient_sync, point.gradient_sync) != ("every", "final")):
            continue
        if (point.context or 0) < (seen.context or 0):
            continue
        # Accumulating (any number of steps > 1) holds gradients beside the activations: more memory
        # than one micro-batch per step, the same whatever the number of steps.
        if point.micro_batch_size >= seen.micro_batch_size and (
            (point.accumulation_steps > 1) >= (seen.accumulation_steps > 1)
        ):
            return seen
    return None


def group_facts(specs: Sequence[PointSpec], device: telemetry.Device, ctx: WorkerContext, threads: int) -> GroupFacts:
    counted = [s for s in specs if s.flop_count is not None]
    if not counted:
        return GroupFacts()
    peaks = {}
    for precision in sorted({s.point.precision for s in counted}):
        count = counted[0].flop_count
        if device.is_cuda:
            peak = flops.device_peak(device.name, True, count, threads, precision)
        else:
            # Every worker gets the same CPU share; one measurement on rank 0 stands for all of them.
            peak = flops.device_peak(device.name, False, count, threads, precision) if ctx.rank == 0 else None
            peak = comm.broadcast_object(peak, ctx)
        if peak is not None:
            peaks[precision] = peak
    return GroupFacts(peaks=peaks)


def _predictions(result: PointResult, spec: PointSpec) -> None:
    """A trained point's figures as predicted before it ran, each beside its error against what it measured:
    the fake-tensor peak (DDP), sharded_memory's peak (sharded) and the bytes a step sends."""
    tracked = result.memory.memory_tracked_peak_bytes
    if spec.memory_estimate_bytes is not None and tracked:
        result.memory.memory_estimated_peak_bytes = spec.memory_estimate_bytes
        result.memory.memory_estimate_error = spec.memory_estimate_bytes / tracked - 1.0
    if spec.memory_predicted_bytes is not None:
        result.memory.memory_predicted_bytes = spec.memory_predicted_bytes
        if tracked:
            result.memory.memory_prediction_error = spec.memory_predicted_bytes / tracked - 1.0
    sent, predicted = result.communication.communication_bytes_per_step, spec.communication_predicted_bytes
    if predicted is not None:
        result.communication.communication_predicted_bytes_per_step = predicted
        if sent:
            result.communication.communication_prediction_error = predicted / sent - 1.0


def run_point(
    spec: PointSpec,
    ctx: WorkerContext,
    device: Optional[telemetry.Device] = None,
    splits: Optional[datasets.Splits] = None,
    facts: Optional[GroupFacts] = None,
    deadline: Optional[Deadline] = None,
) -> PointResult:
    """One grid point, its failure included: every rank agrees on the status (ok | did_not_learn |
    diverged | oom | failed).

    A point that raises on every rank (bad model code, an OOM of the same size everywhere) is
    recorded and the group goes on to the next point. A rank that fails alone cannot agree with
    ranks still inside the step: the status exchange times out and the failure is re-raised, so
    Ray Train ends the worker group instead of leaving it hung in a collective.
    """
    start = time.time()
    raised: Optional[BaseException] = None
    if deadline is not None:
        deadline.arm(spec.point.key)
    try:
        result = _train(spec, ctx, device, splits, deadline)
    except Exception as exc:  # recorded as the point's result, never silently dropped
        result, raised = failure(exc), exc
    finally:
        if deadline is not None:
            deadline.disarm()
        gc.collect()  # the point's model and optimizer go before the next point is measured
        if device is not None:
            device.release_cached_memory()
    try:
        outcomes = comm.gather_objects((result.status, result.error), ctx, ctx.status_group)
    except Exception:
        if raised is not None:
            raise raised from None
        raise
    worst = max(outcomes, key=lambda o: STATUS_ORDER.index(o[0]))
    # A divergence or a did_not_learn every rank decided together (worker.divergence, from figures
    # all ranks share) keeps its result: how far it got, what it measured.
    agreed = worst[0] in ("diverged", "did_not_learn") and result.status == worst[0]
    if worst[0] != "ok" and not agreed:
        result = PointResult(status=worst[0], error=worst[1] or "failed on another rank",
                             oom_simulated=result.oom_simulated)
    elif worst[0] in ("ok", "did_not_learn"):  # trained to the end: its throughput and FLOPs stand
        result.flops.update(_flops_metrics(spec, result, facts or GroupFacts()))
        _predictions(result, spec)
    result.trial_key = spec.point.key
    result.started_at = start  # epoch seconds: the MLflow run's start, so its duration is the point's
    result.cost.trial_seconds = time.time() - start
    return result


def yours(spec: PointSpec) -> bool:
    """Whether the point trains with your loop (loop.fn) or Lightning's Trainer (model=lightning)."""
    return bool(spec.loop.fn) or spec.model.name == "lightning"


def _train(spec: PointSpec, ctx: WorkerContext, device, splits, deadline: Optional[Deadline]) -> PointResult:
    """The point trained by its loop: yours (worker.user_loop), Lightning's (worker.lightning_point), or the
    built-in one (worker.train)."""
    if spec.loop.fn:
        from sweeper.worker import user_loop

        return user_loop.train_point(spec, ctx, device, deadline)
    if spec.model.name == "lightning":
        from sweeper.worker import lightning_point

        return lightning_point.train_point(spec, ctx, device, deadline)
    return train_point(spec, ctx, device, splits, deadline)


def failure(exc: BaseException) -> PointResult:
    status, error, simulated = errors.failure(exc)
    return PointResult(status=status, error=error, oom_simulated=simulated or None)


def _flops_metrics(spec: PointSpec, result: PointResult, facts: GroupFacts) -> Dict[str, Any]:
    count, rate = spec.flop_count, result.throughput.samples_per_second
    if count is None or rate is None:
        return {}
    achieved = count.train_per_sample * rate
    out: Dict[str, Any] = {
        "flops_per_sample_forward": count.forward_per_sample,
        "flops_per_sample_train": count.train_per_sample,
        "flops_per_sample_hardware": count.hardware,
        "achieved_flops_per_second": achieved,
    }
    positions = models.positions(spec.model)
    if positions is not None:
        out["flops_per_token_train"] = count.train_per_sample / positions
    peak = facts.peaks.get(spec.point.precision)
    if peak is not None:
        # Every worker has the same device: the point's peak is one device's times the workers,
        # and its utilization is each device's share of the work against one device's peak.
        workers = spec.point.num_workers
        out.update(
            peak_flops_per_second=peak.flops_per_second * workers,
            peak_flops_source=peak.source,
            mfu=flops.mfu(achieved / workers, peak),
            hfu=flops.mfu(count.hardware * rate / workers, peak),
        )
    return out
