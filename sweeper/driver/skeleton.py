"""What every sweep does around its own work: time its phases, start or join Ray, open the MLflow
store, size the worker groups, end the sweep's record as honestly as it went (FINISHED, FAILED on a
crash, KILLED on Ctrl-C or SIGTERM), and always shut Ray down. The train and inference sweeps both
run inside one `session`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

from sweeper import tracking
from sweeper.cluster import connect, records
from sweeper.cluster.resources import Resources, plan_resources
from sweeper.config import SweeperConfig, tracking_uri
from sweeper.driver import console
from sweeper.errors import ConfigError, Interrupted, first_line
from sweeper.plan import GridPoint
from sweeper.schema import SweepSummary


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
    ended: bool = False

    def end(self, summary: SweepSummary, status: str) -> None:
        """End the sweep's parent run (after the journal's pending writes); say what is still pending."""
        replayed, pending = self.tracker.end_sweep(summary, status)
        self.ended = True
        if replayed:
            console.note(f"{replayed} write(s) kept while the tracking store was unreachable are recorded now")
        if pending:
            console.warn(
                f"{pending} write(s) the tracking store did not take are kept in {self.tracker.journal.path} "
                f"({self.tracker.journal.last_error}); they are recorded when the sweep is resumed "
                "(sweep.resume=true) once the store is back"
            )


@contextlib.contextmanager
def session(cfg: SweeperConfig, phases: Phases, sizing: List[GridPoint],
            tracker: Optional[tracking.Tracker] = None) -> Iterator[Session]:
    """Ray started (or joined) and the store opened (or `tracker`, opened before Ray), worker resources
    sized for `sizing`'s largest point; MLflow's system-metrics monitor watches the parent run from its
    start. However the sweep ends, its parent run is ended (KILLED when interrupted, FAILED on a crash),
    the monitor stopped and Ray shut down."""
    uri = tracking_uri(cfg.tracking)
    signals = Signals()
    signals.install()
    cluster = connect.connect(cfg.cluster)
    signals.install()  # again: ray.init replaced the SIGTERM handler with its own sys.exit
    phases("ray_start")
    s: Optional[Session] = None
    try:
        monitor = tracking.Monitor.for_driver(on_cluster=cfg.cluster.address is not None)
        if tracker is None:
            tracker = tracking.Tracker(uri, cfg.tracking.experiment_name, monitor=monitor)
        else:
            tracker.monitor = monitor
        s = Session(cluster, tracker, plan_resources(cfg.cluster, cluster, sizing, console.note), uri)
        yield s
    except BaseException as exc:
        stop = interruption(exc)
        if stop is not None:
            _end_unfinished(s, phases, "KILLED", f"interrupted by {stop.name}")
            raise stop from None
        if not isinstance(exc, ConfigError):  # a ConfigError comes before the sweep recorded anything
            _end_unfinished(s, phases, "FAILED", f"{type(exc).__name__}: {first_line(exc)}")
        raise
    finally:
        if s is not None:
            s.tracker.stop_monitor()  # ended runs stopped it already; a crash before the end did not
        connect.shutdown()
        signals.restore()


def _end_unfinished(s: Optional[Session], phases: Phases, status: str, why: str) -> None:
    """The record of a sweep that stopped early: its parent ended `status` with what it measured,
    and how to finish it. Nothing is said to have finished that did not."""
    if s is None or s.tracker.parent_run_id is None or s.ended:
        return
    try:
        # A signal can land while a point's run is being written: end it as a resume would (KILLED and
        # marked incomplete, measured again on resume), so nothing is left RUNNING.
        s.tracker.reconcile()
    except Exception as exc:  # noqa: BLE001 - the store itself may be what failed; the parent is ended below
        console.warn(f"the sweep's half-written points could not be ended: {type(exc).__name__}: {first_line(exc)}")
    try:
        statuses = Counter(child["status"] for child in s.tracker.reader.load().children)
        s.end(SweepSummary(sweep_wall_seconds=phases.wall).count(statuses), status)
    except Exception as exc:  # noqa: BLE001 - the store itself may be what failed; say so and go on ending
        console.warn(f"the sweep's run could not be ended {status}: {type(exc).__name__}: {first_line(exc)}")
    console.stopped(why, s.tracker.parent_run_id, status)


class Signals:
    """SIGINT and SIGTERM raise Interrupted in the main thread, so the sweep unwinds through its
    record's end; a second signal while it does exits at once. Ray Tune's own SIGINT handler is
    turned off: it would stop the experiment and return from fit() as if the sweep had finished."""

    def __init__(self) -> None:
        self.fired: List[int] = []
        self.previous: Dict[int, object] = {}
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old = signal.signal(sig, self._handle)
            self.previous.setdefault(sig, old)

    def restore(self) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)

    def _handle(self, signum, frame):
        if self.fired:
            os._exit(128 + signum)  # the second signal: no more cleanup
        self.fired.append(signum)
        stop = Interrupted(signum)
        if records.defer_stop(stop):
            return  # raised by the running Tune experiment at its next step (cluster.records says why)
        raise stop


def interruption(exc: BaseException) -> Optional[Interrupted]:
    """The Interrupted behind `exc`: itself, a KeyboardInterrupt (a Ctrl-C before our handler was
    in place), or the cause of an error Ray wrapped it in (raised inside Ray's C code, it surfaces
    as a SystemError whose cause is the Interrupted)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, Interrupted):
            return exc
        if isinstance(exc, KeyboardInterrupt):
            return Interrupted(signal.SIGINT)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
