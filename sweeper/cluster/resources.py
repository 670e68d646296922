"""Sizing worker groups to the cluster: CPUs per worker, placement node by node, how many run at once.

Pure arithmetic on what connect() found (no Ray import), so the hang Ray would meet (a trial that can
never be placed waits forever) is a ConfigError before anything starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from sweeper.cluster.connect import Cluster
from sweeper.config import ClusterConfig
from sweeper.errors import ConfigError
from sweeper.plan import GridPoint


@dataclass(frozen=True)
class Resources:
    use_gpu: bool
    cpus_per_worker: float
    cpus_per_trial: float
    threads_per_worker: int
    # The rest are ClusterConfig's, copied (their defaults and meaning live there).
    placement_strategy: str
    max_failures: int
    start_timeout_seconds: float
    collective_timeout_seconds: float
    health_check_seconds: float


def in_trial(num_workers: int) -> bool:
    """Whether a worker group of `num_workers` runs in its Tune trial's own process instead of a Ray Train
    worker group: a single worker needs no process group, and a Train run of one worker costs a
    controller and a worker process (~15 s here) before its first step."""
    return num_workers == 1


def trial_resources(resources: Resources, num_workers: int) -> dict:
    """What a Tune trial of a worker group reserves: its driver's share, and the worker's own
    resources when the worker runs in the trial (in_trial); Ray Train reserves a group's workers."""
    if not in_trial(num_workers):
        return {"CPU": resources.cpus_per_trial}
    return {"CPU": resources.cpus_per_trial + resources.cpus_per_worker, **({"GPU": 1} if resources.use_gpu else {})}


def plan_resources(cfg: ClusterConfig, cluster: Cluster, points: List[GridPoint],
                   note: Callable[[str], None] = print) -> Resources:
    """Per-worker resources for the largest worker group, or a ConfigError instead of Ray's silent hang (a
    trial that asks for more than the cluster can place stays PENDING/RUNNING forever: Ray Train V2
    retries its worker group's start without limit).

    Placement is checked node by node for cluster.placement_strategy. With cpus_per_worker null, a
    trial that fits on one node gets the largest node's CPUs (one trial per node at a time, so
    co-located trials cannot distort each other's throughput); one that cannot is spread over the
    cluster with an equal share per worker. A cluster that can grow is waited for: `note` (the driver's
    console) says so, the one place this arithmetic speaks."""
    max_workers = max(p.num_workers for p in points)
    use_gpu = wants_gpu(cfg, cluster)
    nodes = cluster.node_resources
    strategy = cfg.placement_strategy
    problems = capacity_problems(cfg, cluster, [max_workers])
    if problems and cluster.can_grow:
        note(waits_for_capacity(cfg, cluster, max_workers, use_gpu))
        return _resources(cfg, use_gpu, cfg.cpus_per_worker or 1.0)
    if problems:
        raise ConfigError(problems)
    if use_gpu and not _placeable([g for _, g in nodes], max_workers, 1.0, 0.0, strategy):
        problems.append(
            f"cluster.use_gpu={cfg.use_gpu}: the largest worker group needs {max_workers} GPUs (one per worker, "
            f"{strategy}) but the Ray cluster's nodes have {[g for _, g in nodes]}; lower sweep.num_workers, "
            "change cluster.placement_strategy or set cluster.use_gpu=false"
        )
    cpus = [c for c, _ in nodes]
    cpus_per_worker = cfg.cpus_per_worker
    if cpus_per_worker is None:
        cpus_per_worker = _cpu_share(cfg, cluster, max_workers, use_gpu)
    need = cfg.cpus_per_trial + max_workers * cpus_per_worker
    if cpus_per_worker <= 0 or need > cluster.cpus + 1e-9:
        problems.append(
            f"cluster.cpus_per_worker={cpus_per_worker:g}: the largest worker group needs "
            f"{cfg.cpus_per_trial:g} (trial driver, cluster.cpus_per_trial) + {max_workers} workers x "
            f"{cpus_per_worker:g} = {need:g} CPUs but the Ray cluster has {cluster.cpus:g}; lower "
            "cluster.cpus_per_worker (null picks the largest share that fits) or sweep.num_workers"
        )
    elif not _fits(cpus, max_workers, cpus_per_worker, cfg.cpus_per_trial, strategy):
        problems.append(
            f"cluster.cpus_per_worker={cpus_per_worker:g}: {max_workers} workers of {cpus_per_worker:g} CPUs "
            f"cannot be placed {strategy} on nodes with {cpus} CPUs; lower cluster.cpus_per_worker (null "
            "picks the largest share that fits) or change cluster.placement_strategy"
        )
    problems += mesh_problems(points, _workers_per_node(cluster, cpus_per_worker, cfg.cpus_per_trial, use_gpu))
    if problems:
        raise ConfigError(problems)
    held = held_by_others(cfg, cluster, max_workers, cpus_per_worker, use_gpu)
    if held:
        note(held)
    return _resources(cfg, use_gpu, cpus_per_worker)


