"""Trial sizing against the cluster: a trial that cannot fit is a clear error, not Ray's silent hang."""

import pytest

from sweeper.config import ClusterConfig, ConfigError
from sweeper.plan import GridPoint
from sweeper.ray_runner import Cluster, plan_resources


def cluster(cpus, gpus=0.0):
    return Cluster("local", cpus, gpus, None, None, "/tmp")


POINTS = [GridPoint(16, 1, 1), GridPoint(16, 1, 2)]


def test_auto_share_fits_driver_plus_largest_trial_on_two_cores():
    r = plan_resources(ClusterConfig(), cluster(2), POINTS)
    assert r.cpus_per_trial + 2 * r.cpus_per_worker <= 2
    assert r.cpus_per_worker == pytest.approx(0.99) and r.threads_per_worker == 1 and not r.use_gpu


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
