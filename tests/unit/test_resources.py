"""Trial sizing against the cluster: a trial that cannot fit is a clear error, not Ray's silent hang."""

import pytest

from sweeper.cluster.connect import Cluster
from dataclasses import replace

from sweeper.cluster.resources import concurrent_trials, plan_resources, trial_resources
from sweeper.cluster.records import GROUP_ERROR
from sweeper.cluster.runs import PointSink
from sweeper.config import ClusterConfig
from sweeper.errors import ConfigError
from sweeper.plan import GridPoint


def cluster(cpus, gpus=0.0):
    return Cluster("local", cpus, gpus, None, None, "/tmp")


POINTS = [GridPoint(16, 1, 1), GridPoint(16, 1, 2)]


def test_auto_share_fits_driver_plus_largest_trial_on_two_cores():
    r = plan_resources(ClusterConfig(), cluster(2), POINTS)
    assert r.cpus_per_trial + 2 * r.cpus_per_worker <= 2
    assert r.cpus_per_worker == pytest.approx(0.99) and r.threads_per_worker == 1 and not r.use_gpu


def test_a_group_of_one_worker_reserves_its_worker_in_its_trial_and_a_larger_one_only_its_driver():
    r = plan_resources(ClusterConfig(), cluster(2), POINTS)
    # One worker runs in its trial's process: the trial holds the worker's share (and its GPU).
    assert trial_resources(r, 1) == {"CPU": pytest.approx(r.cpus_per_trial + r.cpus_per_worker)}
    assert trial_resources(replace(r, use_gpu=True), 1)["GPU"] == 1
    # Ray Train places a larger group's workers itself; the trial holds its driver's share.
    assert trial_resources(r, 2) == {"CPU": r.cpus_per_trial}


