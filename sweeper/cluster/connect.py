"""Ray itself: start a local Ray or join a cluster, what it holds, and shutting it down.

Ray is imported inside connect(), after `environment.prepare()` set what it reads once per process.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from sweeper.cluster import environment
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
    # (CPUs, GPUs) free on each alive node when the sweep joined (others' work holds the rest); None: all.
    free: Optional[List[Tuple[float, float]]] = None

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
    env = environment.prepare(cfg)
    environment.write_token(env)
    install_log_filter()
    import ray

    context = _init(cfg, env)
    resources = ray.cluster_resources()
    nodes = [
        (float(n["Resources"].get("CPU", 0.0)), float(n["Resources"].get("GPU", 0.0)))
        for n in ray.nodes()
        if n.get("Alive")
    ]
    free = _free_per_node([n["NodeID"] for n in ray.nodes() if n.get("Alive")]) if cfg.address else None
    dashboard = getattr(context, "dashboard_url", None) or None
    return Cluster(
        address=context.address_info.get("gcs_address", cfg.address or "local"),
        cpus=float(resources.get("CPU", 0.0)),
        gpus=float(resources.get("GPU", 0.0)),
        dashboard_url=f"http://{dashboard}" if dashboard and "://" not in dashboard else dashboard,
        token_path=env.token_path,
        results_dir=results_dir,
        nodes=nodes,
        can_grow=cfg.address is not None and _autoscales(),
        free=free,
    )


def _free_per_node(node_ids: List[str]) -> Optional[List[Tuple[float, float]]]:
    """(CPUs, GPUs) free now on each of these nodes: what a joined cluster's other work (another sweep, a
    job) leaves. None when Ray cannot say (a private API)."""
    try:
        import ray._private.state

        free = ray._private.state.available_resources_per_node()
    except Exception:  # noqa: BLE001 - a private API; without it the check counts the totals only
        return None
    return [(float(free.get(n, {}).get("CPU", 0.0)), float(free.get(n, {}).get("GPU", 0.0))) for n in node_ids]


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


def _init(cfg: ClusterConfig, env: environment.RayEnvironment) -> Any:
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
        if cfg.address is not None:
            _probe_token(cfg.address)
        return ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError([start_problem(cfg, env, exc)]) from None


def _probe_token(address: str) -> None:
    """A refused token raised at once: ray.init retries a refused token for 20 s, one log line a
    second, before it fails. One GCS client call (Ray's private API) answers in milliseconds; only its
    refusal counts, anything else is left for ray.init to report."""
    import ray

    if "://" in address or address == "auto":
        return  # Ray Client (ray://) and auto-discovery resolve the address themselves
    try:
        from ray._raylet import GcsClient

        GcsClient(address=address)
    except ray.exceptions.AuthenticationError as exc:
        raise ConnectionError(str(exc)) from exc
    except Exception:  # noqa: BLE001 - a private API: any other outcome is ray.init's to report
        return


# What Ray's errors say, innermost cause included (ray.init wraps the GCS client's error in a
# ConnectionError whose own text names only the address).
AUTH_MARKERS = ("InvalidAuthToken", "AuthenticationError", "Authentication token")
PORT_MARKERS = ("already occupied", "Address already in use", "address already in use")


def start_problem(cfg: ClusterConfig, env: environment.RayEnvironment, exc: BaseException) -> str:
    """One line: what failed when starting or joining Ray (the token, a port, the address), and a fix
    that is not the value already set."""
    text = " ".join(str(e) for e in _chain(exc))
    if cfg.address is None:
        what = f"cannot start a local Ray (cluster.address=null, files in cluster.ray_dir={cfg.ray_dir!r})"
        if any(m in text for m in PORT_MARKERS):
            return (f"cluster.dashboard_port={cfg.dashboard_port} is in use (another Ray or sweep is running?): "
                    "pick a free one, e.g. cluster.dashboard_port=8266, or set cluster.include_dashboard=false")
        if any(m in text for m in AUTH_MARKERS):
            return (f"{what}: it refused its own token ({env.describe_token()}): Ray was imported in this process "
                    "before sweeper set its token; a caller of sweeper's Python API calls "
                    "sweeper.cluster.environment.prepare() before importing Ray")
        return f"{what}: {first_line(exc)}; Ray's logs are in /tmp/ray/session_latest/logs"
    where = f"cluster.address={cfg.address!r}"
    if any(m in text for m in AUTH_MARKERS):
        other = " instead" if env.token_source == "RAY_AUTH_TOKEN_PATH" else ""
        return (f"{where}: the cluster runs with token authentication and refused this driver: "
                f"{env.describe_token()}; point RAY_AUTH_TOKEN_PATH at the cluster's token file{other} "
                "(`ray get-auth-token` on its head prints the token)")
    return (f"{where}: cannot join a Ray cluster ({first_line(exc)}): check the head is up there "
            f"(`ray status --address {cfg.address}`), or set cluster.address=null to start a local Ray")


def _chain(exc: Optional[BaseException]) -> List[BaseException]:
    seen: List[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def can_resume(results_dir: str, experiment: str) -> bool:
    """Whether Ray Tune can restore `experiment` from its folder under `results_dir` (no Ray needed)."""
    from ray import tune

    return tune.Tuner.can_restore(os.path.join(results_dir, experiment))


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


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