def held_by_others(cfg: ClusterConfig, cluster: Cluster, max_workers: int, cpus_per_worker: float,
                   use_gpu: bool) -> Optional[str]:
    """What a sweep says when its largest worker group fits the cluster but not what other work (another
    sweep, a job) leaves free now: its groups wait for it (Ray places them when it is released), sized for
    the cluster as a sweep alone on it would be, so the two sweeps' measurements compare. None: it fits."""
    if not cluster.free:
        return None
    cpus, gpus = [c for c, _ in cluster.free], [g for _, g in cluster.free]
    strategy = cfg.placement_strategy
    fits = _fits(cpus, max_workers, cpus_per_worker, cfg.cpus_per_trial, strategy)
    if use_gpu:
        fits = fits and _placeable(gpus, max_workers, 1.0, 0.0, one_node(strategy, max_workers))
    if fits:
        return None
    need = cfg.cpus_per_trial + max_workers * cpus_per_worker
    return (f"the Ray cluster is busy: other work holds its resources (free CPUs per node now {_round(cpus)} of "
            f"{_round([c for c, _ in cluster.node_resources])}{f', GPUs {_round(gpus)}' if use_gpu else ''}); this "
            f"sweep's largest worker group ({need:g} CPUs{f', {max_workers} GPUs' if use_gpu else ''}) waits until "
            "they are released")


