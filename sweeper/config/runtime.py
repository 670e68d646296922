"""Where a sweep runs and records (device, cluster, tracking): every default once, each section's
checks, and the figures read from this machine (memory, CPUs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional

from sweeper.config.report import invalid_choice
from sweeper.config.rules import check_rule, is_not_negative, is_positive


USE_GPU_CHOICES = ("auto", "true", "false")


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class DeviceConfig:
    # GiB each worker's training step may hold. GPU: enforced for real with
    # torch.cuda.set_per_process_memory_fraction. CPU: simulated against the step's tracked peak
    # tensor memory (the memory-tracked last warm-up step), so a sweep here plans for a 16 or 24 GB
    # card; the op that would cross it raises an out-of-memory error, as an allocator does.
    # null: no budget (a GPU's whole memory).
    memory_budget_gb: Optional[float] = None


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
    # A point saves its training state every this many optimizer steps on the way (under
    # <storage>/<sweep>/resume/<point key>/, deleted once the point is recorded), so a point whose worker
    # group is lost (a node, a worker process) continues from its last save instead of step 0. Needs a
    # folder every node reads (cluster.storage_path, or the default on one machine). null: no saves.
    checkpoint_every_steps: Optional[int] = None
    # The network between workers, in gigabits per second per worker (400 for 400 Gb/s InfiniBand): what the
    # report's throughput model divides each parallelism's bytes per step by (report/throughput_model.py). null:
    # fitted from the sweep's points with more than one worker (none such: worker counts beyond one unpredicted).
    interconnect_gbps: Optional[float] = None


def normalize_use_gpu(value: Any) -> str:
    return str(value).strip().lower()


def normalize_batch_coupled(value: Any) -> Optional[str]:
    """auto | true | false (YAML may hand over a bool); None when it is none of them."""
    text = str(value).lower()
    return text if text in ("auto", "true", "false") else None


def check_device(device: DeviceConfig) -> List[str]:
    problems: List[str] = []
    check_rule(
        problems, "device.memory_budget_gb", device.memory_budget_gb, is_positive,
        "must be positive (GiB), or null for no budget",
    )
    return problems


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
    check_rule(problems, "cluster.max_failures", cluster.max_failures, is_not_negative, "must be >= 0 (0: no restarts)")
    for key in ("start_timeout_seconds", "collective_timeout_seconds", "point_timeout_seconds", "health_check_seconds"):
        check_rule(problems, f"cluster.{key}", getattr(cluster, key), is_positive,
                   "must be a positive number of seconds")
    check_rule(problems, "cluster.checkpoint_every_steps", cluster.checkpoint_every_steps, is_positive,
               "must be a positive number of optimizer steps, or null for no saves on the way")
    check_rule(problems, "cluster.interconnect_gbps", cluster.interconnect_gbps, is_positive,
               "must be a positive bandwidth in gigabits per second per worker (e.g. 400), or null to fit it from the "
               "points")
    check_rule(
        problems, "cluster.dashboard_port", cluster.dashboard_port, lambda port: 1 <= port <= 65535,
        "a TCP port must be between 1 and 65535, e.g. 8265",
    )
    return problems


def _check_cpus(cluster: ClusterConfig) -> List[str]:
    problems: List[str] = []
    check_rule(
        problems, "cluster.cpus_per_worker", cluster.cpus_per_worker, is_positive, "must be positive, or null for auto"
    )
    check_rule(
        problems, "cluster.cpus_per_trial", cluster.cpus_per_trial, is_positive,
        "must be positive (Ray rejects an empty resource request), e.g. 0.01",
    )
    check_rule(problems, "cluster.num_cpus", cluster.num_cpus, is_positive, "must be positive, or null")
    cores = os.cpu_count()
    if cluster.address is None and cores and cluster.num_cpus is not None and cluster.num_cpus > cores:
        # A local Ray told of CPUs it does not have runs that many workers on fewer cores, and every
        # throughput it measures is then the oversubscription's.
        problems.append(
            f"cluster.num_cpus={cluster.num_cpus}: this machine has {cores} CPUs (os.cpu_count()); a local "
            f"Ray may use at most those: use cluster.num_cpus<={cores}, or null for all of them"
        )
    return problems


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


def tracking_uri(cfg: TrackingConfig, cwd: Optional[str] = None) -> str:
    """The tracking URI to use: the configured one, else a SQLite store in the working directory."""
    if cfg.uri:
        return cfg.uri
    return f"sqlite:///{os.path.join(cwd or os.getcwd(), 'mlflow.db')}"
