"""Ray itself: start a local Ray or join a cluster, what it holds, and shutting it down.

Ray is imported inside connect(), after the environment it reads once per process is set.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from sweeper.config import ClusterConfig
from sweeper.errors import ConfigError, first_line


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
    # An autoscaling cluster adds nodes for work that does not fit: a group too large waits, not refused.
    can_grow: bool = False

    @property
    def node_resources(self) -> List[Tuple[float, float]]:
        return self.nodes if self.nodes else [(self.cpus, self.gpus)]


def connect(cfg: ClusterConfig) -> Cluster:
    """Start a local Ray (address null) or join an existing one; a clean ConfigError if unreachable."""
    if cfg.address and cfg.address != "auto":
        _check_reachable(cfg.address)
    ray_dir = os.path.abspath(cfg.ray_dir)
    results_dir = os.path.join(ray_dir, "results")
    os.makedirs(results_dir, exist_ok=True)
    token_path = _prepare_environment(cfg, ray_dir)
    import ray

    context = _init(cfg)
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
        can_grow=cfg.address is not None and _autoscales(),
    )


def _autoscales() -> bool:
    """Whether the joined cluster's autoscaler may add nodes: a node type whose max_count is unlimited
    (-1) or above its min_count, Ray Data's own rule (ray.data's is_autoscaling_enabled). No autoscaler
    config (a fixed cluster, `ray start` by hand): False."""
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:  # noqa: BLE001 - a private API; without it the cluster is treated as fixed
        return False
    if not config or not config.node_group_configs:
        return False
    return any(g.max_count == -1 or g.max_count > g.min_count
               for g in config.node_group_configs if g.resources and g.max_count != 0)


# Tune's ExperimentAnalysis warns for every trial that result.json and progress.csv are missing:
# they are missing because TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1 above, on purpose.
TUNE_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"


class MissingTrialLogsFilter(logging.Filter):
    """Drops only Tune's "Failed to fetch metrics ... result.json and progress.csv" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            message.startswith("Failed to fetch metrics") and "result.json" in message and "progress.csv" in message
        )


def install_log_filter() -> None:
    logger = logging.getLogger(TUNE_ANALYSIS_LOGGER)
    if not any(isinstance(f, MissingTrialLogsFilter) for f in logger.filters):
        logger.addFilter(MissingTrialLogsFilter())


def _prepare_environment(cfg: ClusterConfig, ray_dir: str) -> Optional[str]:
    """What Ray reads once per process, set before it is imported; the local cluster's token path."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Tune's own console tables would interleave with sweeper's progress bar and summary.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune's automatic CSV, JSON and TensorBoard loggers (read by tune.run, inside Tuner.fit() in this
    # process) would write progress.csv, result.json and events.out.tfevents per trial; a trial is a
    # worker group of several points, so their curves would join unrelated points. The points' record
    # is MLflow. TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=0 in the environment brings them back.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    install_log_filter()
    if cfg.address is not None:
        return None
    # Ray 2.60 turns on token auth for a new local cluster and would write the token to
    # ~/.ray/auth_token; keep it with the rest of this tool's Ray files instead.
    token_path = _ensure_token(ray_dir)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    return token_path


def _init(cfg: ClusterConfig) -> Any:
    """ray.init for a local Ray or an existing cluster; what goes wrong as one ConfigError line."""
    import ray

    kwargs: Dict[str, Any] = dict(log_to_driver=False, logging_level=logging.WARNING, ignore_reinit_error=True)
    if cfg.address is None:
        kwargs.update(
            # "local": a new Ray of our own. With no address ray.init joins any Ray already running
            # here (another sweep's, a `ray start`), and then refuses num_cpus.
            address="local",
            num_cpus=cfg.num_cpus or os.cpu_count(),
            include_dashboard=cfg.include_dashboard,
            dashboard_port=cfg.dashboard_port,
        )
    else:
        kwargs["address"] = cfg.address
    try:
        return ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if cfg.address is None and "already occupied" in str(exc):
            raise ConfigError([
                f"cluster.dashboard_port={cfg.dashboard_port} is in use (another Ray or sweep is "
                "running?): pick a free one, e.g. cluster.dashboard_port=8266, or set cluster.include_dashboard=false"
            ]) from None
        raise ConfigError([
            f"cluster.address={cfg.address!r}: cannot join a Ray cluster ({first_line(exc)}); "
            "start one with `ray start --head`, or set cluster.address=null for a local Ray"
        ]) from None


def can_resume(results_dir: str, experiment: str) -> bool:
    """Whether Ray Tune can restore `experiment` from its folder under `results_dir` (no Ray needed)."""
    from ray import tune

    return tune.Tuner.can_restore(os.path.join(results_dir, experiment))


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
