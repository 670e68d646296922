"""What every sweep does around its own work: time its phases, start or join Ray, open the MLflow
store, size the worker groups, and always shut Ray down. The train and inference sweeps both run
inside one `session`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List

from sweeper import tracking
from sweeper.cluster import connect
from sweeper.cluster.resources import Resources, plan_resources
from sweeper.config import SweeperConfig, tracking_uri
from sweeper.plan import GridPoint


class Phases:
    """Where a sweep's wall time goes: each call closes a phase, so the phases add up to the wall time."""

    def __init__(self) -> None:
        self._clock = time.perf_counter()
        self.seconds: Dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._clock
        self._clock = now

    @property
    def wall(self) -> float:
        return sum(self.seconds.values())


@dataclass
class Session:
    """A sweep's connections: the Ray cluster, the MLflow store, and the resources of a worker."""

    cluster: connect.Cluster
    tracker: tracking.Tracker
    resources: Resources
    uri: str


@contextlib.contextmanager
def session(cfg: SweeperConfig, phases: Phases, sizing: List[GridPoint]) -> Iterator[Session]:
    """Ray started (or joined) and the store opened, worker resources sized for `sizing`'s largest
    point; Ray is shut down however the sweep ends."""
    uri = tracking_uri(cfg.tracking)
    cluster = connect.connect(cfg.cluster)
    phases("ray_start")
    try:
        tracker = tracking.Tracker(uri, cfg.tracking.experiment_name)
        resources = plan_resources(cfg.cluster, cluster, sizing)
        yield Session(cluster, tracker, resources, uri)
    finally:
        connect.shutdown()
