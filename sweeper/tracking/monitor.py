"""MLflow's system-metrics monitor (CPU, memory, disk, network; GPU through pynvml) on a sweep's parent
run while the sweep runs: which one the driver wants (`Monitor`) and starting it (`Monitor.start`).

Imports MLflow inside functions only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Monitor:
    """MLflow's system-metrics monitor on the parent run while the sweep runs. `node`: a label in
    the names (system/<node>/...), for a driver on a cluster. MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
    overrides `interval_seconds`."""

    node: Optional[str] = None
    interval_seconds: float = 10.0

    @classmethod
    def for_driver(cls, on_cluster: bool) -> "Optional[Monitor]":
        """The sweep driver's monitor: labelled with this host's name when it joined a cluster (other
        nodes' figures are the points' own utilization metrics); None when the user turned MLflow's
        system metrics off (MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false)."""
        if os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() in ("false", "0"):
            return None
        return cls(node=socket.gethostname() if on_cluster else None)

    def start(self, uri: str, run_id: str) -> Any:
        """Sample this machine into run `run_id` until the returned monitor's `finish()` (or the run
        ends: the monitor then stops itself, losing its last samples)."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # resume_logging: a resumed sweep's samples continue after the interrupted run's last step.
        running = SystemMetricsMonitor(run_id, sampling_interval=self.interval_seconds, node_id=self.node,
                                       tracking_uri=uri, resume_logging=True)
        running.start()
        return running
