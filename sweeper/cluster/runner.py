"""The Ray layer: connect to (or start) Ray, size trials to the cluster, and run one Ray Tune trial per
group of grid points, each a Ray Train `TorchTrainer` whose DDP workers measure the group's points in
turn (a point with fewer workers on the first ranks).

The only module that imports Ray. Results reach the caller through `on_trial_done` in the driver
process, so whatever records them (MLflow) never runs on a worker.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from sweeper.config import ClusterConfig
from sweeper.errors import ConfigError, first_line
from sweeper.plan import GridPoint

if TYPE_CHECKING:  # torch is imported by the workers, not by the driver's Ray layer
    from sweeper.inference.timing import InferenceSpec
    from sweeper.worker.step import FrontierSpec, TrialSpec

TrialCallback = Callable[[GridPoint, Dict[str, Any]], None]


@dataclass
class Cluster:
    address: str
    cpus: float
    gpus: float
    dashboard_url: Optional[str]
    token_path: Optional[str]
    results_dir: str
    # (CPUs, GPUs) of each alive node; None: one node holding everything.
    nodes: Optional[List[Tuple[float, float]]] = None

    @property
    def node_resources(self) -> List[Tuple[float, float]]:
        return self.nodes if self.nodes else [(self.cpus, self.gpus)]


@dataclass(frozen=True)
class Resources:
    use_gpu: bool
    cpus_per_worker: float
    cpus_per_trial: float
    threads_per_worker: int
    placement_strategy: str = "PACK"
    max_failures: int = 0


# The driver-side sinks of each Tune experiment's Relay callback, by experiment name. Tune pickles its
# callbacks into the experiment state; the sinks (an MLflow client, a progress bar) must stay out of
# it, and a restored experiment's Relay finds the sinks of the process that resumed it here.
_SINKS: Dict[str, "_RelayState"] = {}
STATE_FILE = "sweeper_worker_group.json"
ENDS_BEFORE_GIVING_UP = 2


def connect(cfg: ClusterConfig) -> Cluster:
    """Start a local Ray (address null) or join an existing one; a clean ConfigError if unreachable."""
    if cfg.address and cfg.address != "auto":
        _check_reachable(cfg.address)
    ray_dir = os.path.abspath(cfg.ray_dir)
    results_dir = os.path.join(ray_dir, "results")
    os.makedirs(results_dir, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Tune's own console tables would interleave with sweeper's progress bar and summary.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    token_path = None
    if cfg.address is None:
        # Ray 2.60 turns on token auth for a new local cluster and would write the token to
        # ~/.ray/auth_token; keep it with the rest of this tool's Ray files instead. Set before
        # Ray is imported: its config is read once per process.
        token_path = _ensure_token(ray_dir)
        os.environ.setdefault("RAY_AUTH_MODE", "token")

    import ray

    kwargs: Dict[str, Any] = dict(
        log_to_driver=False, logging_level=logging.WARNING, ignore_reinit_error=True
    )
    if cfg.address is None:
        kwargs.update(
            num_cpus=cfg.num_cpus or os.cpu_count(),
            include_dashboard=cfg.include_dashboard,
            dashboard_port=cfg.dashboard_port,
        )
    else:
        kwargs["address"] = cfg.address
    try:
        context = ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if cfg.address is None and "already occupied" in str(exc):
            raise ConfigError(
                [
                    f"cluster.dashboard_port={cfg.dashboard_port} is in use (another Ray or sweep is "
                    "running?): pick a free one, e.g. cluster.dashboard_port=8266, or set "
                    "cluster.include_dashboard=false"
                ]
            ) from None
        raise ConfigError(
            [
                f"cluster.address={cfg.address!r}: cannot join a Ray cluster ({first_line(exc)}); "
                "start one with `ray start --head`, or set cluster.address=null for a local Ray"
            ]
        ) from None
    resources = ray.cluster_resources()
    nodes = [
        (float(n["Resources"].get("CPU", 0.0)), float(n["Resources"].get("GPU", 0.0)))
        for n in ray.nodes()
        if n.get("Alive")
    ]
    dashboard = getattr(context, "dashboard_url", None) or None
    return Cluster(
        address=context.address_info.get("gcs_address", cfg.address or "local"),
        cpus=float(resources.get("CPU", 0.0)),
        gpus=float(resources.get("GPU", 0.0)),
        dashboard_url=f"http://{dashboard}" if dashboard and "://" not in dashboard else dashboard,
        token_path=token_path or os.environ.get("RAY_AUTH_TOKEN_PATH"),
        results_dir=results_dir,
        nodes=nodes,
    )


def plan_resources(cfg: ClusterConfig, cluster: Cluster, points: List[GridPoint]) -> Resources:
    """Per-worker resources for the largest trial, or a ConfigError instead of Ray's silent hang (a
    trial that asks for more than the cluster can place stays PENDING/RUNNING forever: Ray Train V2
    retries its worker group's start without limit).

    Placement is checked node by node for cluster.placement_strategy. With cpus_per_worker null, a
    trial that fits on one node gets the largest node's CPUs (one trial per node at a time, so
    co-located trials cannot distort each other's throughput); one that cannot is spread over the
    cluster with an equal share per worker."""
    max_workers = max(p.num_workers for p in points)
    use_gpu = cluster.gpus > 0 if cfg.use_gpu == "auto" else cfg.use_gpu == "true"
    nodes = cluster.node_resources
    strategy = cfg.placement_strategy
    problems = []
    if use_gpu and not _placeable([g for _, g in nodes], max_workers, 1.0, 0.0, strategy):
        problems.append(
            f"cluster.use_gpu={cfg.use_gpu}: the largest trial needs {max_workers} GPUs (one per worker, "
            f"{strategy}) but the Ray cluster's nodes have {[g for _, g in nodes]}; lower sweep.num_workers, "
            "change cluster.placement_strategy or set cluster.use_gpu=false"
        )
    cpus = [c for c, _ in nodes]
    cpus_per_worker = cfg.cpus_per_worker
    if cpus_per_worker is None:
        # Every worker gets the same CPU share whatever its trial's size, as it would get its own
        # GPU: trials with 1 and 2 workers are then comparable per worker.
        one_node = math.floor((max(cpus) - cfg.cpus_per_trial) / max_workers * 100) / 100
        fits_one_node = strategy != "STRICT_SPREAD" and _placeable(
            cpus, max_workers, one_node, cfg.cpus_per_trial, "STRICT_PACK"
        )
        share = math.floor((cluster.cpus - cfg.cpus_per_trial) / max_workers * 100) / 100
        while share > 0 and not _placeable(cpus, max_workers, share, cfg.cpus_per_trial, strategy):
            share = round(share - 0.01, 2)
        # On one node when that leaves each worker a whole CPU (or a GPU does the work): no network
        # between its workers; else spread, when that gives each worker more.
        cpus_per_worker = one_node if fits_one_node and (use_gpu or one_node >= 1 or one_node >= share) else share
    need = cfg.cpus_per_trial + max_workers * cpus_per_worker
    if cpus_per_worker <= 0 or need > cluster.cpus + 1e-9:
        problems.append(
            f"cluster.cpus_per_worker={cpus_per_worker:g}: the largest trial needs "
            f"{cfg.cpus_per_trial:g} (trial driver, cluster.cpus_per_trial) + {max_workers} workers x "
            f"{cpus_per_worker:g} = {need:g} CPUs but the Ray cluster has {cluster.cpus:g}; lower "
            "cluster.cpus_per_worker (null picks the largest share that fits) or sweep.num_workers"
        )
    elif not _placeable(cpus, max_workers, cpus_per_worker, cfg.cpus_per_trial, strategy):
        problems.append(
            f"cluster.cpus_per_worker={cpus_per_worker:g}: {max_workers} workers of {cpus_per_worker:g} CPUs "
            f"cannot be placed {strategy} on nodes with {cpus} CPUs; lower cluster.cpus_per_worker (null "
            "picks the largest share that fits) or change cluster.placement_strategy"
        )
    if problems:
        raise ConfigError(problems)
    return Resources(
        use_gpu=use_gpu,
        cpus_per_worker=cpus_per_worker,
        cpus_per_trial=cfg.cpus_per_trial,
        # Whole CPUs only: a thread on a fractional CPU competes with Ray's own processes and the
        # sampler, which showed as 8 % window-to-window noise with 2 threads on 1.99 CPUs here.
        threads_per_worker=max(1, math.floor(cpus_per_worker + 1e-9)),
        placement_strategy=strategy,
        max_failures=cfg.max_failures,
    )


def concurrent_trials(cluster: Cluster, resources: Resources, num_workers: int) -> int:
    """How many trials of `num_workers` workers the cluster holds at once (at least 1): one per node
    that holds a whole trial, by default sized to fill it."""
    per_trial = num_workers * resources.cpus_per_worker
    fits = 0
    for cpus, gpus in cluster.node_resources:
        by_cpu = int((cpus - resources.cpus_per_trial + 1e-9) // per_trial) if per_trial > 0 else 0
        by_gpu = int(gpus // num_workers) if resources.use_gpu else by_cpu
        fits += max(0, min(by_cpu, by_gpu))
    return max(1, fits)


def _placeable(capacity: List[float], workers: int, each: float, driver: float, strategy: str) -> bool:
    """Whether `workers` bundles of `each` fit on nodes of these capacities under a Ray placement
    strategy, with a trial driver of `driver` on the largest node."""
    if each <= 0:
        return False
    free = sorted(capacity, reverse=True)
    free[0] -= driver
    if strategy == "STRICT_PACK":
        return any(c + 1e-9 >= workers * each for c in free)
    if strategy == "STRICT_SPREAD":
        return sum(c + 1e-9 >= each for c in free) >= workers
    return sum(int((c + 1e-9) // each) for c in free) >= workers


def run_sweep(
    experiment: str,
    groups: List[List[GridPoint]],
    specs: Dict[GridPoint, "TrialSpec"],
    resources: Resources,
    cluster: Cluster,
    max_concurrent_trials: int,
    on_group_start: Callable[[List[GridPoint]], None],
    on_trial_done: TrialCallback,
    done_keys: frozenset = frozenset(),
    resume: bool = False,
) -> List[GridPoint]:
    """Run every group of grid points as one Ray Tune trial (one Ray Train worker group that measures
    its points one after another); `on_trial_done(point, result)` is called in this process as each
    point finishes, with `result["status"]` one of ok | oom | failed. Points in `done_keys` (already
    recorded) are not measured.

    With `resume`, Ray Tune restores the experiment of that name and runs its unfinished and errored
    trials again (finished ones are not); their worker groups skip `done_keys`.

    Returns the points never tried because their worker group died on an earlier point (a worker
    process killed more often than cluster.max_failures allows, a rank failing alone): the caller runs
    them again in a fresh group.
    """
    from ray import tune

    state = _RelayState(on_group_start, on_trial_done, frozenset(done_keys))
    _SINKS[experiment] = state
    trainable = tune.with_resources(
        tune.with_parameters(
            _group_trial,
            specs=specs,
            resources=resources,
            storage_path=cluster.results_dir,
            experiment=experiment,
            done_keys=frozenset(done_keys),
            # A resumed group starts a fresh Ray Train run: its old checkpoint may list points the
            # killed driver never recorded, and only what MLflow holds counts as done.
            run_suffix=f"-resumed{int(time.time())}" if resume else "",
        ),
        {"CPU": resources.cpus_per_trial},
    )
    if resume:
        tuner = tune.Tuner.restore(
            os.path.join(cluster.results_dir, experiment), trainable, resume_unfinished=True, resume_errored=True
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={"points": tune.grid_search([[p.as_dict() for p in group] for group in groups])},
            # Reusing the trial actor saves a process start and its imports (torch, via Ray Train's
            # TorchTrainer) for every group after the first; all groups ask for the same resources.
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent_trials, reuse_actors=True),
            run_config=tune.RunConfig(
                name=experiment,
                storage_path=cluster.results_dir,
                callbacks=[_relay(experiment)],
                verbose=0,
            ),
        )
    try:
        tuner.fit()
    finally:
        _SINKS.pop(experiment, None)
    return state.not_attempted


def can_resume(cluster: Cluster, experiment: str) -> bool:
    from ray import tune

    return tune.Tuner.can_restore(os.path.join(cluster.results_dir, experiment))


class _RelayState:
    """What the Relay callback hands results to, and what it remembers of them, in the driver."""

    def __init__(self, start: Callable[[List[GridPoint]], None], done: TrialCallback, skip: frozenset = frozenset()):
        self.start, self.done = start, done
        self.skip = skip  # recorded before a resume: not measured, not reported
        self.reported: Dict[str, set] = {}
        self.not_attempted: List[GridPoint] = []


def _relay(experiment: str):
    from ray import tune

    class Relay(tune.Callback):
        """Hands results to the caller, one per grid point; Tune calls these in the driver process.

        Its pickled state is the experiment's name only; the sinks are looked up in the running
        driver (`_SINKS`), so a restored experiment reports to the process that resumed it.
        """

        def __init__(self, key: str):
            self.key = key

        def __getstate__(self):
            return {"key": self.key}

        @property
        def state(self) -> _RelayState:
            # Looked up through the module: Tune pickles this class by value, with a copy of its globals.
            import importlib

            return importlib.import_module("sweeper.cluster.runner")._SINKS[self.key]

        def on_trial_start(self, iteration, trials, trial, **info):
            self.state.start(_points(trial))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            key = result.get("trial_key")
            by_key = {p.key: p for p in _points(trial)}
            if key not in by_key:
                return
            self.state.reported.setdefault(trial.trial_id, set()).add(key)
            self.state.done(by_key[key], {k: v for k, v in result.items() if k not in TUNE_FIELDS})

        def on_trial_complete(self, iteration, trials, trial, **info):
            for point in self._unreported(trial):
                self.state.done(point, {"status": "failed", "error": "the worker group ended without measuring it"})

        def on_trial_error(self, iteration, trials, trial, **info):
            error = trial.get_error()
            text = f"the worker group failed: {_last_line(str(error)) if error else 'no error recorded'}"
            unreported = self._unreported(trial)
            if unreported and self.state.reported.get(trial.trial_id):
                # Points are measured in order: the first unreported one was running when the group
                # died. The group had worked, so the rest were never tried: hand them back. A rank
                # that ran out of memory alone ends its group (the others wait inside the step's
                # all-reduce, so the ranks cannot agree): still an oom, not a failure.
                oom = "OutOfMemoryError" in text or "out of memory" in text or "can't allocate memory" in text
                self.state.done(unreported[0], {"status": "oom" if oom else "failed", "error": text})
                self.state.not_attempted += unreported[1:]
            else:  # the group never measured anything: whatever broke it would break them all
                for point in unreported:
                    self.state.done(point, {"status": "failed", "error": text})

        def _unreported(self, trial) -> List[GridPoint]:
            seen = self.state.reported.get(trial.trial_id, set()) | self.state.skip
            return [point for point in _points(trial) if point.key not in seen]

    return Relay(experiment)


# Fields Tune adds to every reported result; not the trial's own measurements.
TUNE_FIELDS = frozenset(
    "timestamp checkpoint_dir_name done training_iteration trial_id date time_this_iter_s "
    "time_total_s pid hostname node_ip config time_since_restore iterations_since_restore "
    "experiment_tag should_checkpoint".split()
)


def _points(trial) -> List[GridPoint]:
    return [GridPoint(**p) for p in trial.config["points"]]


def _group_trial(
    config: Dict[str, Any],
    specs,
    resources: Resources,
    storage_path: str,
    experiment: str,
    done_keys: frozenset = frozenset(),
    run_suffix: str = "",
) -> None:
    """The Tune function trainable: one TorchTrainer whose workers measure the group's points in turn
    (Train V2 cannot be passed to a Tuner directly). Each point's result reaches Tune through
    `TuneReportCallback`, so the driver records it as soon as it is measured."""
    start = time.time()
    points = [GridPoint(**p) for p in config["points"]]
    group_specs = [replace(specs[p], use_gpu=resources.use_gpu) for p in points if p.key not in done_keys]
    if not group_specs:
        return  # everything in this group was recorded before the sweep was interrupted
    _fit(
        _worker,
        {"specs": group_specs, "threads": resources.threads_per_worker, "group_start_time": start},
        # Sized to the group's largest point; smaller points use its first ranks.
        max(s.point.num_workers for s in group_specs),
        resources,
        f"{experiment}-{points[0].key}-x{len(points)}{run_suffix}",
        storage_path,
    )


def _fit(worker, loop_config: Dict[str, Any], num_workers: int, resources: Resources, name: str, storage_path: str):
    """One Ray Train worker group running `worker`, its reports relayed to the Tune trial it runs in."""
    from ray import train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    per_worker = {"CPU": resources.cpus_per_worker}
    if resources.use_gpu:
        per_worker["GPU"] = 1
    trainer = TorchTrainer(
        worker,
        train_loop_config=loop_config,
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
            failure_config=train.FailureConfig(max_failures=resources.max_failures),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def run_frontiers(
    experiment: str,
    fspecs: List["FrontierSpec"],
    resources: Resources,
    cluster: Cluster,
    on_probe: Callable[[int, Dict[str, Any]], None],
    on_frontier: Callable[[int, Dict[str, Any]], None],
) -> None:
    """One Ray Tune trial per worker count, each a worker group searching its memory frontier; every
    probe and then the frontier reach the caller in this process (`on_probe(num_workers, result)`,
    `on_frontier(num_workers, result)`, its `status` ok or failed). Searches run one after another:
    a probe's peak must not share the device with another's."""
    from ray import tune

    class Relay(tune.Callback):
        # As _relay's: the sinks are attributes left out of the pickled state, never closed over.
        def __init__(self, probe, found):
            self.probe, self.found = probe, found
            self.ended: set = set()

        def __getstate__(self):
            return {}

        def on_trial_result(self, iteration, trials, trial, result, **info):
            workers, key = trial.config["num_workers"], str(result.get("trial_key", ""))
            clean = {k: v for k, v in result.items() if k not in TUNE_FIELDS}
            if key.startswith("frontier-"):
                self.ended.add(workers)
                self.found(workers, clean)
            elif key.startswith("probe"):
                self.probe(workers, clean)

        def on_trial_error(self, iteration, trials, trial, **info):
            workers = trial.config["num_workers"]
            if workers not in self.ended:
                error = _last_line(str(trial.get_error()))
                self.found(workers, {"status": "failed", "error": f"the frontier search failed: {error}"})

    by_workers = {f.num_workers: replace(f, template=replace(f.template, use_gpu=resources.use_gpu)) for f in fspecs}
    trainable = tune.with_resources(
        tune.with_parameters(
            _frontier_trial,
            fspecs=by_workers,
            resources=resources,
            storage_path=cluster.results_dir,
            experiment=experiment,
        ),
        {"CPU": resources.cpus_per_trial},
    )
    tune.Tuner(
        trainable,
        param_space={"num_workers": tune.grid_search(sorted(by_workers))},
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(
            name=experiment, storage_path=cluster.results_dir, callbacks=[Relay(on_probe, on_frontier)], verbose=0
        ),
    ).fit()


def run_inference(
    experiment: str,
    groups: List[List["InferenceSpec"]],
    resources: Resources,
    cluster: Cluster,
    on_result: Callable[[Dict[str, Any]], None],
) -> None:
    """One Ray Tune trial per model (no worker group: inference runs in the trial's own process, with
    one worker's resources), timing its batch sizes smallest first; each result reaches
    `on_result` in this process as it is measured, then the device's facts (`trial_key` device-...).
    Trials run one after another: two would share the device and distort each other's latency."""
    from ray import tune

    class Relay(tune.Callback):
        # As _relay's: the sink is an attribute left out of the pickled state.
        def __init__(self, sink):
            self.sink = sink
            self.reported: Dict[str, int] = {}

        def __getstate__(self):
            return {}

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get("trial_key"):
                self.reported[trial.trial_id] = self.reported.get(trial.trial_id, 0) + 1
                self.sink({k: v for k, v in result.items() if k not in TUNE_FIELDS})

        def on_trial_error(self, iteration, trials, trial, **info):
            error = _last_line(str(trial.get_error()))
            for spec in groups[trial.config["group"]][self.reported.get(trial.trial_id, 0):]:
                self.sink({"trial_key": spec.key, "status": "failed", "batch_size": spec.batch_size,
                           "error": f"the inference trial failed: {error}"})

    per_trial = {"CPU": resources.cpus_per_worker + resources.cpus_per_trial}
    if resources.use_gpu:
        per_trial["GPU"] = 1
    trainable = tune.with_resources(
        tune.with_parameters(
            _inference_trial,
            groups=[[replace(s, use_gpu=resources.use_gpu) for s in group] for group in groups],
            threads=resources.threads_per_worker,
        ),
        per_trial,
    )
    tune.Tuner(
        trainable,
        param_space={"group": tune.grid_search(list(range(len(groups))))},
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(
            name=experiment, storage_path=cluster.results_dir, callbacks=[Relay(on_result)], verbose=0
        ),
    ).fit()


def _inference_trial(config: Dict[str, Any], groups, threads: int) -> None:
    from ray import tune

    from sweeper.inference.timing import run_inference_points
    from sweeper.measure import bandwidth, telemetry

    specs = groups[config["group"]]
    run_inference_points(specs, report=tune.report, threads=threads)
    # The device's memory bandwidth, for the roofline (a table on GPU, a large copy timed on CPU).
    measured = bandwidth.device_bandwidth(telemetry.select(specs[0].use_gpu), threads)
    facts: Dict[str, Any] = {"trial_key": f"device-{config['group']}", "role": "device"}
    if measured is not None:
        facts.update(bandwidth_bytes_per_second=measured.bytes_per_second, bandwidth_source=measured.source)
    tune.report(facts)


def _frontier_trial(config: Dict[str, Any], fspecs, resources: Resources, storage_path: str, experiment: str) -> None:
    workers = config["num_workers"]
    _fit(
        _frontier_worker,
        {"fspec": fspecs[workers], "threads": resources.threads_per_worker},
        workers,
        resources,
        f"{experiment}-w{workers}",
        storage_path,
    )


def _frontier_worker(config: Dict[str, Any]) -> None:
    import torch
    from ray import train

    from sweeper.worker.step import WorkerContext, run_frontier

    torch.set_num_threads(config["threads"])
    ctx = train.get_context()
    run_frontier(
        config["fspec"],
        WorkerContext(rank=ctx.get_world_rank(), world_size=ctx.get_world_size(), local_rank=ctx.get_local_rank()),
        report=train.report,
        threads=config["threads"],
    )


def _worker(config: Dict[str, Any]) -> None:
    """A worker of a group: measures the group's points, and after each reports its result with a
    checkpoint listing the points done, so a group restarted after a worker died (Ray Train's
    failure handling) goes on from the next point instead of measuring them again."""
    import json
    import tempfile

    import ray
    import torch
    from ray import train

    from sweeper.worker.step import WorkerContext, run_points

    torch.set_num_threads(config["threads"])
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    done: List[str] = []
    ended_by: Dict[str, int] = {}  # points that were running when the group died, and how often
    restarts = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, STATE_FILE)) as f:
            saved = json.load(f)
        done, ended_by, restarts = list(saved["done"]), dict(saved["ended_by"]), int(saved["restarts"]) + 1
    pending = [s for s in config["specs"] if s.point.key not in done]
    if checkpoint is not None and pending:
        # Points run in order: the first pending one was running when the group died.
        ended_by[pending[0].point.key] = ended_by.get(pending[0].point.key, 0) + 1

    def report(result: Dict[str, Any], first: bool = False) -> None:
        if not first:
            done.append(result["trial_key"])
            result["worker_group_restarts"] = restarts
        with tempfile.TemporaryDirectory() as folder:
            ckpt = None
            if rank == 0:  # one copy of the state is enough; every rank must still report
                with open(os.path.join(folder, STATE_FILE), "w") as f:
                    json.dump({"done": done, "ended_by": ended_by, "restarts": restarts}, f)
                ckpt = train.Checkpoint.from_directory(folder)
            train.report(result, checkpoint=ckpt)

    # A checkpoint before the first point: a restart is counted even if it comes before any point.
    report({"worker_group_started": 1}, first=True)
    if pending and ended_by.get(pending[0].point.key, 0) >= ENDS_BEFORE_GIVING_UP:
        # Twice is no accident (a rank failing alone on its own code, a worker OOM-killed every time):
        # record it and go on, rather than spend every restart on it.
        key = pending.pop(0).point.key
        report({"trial_key": key, "status": "failed", "error": (
            f"ended its worker group {ended_by[key]} times (a worker process died or a rank failed alone); "
            "not run again"
        )})
    run_points(
        pending,
        WorkerContext(
            rank=rank,
            world_size=ctx.get_world_size(),
            local_rank=ctx.get_local_rank(),
            node=ray.get_runtime_context().get_node_id(),
        ),
        # Every rank reports (Train V2's report is collective); rank 0's result reaches Tune.
        report=report,
        group_start_time=config["group_start_time"],
        threads=config["threads"],
    )


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _ensure_token(ray_dir: str) -> str:
    path = os.path.join(ray_dir, "auth_token")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # as Ray's own generator: 256 bits
    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    return path


def _check_reachable(address: str) -> None:
    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            return
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            [
                f"cluster.address={address!r} is unreachable ({reason}): check the head node's "
                "host:port (`ray status` on it), or set cluster.address=null to start a local Ray"
            ]
        ) from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"

