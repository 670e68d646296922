"""What runs in Ray's processes: the Tune trial of a worker group (it starts a Ray Train TorchTrainer)
and the training function each of its workers runs. Ray pickles these by reference (module path and
name): a sweep interrupted before a move of this module cannot be resumed by the moved code.

Results leave a worker as flat dicts of schema names (sweeper/schema.py) through Ray Train's report.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

import ray
import torch
from ray import train, tune
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback

from sweeper.cluster import recovery, shared_data, storage
from sweeper.cluster.resources import Resources, in_trial
from sweeper.cluster.records import GROUP_ERROR
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.worker.spec import WorkerContext

STATE_FILE = "sweeper_worker_group.json"
ENDS_BEFORE_GIVING_UP = 2


def group_trial(
    config: Dict[str, Any],
    specs,
    resources: Resources,
    storage_path: str,
    experiment: str,
    done_keys: frozenset = frozenset(),
    run_suffix: str = "",
    data: Optional[Dict[str, Any]] = None,
) -> None:
    """The Tune function trainable of a worker group: one TorchTrainer whose workers measure the
    group's points in turn (Train V2 cannot be passed to a Tuner directly), or, for a group of one
    worker, that worker's function in this process (`in_trial`). Each point's result reaches Tune as it
    is measured (through `TuneReportCallback` from a TorchTrainer), so the driver records it at once."""
    start = time.time()
    points = [GridPoint(**p) for p in config["points"]]
    group_specs = [replace(specs[p], use_gpu=resources.use_gpu) for p in points if p.key not in done_keys]
    if not group_specs:
        return  # everything in this group was recorded before the sweep was interrupted
    loop_config = {"specs": group_specs, "threads": resources.threads_per_worker, "group_start_time": start,
                   "data": data or {}}
    if in_trial(max(p.num_workers for p in points)):  # as its trial's resources were reserved (runs.py)
        point_worker({**loop_config, "in_trial": True})
        return
    # Sized to the group's largest point; smaller points use its first ranks.
    _fit(point_worker, loop_config, max(s.point.num_workers for s in group_specs), resources,
         f"{experiment}-{points[0].key}-x{len(points)}{run_suffix}", storage_path)


def frontier_trial(config: Dict[str, Any], fspecs, resources: Resources, storage_path: str, experiment: str,
                   data: Optional[Dict[str, Any]] = None) -> None:
    fspec = fspecs[config["search"]]
    if in_trial(fspec.num_workers):
        frontier_worker({"fspec": fspec, "threads": resources.threads_per_worker, "in_trial": True, "data": data})
        return
    _fit(
        frontier_worker,
        {"fspec": fspec, "threads": resources.threads_per_worker, "data": data or {}},
        fspec.num_workers,
        resources,
        f"{experiment}-{fspec.label}",
        storage_path,
    )


def inference_trial(config: Dict[str, Any], groups, threads: int) -> None:
    """A model's batch sizes timed in the trial's own process, then the device's memory bandwidth
    (a table on GPU, a large copy timed on CPU) for the roofline."""
    from sweeper.inference.latency import run_inference_points
    from sweeper.inference import bandwidth
    from sweeper.measure import telemetry

    specs = groups[config["group"]]
    run_inference_points(specs, report=lambda result: tune.report(result.to_flat()), threads=threads)
    measured = bandwidth.device_bandwidth(telemetry.select(specs[0].use_gpu), threads)
    facts: Dict[str, Any] = {"trial_key": f"device-{config['group']}", "role": "device"}
    if measured is not None:
        facts.update(bandwidth_bytes_per_second=measured.bytes_per_second, bandwidth_source=measured.source)
    tune.report(facts)


def _fit(worker: Callable, loop_config: Dict[str, Any], num_workers: int, resources: Resources, name: str,
         storage_path: str) -> None:
    """One Ray Train worker group running `worker`, its reports relayed to the Tune trial it runs in."""
    per_worker = {"CPU": resources.cpus_per_worker}
    if resources.use_gpu:
        per_worker["GPU"] = 1
    # Read by Ray Train where fit() runs (this trial's process) and passed on to its controller: how
    # long a worker group may wait to be placed before its start counts as a failure, and how often
    # the controller polls its workers (every transition of the group waits for a poll).
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(resources.start_timeout_seconds)
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(resources.health_check_seconds)
    _wait_while_held(num_workers, per_worker)
    trainer = TorchTrainer(
        worker,
        train_loop_config=loop_config,
        # The process group's collective timeout: a rank stuck in an all-reduce raises, not hangs.
        torch_config=TorchConfig(timeout_s=int(resources.collective_timeout_seconds)),
        scaling_config=train.ScalingConfig(
            num_workers=num_workers,
            use_gpu=resources.use_gpu,
            resources_per_worker=per_worker,
            placement_strategy=resources.placement_strategy,
        ),
        run_config=train.RunConfig(
            name=name,
            storage_path=storage_path,
            # A worker process that dies restarts the whole group (Ray Train's failure handling);
            # the restarted workers skip the points the group had reported (its checkpoint).
            # Finite everywhere (Ray Train's own defaults retry a start and a preemption forever).
            failure_config=train.FailureConfig(
                max_failures=resources.max_failures,
                controller_failure_limit=resources.max_failures,
                max_preemption_failures=resources.max_failures,
            ),
            callbacks=[TuneReportCallback()],
        ),
    )
    try:
        trainer.fit()
    except Exception as exc:  # noqa: BLE001 - relayed whole: the driver's sink turns it into the points' status
        # Ray Train restarted the group cluster.max_failures times already: the trial ends with the
        # error as its last result, not as a failure Tune would retry (Tune retries the trials whose
        # own process died, such as a group that runs in its trial: in_trial).
        tune.report({GROUP_ERROR: f"{type(exc).__name__}: {exc}"})


def _wait_while_held(num_workers: int, per_worker: Dict[str, float], every: float = 1.0) -> None:
    """Until the cluster has a worker group's resources free, while its totals hold them: another sweep or job
    sharing the cluster holds them now, and Ray Train's start timeout (cluster.start_timeout_seconds, retried
    cluster.max_failures times) would fail the group's points while it waits behind that work. A cluster whose
    totals lack them (a node lost, an autoscaler to ask) goes straight to Ray Train, whose start asks for them
    and times out as before."""
    need = {k: v * num_workers for k, v in per_worker.items()}
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        if any(total.get(k, 0.0) + 1e-9 < v for k, v in need.items()):
            return
        if all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
            return
        time.sleep(every)


def _api(config: Dict[str, Any]):
    """Where a worker's reports and checkpoints go: Ray Train's, or the Tune trial's (in_trial)."""
    return tune if config.get("in_trial") else train


