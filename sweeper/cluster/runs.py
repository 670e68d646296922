"""What the driver asks of Ray: the grid's points in worker groups, the memory frontier per worker
count, the inference batch sizes per model. Each is one Tune experiment (cluster.launch) whose trial
events a Sink turns into typed results, handed to the caller in the driver process.

Ray itself is imported inside the run functions, once connect() has started it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from sweeper.cluster.connect import Cluster
from sweeper.cluster.records import Sink
from sweeper.cluster.resources import Resources, trial_resources
from sweeper.errors import is_oom_text
from sweeper.plan import GridPoint
from sweeper.schema import FrontierResult, InferenceResult, PointResult

if TYPE_CHECKING:  # torch is imported by the workers, not by the driver's Ray layer
    from sweeper.inference.latency import InferenceSpec
    from sweeper.worker.spec import FrontierSpec, PointSpec

PointCallback = Callable[[GridPoint, PointResult], None]

class PointSink(Sink):
    """Grid points, one result each, whatever happens to their worker group."""

    def __init__(self, on_group_start: Callable[[List[GridPoint]], None], on_point: PointCallback, skip: frozenset,
                 note: Callable[[str], None] = lambda text: None):
        super().__init__()
        self.on_group_start, self.on_point, self.note = on_group_start, on_point, note
        self.skip = skip  # recorded before a resume: not measured, not reported
        self.reported: Dict[str, set] = {}
        self.not_attempted: List[GridPoint] = []

    def started(self, trial_id, config):
        self.on_group_start(_points(config))

    def waiting(self, seconds):
        line = held_line(seconds)
        if line is not None:
            self.note(line)
        return line is not None

    def trial_result(self, trial_id, config, result):
        by_key = {p.key: p for p in _points(config)}
        if result.get("trial_key") not in by_key:
            return  # the worker group's own start-up report
        self.reported.setdefault(trial_id, set()).add(result["trial_key"])
        self.on_point(by_key[result["trial_key"]], PointResult.from_flat(result))

    def trial_ended(self, trial_id, config, error):
        unreported = self._unreported(trial_id, config)
        if error is None:
            for point in unreported:
                self.on_point(point, PointResult(status="failed", error="the worker group ended without measuring it"))
        elif unreported and self.reported.get(trial_id):
            # Points are measured in order: the first unreported one was running when the group
            # died. The group had worked, so the rest were never tried: hand them back. A rank that
            # ran out of memory alone ends its group (the others wait inside the step's all-reduce,
            # so the ranks cannot agree): still an oom, not a failure.
            self.on_point(unreported[0], PointResult(status="oom" if is_oom_text(error) else "failed", error=error))
            self.not_attempted += unreported[1:]
        else:  # the group never measured anything: whatever broke it would break them all
            for point in unreported:
                self.on_point(point, PointResult(status="failed", error=_explained(error)))

    def _unreported(self, trial_id: str, config) -> List[GridPoint]:
        seen = self.reported.get(trial_id, set()) | self.skip
        return [point for point in _points(config) if point.key not in seen]


def held_line(seconds: float) -> Optional[str]:
    """The driver's line when its worker groups wait for the cluster (another sweep or job holds it): one of
    this driver's placement groups is still PENDING. None when none is (a trial placed, its process starting)."""
    import ray
    from ray.util.placement_group import placement_group_table

    job = ray.get_runtime_context().get_job_id()  # a placement group's id ends with its job's
    if not any(g["state"] == "PENDING" and g["placement_group_id"].endswith(job)
               for g in placement_group_table().values()):
        return None
    free, total = ray.available_resources(), ray.cluster_resources()
    return (f"waiting {seconds:.0f} s so far for the Ray cluster: other work holds its resources ("
            f"{free.get('CPU', 0.0):g} of {total.get('CPU', 0.0):g} CPUs free now); the next worker group starts "
            "when they are released")


def _explained(error: str) -> str:
    """A worker group's error in the user's terms where Ray's own words do not say it."""
    if "WorkerGroupStartupTimeout" in error or ("Failed to start" in error and "worker group" in error):
        return (f"its worker group could not be placed within cluster.start_timeout_seconds, cluster.max_failures "
                f"times over: the cluster lacks the CPUs/GPUs it asks for ({error})")
    return error


def _points(config: Dict[str, Any]) -> List[GridPoint]:
    return [GridPoint(**p) for p in config["points"]]


def run_points(
    experiment: str,
    groups: List[List[GridPoint]],
    specs: Dict[GridPoint, "PointSpec"],
    resources: Resources,
    cluster: Cluster,
    max_concurrent_trials: int,
    on_group_start: Callable[[List[GridPoint]], None],
    on_point: PointCallback,
    done_keys: frozenset = frozenset(),
    resume: bool = False,
    note: Callable[[str], None] = lambda text: None,
) -> List[GridPoint]:
    """Run every group of grid points as one Ray Tune trial (one Ray Train worker group that measures
    its points one after another); `on_point(point, result)` is called in this process as each
    point finishes, its status ok | oom | failed. Points in `done_keys` (already recorded) are not
    measured. `note(line)` is told when every group waits for a cluster other work holds.

    With `resume`, Ray Tune restores the experiment of that name and runs its unfinished and errored
    trials again (finished ones are not); their worker groups skip `done_keys`.

    Returns the points never tried because their worker group died on an earlier point (a worker
    process killed more often than cluster.max_failures allows, a rank failing alone): the caller runs
    them again in a fresh group.
    """
    from sweeper.cluster import entry, launch, shared_data

    sink = PointSink(on_group_start, on_point, frozenset(done_keys), note)
    launch.launch(
        experiment,
        entry.group_trial,
        dict(
            specs=specs,
            # Built once in the driver, fetched by the groups (cluster.shared_data): not built again in each.
            data=shared_data.shared(specs.values()),
            resources=resources,
            storage_path=cluster.results_dir,
            experiment=experiment,
            done_keys=frozenset(done_keys),
            # A resumed group starts a fresh Ray Train run: its old checkpoint may list points the
            # killed driver never recorded, and only what MLflow holds counts as done.
            run_suffix=f"-resumed{int(time.time())}" if resume else "",
        ),
        lambda config: trial_resources(resources, max(p["num_workers"] for p in config["points"])),
        {"points": _grid([[p.as_dict() for p in group] for group in groups])},
        cluster.results_dir,
        sink,
        max_concurrent_trials=max_concurrent_trials,
        restore=resume,
        # A group that runs in its trial's process (resources.in_trial) restarts as its trial, from the
        # trial's checkpoint of the points done; a Ray Train group's own restarts end in a result.
        max_failures=resources.max_failures,
    )
    return sink.not_attempted


