"""Issue 46's sweep through the CLI: on a model without BatchNorm, the layouts of one global batch and LR train
one model, so the answer is the faster layout of the better class, printed as a headline of at most 3 lines
of 120 characters and a table of alternatives."""

import pytest
import yaml
from tests.harness import run_cli
from tests.e2e.test_e2e import _runs

pytestmark = pytest.mark.e2e

SWEEP = ["model=mlp", "model.depth=2", "model.width=64", "data=digits", "train.epochs=1",
         "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1,2]", "sweep.global_batch_sizes=[32]",
         "sweep.lr_multipliers=[1,2]", "measure.warmup_steps=3", "measure.windows=3"]


def test_the_cli_recommends_the_faster_layout_of_the_better_class(tmp_path):
    result = run_cli(*SWEEP, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _, (parent,), children = _runs(tmp_path)
    assert parent.data.params["batch_coupled_layers"] == "none"
    assert len(children) == 4

    folder = tmp_path / "reports" / parent.info.run_name
    doc = yaml.safe_load(open(folder / "recommendation.yaml"))
    best = doc["recommendation"]
    # Its class: the other layout at the same LR multiplier trains the same model and is slower.
    same = [r for r in children if float(r.data.params["lr_multiplier"]) == float(best["lr_multiplier"])]
    speeds = {r.data.params["point"]: r.data.metrics["samples_per_second"] for r in same}
    assert best["key"] == max(speeds, key=speeds.get), speeds

    out = result.stdout
    answer = out[out.index("recommendation:"):].splitlines()[1:]
    headline = answer[: next(i for i, line in enumerate(answer) if line.startswith("point "))]
    assert 1 <= len(headline) <= 3 and all(len(line) <= 120 for line in headline), headline
    assert headline[0].startswith(f"Train {best['key']}: ")
    assert "same model, slower" in out
    html = open(folder / "report.html").read()
    assert "Accuracy classes" in html and "class gb32-lrx2" in html