def test_a_worker_group_that_failed_for_good_fails_its_points_as_an_errored_trial_does():
    group = [GridPoint(8, 1, 2), GridPoint(16, 1, 2), GridPoint(32, 1, 2)]
    config = {"points": [p.as_dict() for p in group]}
    for ending in ("result", "error"):
        recorded = []
        sink = PointSink(lambda points: None, lambda point, result, into=recorded: into.append((point.key, result)),
                         frozenset())
        sink.started("t1", config)
        sink.result("t1", config, {"trial_key": "mb8-acc1-w2", "status": "ok"})
        oom = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        if ending == "result":  # Ray Train gave up: the trial's last result, then the trial completes
            sink.result("t1", config, {GROUP_ERROR: f"WorkerGroupError: Training failed\n{oom}"})
            sink.ended("t1", config, None)
        else:  # the trial's own process died: Tune's error
            sink.ended("t1", config, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        assert [(key, r.status) for key, r in recorded] == [("mb8-acc1-w2", "ok"), ("mb16-acc1-w2", "oom")]
        assert recorded[1][1].error.startswith("torch.OutOfMemoryError")
        assert [p.key for p in sink.not_attempted] == ["mb32-acc1-w2"]  # run again in a fresh group


def test_one_cpu_per_worker_on_two_cores_with_two_workers_is_refused():
    with pytest.raises(ConfigError) as err:
        plan_resources(ClusterConfig(cpus_per_worker=1.0), cluster(2), POINTS)
    assert err.value.problems[0].startswith("cluster.cpus_per_worker=1")
    assert "2.01 CPUs but the Ray cluster has 2" in err.value.problems[0]


def test_gpu_requested_without_gpus_is_refused_and_auto_falls_back_to_cpu():
    with pytest.raises(ConfigError, match="cluster.use_gpu=true"):
        plan_resources(ClusterConfig(use_gpu="true"), cluster(8), POINTS)
    assert plan_resources(ClusterConfig(use_gpu="auto"), cluster(8, gpus=2), POINTS).use_gpu
    assert not plan_resources(ClusterConfig(use_gpu="auto"), cluster(8), POINTS).use_gpu


def nodes(*cpus):
    return Cluster("x:1", float(sum(cpus)), 0.0, None, None, "/tmp", nodes=[(float(c), 0.0) for c in cpus])


def test_a_trial_that_fits_one_node_gets_a_whole_node_one_trial_per_node():
    r = plan_resources(ClusterConfig(), nodes(8, 8), [GridPoint(16, 1, 2)])
    assert r.cpus_per_worker == pytest.approx(3.99) and r.threads_per_worker == 3
    assert concurrent_trials(nodes(8, 8), r, 2) == 2


def test_a_trial_larger_than_any_node_is_spread_with_a_share_each_node_can_hold():
    # 2 workers on two 1-CPU nodes: the cluster-wide share (0.99) fits one worker per node.
    r = plan_resources(ClusterConfig(), nodes(1, 1), [GridPoint(16, 1, 2)])
    assert r.cpus_per_worker == pytest.approx(0.99)
    # 3 workers on nodes of 4 and 1 CPUs: the cluster-wide share (1.66) would leave one unplaceable.
    r = plan_resources(ClusterConfig(), nodes(4, 1), [GridPoint(16, 1, 3)])
    assert 3 <= sum(int(c // r.cpus_per_worker) for c in (4 - 0.01, 1)) and r.cpus_per_worker <= 1.33


def test_a_worker_in_its_trial_shares_one_node_with_the_trial_driver():
    # A group of one worker is one bundle (the trial's driver and its worker): on nodes of 1 CPU (a head with
    # none, as KubeRay's), 0.01 + 1.0 was asked and could never be placed.
    r = plan_resources(ClusterConfig(), nodes(0, 1, 1), [GridPoint(8, 1, 1)])
    assert trial_resources(r, 1)["CPU"] <= 1.0
    with pytest.raises(ConfigError, match="cannot be placed"):
        plan_resources(ClusterConfig(cpus_per_worker=1.0), nodes(0, 1, 1), [GridPoint(8, 1, 1)])


def test_placement_that_can_never_happen_is_refused_before_any_trial():
    with pytest.raises(ConfigError, match="cannot be placed STRICT_PACK"):
        plan_resources(ClusterConfig(cpus_per_worker=2, placement_strategy="STRICT_PACK"), nodes(4, 4),
                       [GridPoint(16, 1, 3)])
    with pytest.raises(ConfigError, match="cannot be placed STRICT_SPREAD"):
        plan_resources(ClusterConfig(cpus_per_worker=1, placement_strategy="STRICT_SPREAD"), nodes(8),
                       [GridPoint(16, 1, 2)])


def test_hsdp_at_a_worker_count_no_placement_splits_evenly_over_the_nodes_is_refused_before_any_trial():
    hsdp = [GridPoint(16, 1, w, parallelism="hsdp") for w in (2, 4)]
    # Nodes of 3 CPUs at 1 CPU a worker hold 2 (the trial's driver on the first) and 3: 4 workers as 2 + 2.
    plan_resources(ClusterConfig(cpus_per_worker=1), nodes(3, 3), hsdp)
    five = [GridPoint(16, 1, 5, parallelism="hsdp")]  # fits (2 + 3) but only as 2 + 3: no (nodes, ranks per node)
    with pytest.raises(ConfigError, match=r"parallelism=hsdp at 5 workers: the Ray cluster's nodes hold \[2, 3\]"):
        plan_resources(ClusterConfig(cpus_per_worker=1), nodes(3, 3), five)
    plan_resources(ClusterConfig(cpus_per_worker=1), nodes(3, 3), [GridPoint(16, 1, 5, parallelism="zero3")])
    plan_resources(ClusterConfig(cpus_per_worker=1), nodes(8), five)  # one node: a mesh (1, 5)


def test_tune_missing_logs_warning_is_filtered():
    import logging

    from sweeper.cluster.connect import TUNE_ANALYSIS_LOGGER, install_log_filter

    install_log_filter()
    install_log_filter()
    logger = logging.getLogger(TUNE_ANALYSIS_LOGGER)
    dropped = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1,
        "Failed to fetch metrics for 1 trial(s):\n- t: FileNotFoundError('Could not fetch metrics for t: "
        "both result.json and progress.csv were not found at /x')", None, None,
    )
    kept = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "some other warning", None, None)
    assert not logger.filter(dropped)
    assert logger.filter(kept)


def test_a_million_workers_of_a_two_cpu_machine_are_refused_naming_sweep_num_workers():
    from sweeper.cluster.resources import capacity_problems

    [problem] = capacity_problems(ClusterConfig(), cluster(2), [1, 1_000_000])
    assert problem.startswith("sweep.num_workers=[1,1000000]:")
    assert "2 CPUs and 0 GPUs" in problem and "at most 199" in problem
    assert capacity_problems(ClusterConfig(), cluster(2), [1, 2]) == []


def test_cpus_per_worker_above_the_machine_is_refused_naming_the_key():
    from sweeper.cluster.resources import capacity_problems

    [problem] = capacity_problems(ClusterConfig(cpus_per_worker=4), cluster(2), [1])
    assert problem.startswith("cluster.cpus_per_worker=4:") and "2 CPUs" in problem and "at most 1.99" in problem
    [problem] = capacity_problems(ClusterConfig(use_gpu="true"), cluster(8, gpus=2), [4])
    assert problem.startswith("sweep.num_workers=[4]:") and "2 GPUs" in problem


def test_an_autoscaling_cluster_waits_instead_of_refusing(capsys):
    growing = Cluster("x:1", 2.0, 0.0, None, None, "/tmp", can_grow=True)
    r = plan_resources(ClusterConfig(cpus_per_worker=1.0), growing, [GridPoint(16, 1, 8)])
    assert r.cpus_per_worker == 1.0
    assert "autoscales, so the sweep waits" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"sweep.num_workers=\[8\]|cluster.cpus_per_worker=1"):
        plan_resources(ClusterConfig(cpus_per_worker=1.0), nodes(2), [GridPoint(16, 1, 8)])


