"""What Ray Tune writes for a sweep: its experiment state (what sweep.resume restores), not its
automatic CSV / JSON / TensorBoard loggers, whose per-trial curves would join a worker group's
unrelated points."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

AUTO_LOGGER_FILES = ("progress.csv", "result.json", "events.out.tfevents")

# In a fresh process: Ray reads its auth settings once, when first imported, and connect() sets them
# before it imports Ray (a test process may have imported Ray already).
SCRIPT = """
import json, os, sys
from sweeper.cluster import connect
from sweeper.cluster.records import Sink
from sweeper.config import ClusterConfig

def report(config):
    from ray import tune
    tune.report({"value": config["x"] * 2})

class Collect(Sink):
    results, errors = [], []
    def trial_result(self, trial_id, config, result):
        self.results.append(result["value"])
    def trial_ended(self, trial_id, config, error):
        if error:
            self.errors.append(error)

cluster = connect.connect(ClusterConfig(num_cpus=2, include_dashboard=False, ray_dir=sys.argv[1]))
try:
    from sweeper.cluster import launch
    sink = Collect()
    launch.launch("quiet", report, {}, {"cpu": 0.5}, {"x": {"grid_search": [1, 2]}}, cluster.results_dir, sink)
finally:
    connect.shutdown()
print(json.dumps({"results": sorted(sink.results), "errors": sink.errors, "folder": cluster.results_dir,
                  "env": os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")}))
"""


@pytest.mark.own_ray  # connect() itself: the environment it sets before Ray starts
def test_a_tune_experiment_leaves_no_automatic_logger_files(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ray")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["results"] == [2, 4] and out["errors"] == [] and out["env"] == "1"
    written = [os.path.join(folder, name) for folder, _, names in os.walk(out["folder"]) for name in names]
    assert any("experiment_state" in path for path in written), written  # what a resume restores
    logged = [path for path in written if os.path.basename(path).startswith(AUTO_LOGGER_FILES)]
    assert logged == [], logged