def _workers_per_node(cluster: Cluster, cpus_per_worker: float, cpus_per_trial: float, use_gpu: bool) -> List[int]:
    """How many workers each node holds (by CPUs, and GPUs when workers take one), a trial's driver on the largest."""
    free = sorted(((c, g) for c, g in cluster.node_resources), reverse=True)
    held = []
    for i, (cpus, gpus) in enumerate(free):
        by_cpu = int((cpus - (cpus_per_trial if i == 0 else 0.0) + 1e-9) // cpus_per_worker) if cpus_per_worker > 0 \
            else 0
        held.append(min(by_cpu, int(gpus + 1e-9)) if use_gpu else by_cpu)
    return held


def mesh_problems(points: Sequence[GridPoint], per_node: List[int]) -> List[str]:
    """An hsdp point's mesh is (nodes, ranks per node), the same count on every node it spans: a worker count w
    for which no k dividing w has w / k nodes holding k workers each can never be placed so (its ranks would
    split unevenly whatever Ray chose); one line per such count. A placement Ray makes unevenly although an even
    one exists is the point's error when it trains (plan.mesh_by_node)."""
    found = []
    for workers in sorted({p.num_workers for p in points if p.parallelism == "hsdp" and not in_trial(p.num_workers)}):
        splits = [k for k in range(1, workers + 1) if workers % k == 0]
        if any(sum(n >= k for n in per_node) >= workers // k for k in splits):
            continue
        found.append(f"sweep.parallelism=hsdp at {workers} workers: the Ray cluster's nodes hold {per_node} workers "
                     f"each, so no placement puts the same number of ranks on every node it uses, and HSDP's mesh "
                     "(nodes, ranks per node) needs that; use a worker count they split evenly, or parallelism zero3")
    return found


def _round(values: List[float]) -> List[float]:
    return [round(v, 2) for v in values]


def one_node(strategy: str, workers: int) -> str:
    return "STRICT_PACK" if in_trial(workers) else strategy


def _resources(cfg: ClusterConfig, use_gpu: bool, cpus_per_worker: float) -> Resources:
    return Resources(
        use_gpu=use_gpu,
        cpus_per_worker=cpus_per_worker,
        cpus_per_trial=cfg.cpus_per_trial,
        # Whole CPUs only: a thread on a fractional CPU competes with Ray's own processes and the
        # sampler, which showed as 8 % window-to-window noise with 2 threads on 1.99 CPUs here.
        threads_per_worker=max(1, math.floor(cpus_per_worker + 1e-9)),
        placement_strategy=cfg.placement_strategy,
        max_failures=cfg.max_failures,
        start_timeout_seconds=cfg.start_timeout_seconds,
        collective_timeout_seconds=cfg.collective_timeout_seconds,
        health_check_seconds=cfg.health_check_seconds,
    )


# The smallest CPU share a worker is given (cluster.cpus_per_worker=null): Ray counts CPUs in hundredths.
MIN_CPU_SHARE = 0.01


def wants_gpu(cfg: ClusterConfig, cluster: Cluster) -> bool:
    """Workers on GPUs: cluster.use_gpu=auto when the cluster has any, else as the key says."""
    return cluster.gpus > 0 if cfg.use_gpu == "auto" else cfg.use_gpu == "true"


def capacity_problems(cfg: ClusterConfig, cluster: Cluster, num_workers: Sequence[int]) -> List[str]:
    """What the largest worker group asks beyond the whole cluster's CPUs and GPUs, one line each naming
    the key to lower (sweep.num_workers or cluster.cpus_per_worker) and the capacity. Checked before the
    grid starts for a local Ray (whose capacity is this machine's), and again once a cluster is joined;
    placement node by node is plan_resources' part."""
    max_workers = max(num_workers)
    asked = f"sweep.num_workers=[{','.join(str(n) for n in num_workers)}]"
    has = f"the Ray cluster has {cluster.cpus:g} CPUs and {cluster.gpus:g} GPUs{_which(cluster)}"
    use_gpu = wants_gpu(cfg, cluster)
    problems: List[str] = []
    if use_gpu and max_workers > cluster.gpus + 1e-9:
        key = asked if cluster.gpus >= 1 else f"cluster.use_gpu={cfg.use_gpu}"  # no GPU at all: that is the fix
        problems.append(
            f"{key}: the largest worker group asks {max_workers} workers of one GPU each but {has}; "
            f"use sweep.num_workers of at most {int(cluster.gpus + 1e-9)}, or cluster.use_gpu=false"
        )
    free = cluster.cpus - cfg.cpus_per_trial
    each = cfg.cpus_per_worker
    if each is not None and each > free + 1e-9:
        problems.append(
            f"cluster.cpus_per_worker={each:g}: one worker asks more CPUs than there are: {has} (less "
            f"{cfg.cpus_per_trial:g} for the trial driver, cluster.cpus_per_trial); lower it to at most "
            f"{math.floor(free * 100) / 100:g}, or null for an equal share"
        )
    elif each is not None and max_workers * each > free + 1e-9:
        problems.append(
            f"cluster.cpus_per_worker={each:g}: the largest worker group needs {cfg.cpus_per_trial:g} (trial "
            f"driver, cluster.cpus_per_trial) + {max_workers} workers x {each:g} = "
            f"{cfg.cpus_per_trial + max_workers * each:g} CPUs but {has}; lower cluster.cpus_per_worker (null "
            f"picks the largest share that fits) or {asked} (at most {int((free + 1e-9) // each)} workers)"
        )
    elif each is None and max_workers * MIN_CPU_SHARE > free + 1e-9:
        problems.append(
            f"{asked}: the largest worker group asks {max_workers} workers but {has}, at least "
            f"{MIN_CPU_SHARE:g} CPU per worker; use sweep.num_workers of at most "
            f"{int((free + 1e-9) // MIN_CPU_SHARE)}"
        )
    return problems


def waits_for_capacity(cfg: ClusterConfig, cluster: Cluster, max_workers: int, use_gpu: bool) -> str:
    """What an autoscaling cluster's sweep says when its largest worker group does not fit yet."""
    per = "one GPU" if use_gpu else f"{cfg.cpus_per_worker or 1.0:g} CPUs"
    return (
        f"the largest worker group asks {max_workers} workers of {per} each, more than the Ray cluster has "
        f"now ({cluster.cpus:g} CPUs, {cluster.gpus:g} GPUs); the cluster autoscales, so the sweep waits for "
        f"nodes (each try up to cluster.start_timeout_seconds={cfg.start_timeout_seconds:g})"
    )


def _which(cluster: Cluster) -> str:
    return " (a local Ray: this machine's, or cluster.num_cpus)" if cluster.address == "local" else ""


def _cpu_share(cfg: ClusterConfig, cluster: Cluster, max_workers: int, use_gpu: bool) -> float:
    """cluster.cpus_per_worker=null: every worker gets the same CPU share whatever its group's size,
    as it would get its own GPU, so groups of 1 and 2 workers are comparable per worker."""
    cpus, strategy = [c for c, _ in cluster.node_resources], cfg.placement_strategy
    one_node = math.floor((max(cpus) - cfg.cpus_per_trial) / max_workers * 100) / 100
    fits_one_node = strategy != "STRICT_SPREAD" and _fits(cpus, max_workers, one_node, cfg.cpus_per_trial,
                                                          "STRICT_PACK")
    share = math.floor((cluster.cpus - cfg.cpus_per_trial) / max_workers * 100) / 100
    while share > 0 and not _fits(cpus, max_workers, share, cfg.cpus_per_trial, strategy):
        share = round(share - 0.01, 2)
    # On one node when that leaves each worker a whole CPU (or a GPU does the work): no network
    # between its workers; else spread, when that gives each worker more.
    return one_node if fits_one_node and (use_gpu or one_node >= 1 or one_node >= share) else share


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


def _fits(capacity: List[float], workers: int, each: float, driver: float, strategy: str) -> bool:
    """_placeable for a worker group: a worker in its trial's process (in_trial) is one bundle with the
    trial's driver, on one node whatever the strategy."""
    if in_trial(workers):
        return _placeable(capacity, 1, each + driver, 0.0, "STRICT_PACK")
    return _placeable(capacity, workers, each, driver, strategy)


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