def test_the_cli_refuses_a_million_local_workers_before_the_grid(tmp_path):
    from tests.harness import run_cli

    # A local Ray (own_ray: not the session's joined one), whose capacity is this machine's. Its points
    # would also get 0 optimizer steps (train.epochs): the capacity is what is said, alone.
    result = run_cli("sweep.num_workers=[1000000]", cwd=tmp_path, env={"HOME": str(tmp_path)}, timeout=120,
                     own_ray=True)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() + result.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: sweep.num_workers=[1000000]:"), errors
    assert "CPUs" in errors[0] and "train.epochs" not in errors[0]


def held(cpus, free):
    """A joined cluster of nodes with these CPUs, of which other work (another sweep) leaves `free`."""
    return replace(nodes(*cpus), free=[(float(f), 0.0) for f in free])


def test_a_cluster_another_sweep_holds_is_waited_for_and_said_sized_as_if_alone():
    said = []
    r = plan_resources(ClusterConfig(), held([2], [0]), [GridPoint(8, 1, 1)], said.append)
    assert r.cpus_per_worker == pytest.approx(1.99)  # the whole node, as a sweep alone gets: comparable figures
    assert len(said) == 1 and said[0].startswith("the Ray cluster is busy: other work holds its resources")
    assert "(free CPUs per node now [0.0] of [2.0])" in said[0] and "(2 CPUs) waits until" in said[0]
    # Free enough on one node for the group and its trial's driver: nothing to say.
    said.clear()
    plan_resources(ClusterConfig(), held([2, 2], [0, 2]), [GridPoint(8, 1, 1)], said.append)
    assert said == []
    # Two workers of 1.99 CPUs need two free nodes' worth: one free node is not enough.
    plan_resources(ClusterConfig(), held([2, 2], [0, 2]), [GridPoint(8, 1, 2)], said.append)
    assert len(said) == 1 and "[0.0, 2.0] of [2.0, 2.0]" in said[0]


class _Trial:
    def __init__(self, status):
        self.status = status


def test_the_driver_says_once_when_every_trial_has_waited_to_be_placed(monkeypatch):
    from sweeper.cluster import launch
    from sweeper.cluster.records import Sink

    waited = []

    class Told(Sink):
        def waiting(self, seconds):  # its trials' placement groups wait from the second ask on
            waited.append(seconds)
            return len(waited) > 1

    clock = iter([0.0, 5.0, 11.0, 12.0, 21.0, 35.0, 36.0])
    monkeypatch.setattr(launch.time, "monotonic", lambda: next(clock))
    monkeypatch.setitem(launch._SINKS, "e", Told())
    relay = launch.Relay("e")
    for _ in range(6):
        relay.on_step_end(0, [_Trial("PENDING"), _Trial("TERMINATED")])
    assert waited == [11.0, 21.0]  # asked after WAIT_NOTE_SECONDS, again 10 s on, and said once
    relay.on_step_end(0, [_Trial("RUNNING"), _Trial("PENDING")])  # one placed: nobody waits for the cluster
    assert waited == [11.0, 21.0] and relay._pending_since is None


def test_two_sweeps_started_in_one_second_get_names_of_their_own_that_resume_still_finds():
    from sweeper.driver import resume

    names = {resume.sweep_name("sweep", "mlp", "digits") for _ in range(50)}
    assert len(names) == 50  # one per sweep: Tune's experiment folders and MLflow's run names never shared
    assert all(resume._started(n, "sweep-mlp-digits-") for n in names)
    assert resume._started("sweep-mlp-digits-20260101-000000", "sweep-mlp-digits-")  # an older sweep's name