def _context(config: Dict[str, Any]) -> WorkerContext:
    if config.get("in_trial"):
        return WorkerContext(rank=0, world_size=1, local_rank=0, node=ray.get_runtime_context().get_node_id())
    ctx = train.get_context()
    return WorkerContext(
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        node=ray.get_runtime_context().get_node_id(),
    )


def frontier_worker(config: Dict[str, Any]) -> None:
    from sweeper.worker.probes import run_frontier

    torch.set_num_threads(config["threads"])
    api = _api(config)
    run_frontier(config["fspec"], _context(config), report=lambda r: api.report(r.to_flat()), threads=config["threads"],
                 data=shared_data.resolve(config.get("data")))


class _GroupState:
    """The points a worker group has reported, kept in its checkpoints (Ray Train's, or the Tune
    trial's for a group that runs in its trial: `api`), so a group restarted after a worker died goes
    on from the next point instead of measuring them again."""

    def __init__(self, rank: int, api):
        self.rank, self.api = rank, api
        self.done: List[str] = []
        self.ended_by: Dict[str, int] = {}  # points that were running when the group died, and how often
        self.restarts = 0
        checkpoint = api.get_checkpoint()
        self.restarted = checkpoint is not None
        if checkpoint is not None:
            with checkpoint.as_directory() as folder, open(os.path.join(folder, STATE_FILE)) as f:
                saved = json.load(f)
            self.done, self.ended_by = list(saved["done"]), dict(saved["ended_by"])
            self.restarts = int(saved["restarts"]) + 1

    def report(self, result: Dict[str, Any]) -> None:
        """Every rank reports (Train V2's report is collective); rank 0's result reaches Tune, with
        a checkpoint of the points done."""
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if self.rank == 0:  # one copy of the state is enough
                with open(os.path.join(folder, STATE_FILE), "w") as f:
                    json.dump({"done": self.done, "ended_by": self.ended_by, "restarts": self.restarts}, f)
                checkpoint = self.api.Checkpoint.from_directory(folder)
            self.api.report(result, checkpoint=checkpoint)

    def report_point(self, result: PointResult) -> None:
        self.done.append(result.trial_key)
        result.cost.worker_group_restarts = self.restarts
        self.report(result.to_flat())


def point_worker(config: Dict[str, Any]) -> None:
    """A worker of a group: measures the group's points, reporting each with a checkpoint."""
    from sweeper.worker.points import run_points

    torch.set_num_threads(config["threads"])
    ctx = _context(config)
    state = _GroupState(ctx.rank, _api(config))
    pending = [s for s in config["specs"] if s.point.key not in state.done]
    if state.restarted and pending:
        # Points run in order: the first pending one was running when the group died.
        key = pending[0].point.key
        state.ended_by[key] = state.ended_by.get(key, 0) + 1
    # A checkpoint before the first point: a restart is counted even if it comes before any point.
    state.report({"worker_group_started": 1})
    if pending and state.ended_by.get(pending[0].point.key, 0) >= ENDS_BEFORE_GIVING_UP:
        # Twice is no accident (a rank failing alone on its own code, a worker OOM-killed every time):
        # record it and go on, rather than spend every restart on it.
        key = pending.pop(0).point.key
        state.report_point(PointResult(trial_key=key, status="failed", error=(
            f"ended its worker group {state.ended_by[key]} times (a worker process died or a rank failed alone); "
            "not run again"
        )))
    # Checkpoints on a URI (cluster.storage_path): downloaded to start from, written locally, uploaded by rank 0.
    with storage.Staged() as staged:
        pending = [staged.local(spec) for spec in pending]
        # A point half-trained when its group was lost goes on from its last save on the way (cluster.
        # checkpoint_every_steps), not from step 0.
        planned = {spec.point.key: spec for spec in pending}
        continued = {spec.point.key: recovery.resumed(spec) for spec in pending}
        pending = [continued[spec.point.key][0] for spec in pending]

        def report(result: PointResult) -> None:
            spec, done = continued.get(result.trial_key, (None, None))
            if done:
                recovery.made_whole(result, done, spec)
            if ctx.rank == 0:
                staged.persist(result)
                if result.trial_key in planned:
                    recovery.clear(planned[result.trial_key])
            state.report_point(result)

        run_points(pending, ctx, report, group_start_time=config["group_start_time"], threads=config["threads"],
                   data=shared_data.resolve(config.get("data")))