class FrontierSink(Sink):
    """Probes as they end, then each search's frontier (a failed search is a result too); each
    reaches the caller with its search's template point (workers and recipe)."""

    def __init__(self, searches: List[GridPoint], on_probe, on_frontier):
        super().__init__()
        self.searches, self.on_probe, self.on_frontier = searches, on_probe, on_frontier
        self.ended_searches: set = set()

    def trial_result(self, trial_id, config, result):
        search, key = self.searches[config["search"]], str(result.get("trial_key", ""))
        if key.startswith("frontier-"):
            self.ended_searches.add(config["search"])
            self.on_frontier(search, FrontierResult.from_flat(result))
        elif key.startswith("probe"):
            self.on_probe(search, PointResult.from_flat(result))

    def trial_ended(self, trial_id, config, error):
        if error is not None and config["search"] not in self.ended_searches:
            failed = FrontierResult(status="failed", error=f"the frontier search failed: {error}")
            self.on_frontier(self.searches[config["search"]], failed)


def run_frontiers(
    experiment: str,
    fspecs: List["FrontierSpec"],
    resources: Resources,
    cluster: Cluster,
    on_probe: Callable[[GridPoint, PointResult], None],
    on_frontier: Callable[[GridPoint, FrontierResult], None],
) -> None:
    """One Ray Tune trial per search (a worker count in one recipe), each a worker group searching its
    memory frontier; every probe and then the frontier reach the caller in this process
    (`on_probe(search, result)`, `on_frontier(search, result)`, its `status` ok or failed, `search`
    the spec's template point). Searches run one after another: a probe's peak must not share the
    device with another's."""
    from sweeper.cluster import entry, launch, shared_data

    fspecs = [replace(f, template=replace(f.template, use_gpu=resources.use_gpu)) for f in fspecs]
    launch.launch(
        experiment,
        entry.frontier_trial,
        dict(fspecs=fspecs, resources=resources, storage_path=cluster.results_dir, experiment=experiment,
             data=shared_data.shared(f.template for f in fspecs)),
        lambda config: trial_resources(resources, fspecs[config["search"]].num_workers),
        {"search": _grid(list(range(len(fspecs))))},
        cluster.results_dir,
        FrontierSink([f.template.point for f in fspecs], on_probe, on_frontier),
        max_failures=resources.max_failures,
    )


class InferenceSink(Sink):
    """Each batch size's result as it is measured, then the device's facts; the batch sizes a failed
    trial never reached are recorded failed."""

    def __init__(self, groups: List[List["InferenceSpec"]], on_result, on_device):
        super().__init__()
        self.groups, self.on_result, self.on_device = groups, on_result, on_device
        self.reported: Dict[str, int] = {}

    def trial_result(self, trial_id, config, result):
        if result.get("role") == "device":
            self.on_device(result)
        elif result.get("trial_key"):
            self.reported[trial_id] = self.reported.get(trial_id, 0) + 1
            self.on_result(InferenceResult.from_flat(result))

    def trial_ended(self, trial_id, config, error):
        if error is None:
            return
        for spec in self.groups[config["group"]][self.reported.get(trial_id, 0):]:
            self.on_result(InferenceResult(trial_key=spec.key, status="failed", batch_size=spec.batch_size,
                                           error=f"the inference trial failed: {error}"))


def run_inference(
    experiment: str,
    groups: List[List["InferenceSpec"]],
    resources: Resources,
    cluster: Cluster,
    on_result: Callable[[InferenceResult], None],
    on_device: Callable[[Dict[str, Any]], None],
) -> None:
    """One Ray Tune trial per model (no worker group: inference runs in the trial's own process, with
    one worker's resources), timing its batch sizes smallest first; each result reaches
    `on_result` in this process as it is measured, then the device's facts reach `on_device`.
    Trials run one after another: two would share the device and distort each other's latency."""
    from sweeper.cluster import entry, launch

    per_trial = {"CPU": resources.cpus_per_worker + resources.cpus_per_trial}
    if resources.use_gpu:
        per_trial["GPU"] = 1
    groups = [[replace(s, use_gpu=resources.use_gpu) for s in group] for group in groups]
    launch.launch(
        experiment,
        entry.inference_trial,
        dict(groups=groups, threads=resources.threads_per_worker),
        per_trial,
        {"group": _grid(list(range(len(groups))))},
        cluster.results_dir,
        InferenceSink(groups, on_result, on_device),
    )


def _grid(values: List[Any]) -> Any:
    from ray import tune

    return tune.grid_search(values)
