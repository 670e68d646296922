"""sweep.parallelism through the CLI (real Ray, a real MLflow store): a tiny GPT at 2 workers under DDP and
ZeRO-3, a simulated budget between the two layouts' predicted peaks. The DDP point is recorded out of memory by
prediction and never launched, the ZeRO-3 point trains, and the answer names it."""

import numpy as np
import pytest
import yaml

from sweeper import config
from sweeper.driver import predicted
from sweeper.plan import GridPoint
from tests.e2e.test_e2e import _runs
from tests.harness import compose_cfg, run_cli

pytestmark = pytest.mark.e2e

# 4 blocks of width 128: the weights and AdamW's moments, not the activations (context 16, micro-batch 4), are
# most of a worker's peak, so sharding them over 2 workers is what separates the two layouts. The data: a phrase
# of 12 ids among 40 repeated with 5 % noise (as test_e2e's token files), which 48 steps learn.
SWEEP = ["model=gpt", "data=tokens", "data.vocab_size=40", "optim=adamw", "optim.lr=0.003", "model.context=16",
         "gns.enabled=false", "train.samples=384", "sweep.parallelism=[ddp,zero3]", "sweep.micro_batch_sizes=[4]",
         "sweep.accumulation_steps=[1]", "sweep.num_workers=[2]", "measure.warmup_steps=3", "measure.windows=3",
         "measure.flops=false"]
DDP, ZERO3 = GridPoint(4, 1, 2), GridPoint(4, 1, 2, parallelism="zero3")


def _token_files(folder) -> str:
    rng = np.random.default_rng(0)
    phrase = rng.integers(0, 40, 12)
    folder.mkdir()
    for name, length in (("train.bin", 24_000), ("val.bin", 2_400)):
        ids = np.resize(phrase, length)
        noise = rng.random(length) < 0.05
        ids[noise] = rng.integers(0, 40, int(noise.sum()))
        ids.astype(np.uint16).tofile(folder / name)
    return f"data.path={folder}"


def _budget_gb(*sweep: str) -> float:
    """Midway between the two points' predicted peaks (nothing runs: parameter shapes and fake tensors)."""
    cfg = config.load(compose_cfg(*sweep))
    found = predicted.predict(cfg, [DDP, ZERO3], 40)
    assert found[ZERO3].total < 0.8 * found[DDP].total, {p.key: found[p].total for p in found}
    return (found[DDP].total + found[ZERO3].total) / 2 / 2 ** 30


def test_a_ddp_point_over_the_budget_is_skipped_by_prediction_and_the_zero3_point_is_recommended(tmp_path):
    sweep = [*SWEEP, _token_files(tmp_path / "corpus")]
    result = run_cli(*sweep, f"device.memory_budget_gb={_budget_gb(*sweep)!r}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{DDP.key}: predicted" in result.stdout and "skipped, not launched" in result.stdout
    _, (parent,), children = _runs(tmp_path)
    runs = {r.data.tags["sweeper.trial_key"]: r.data for r in children}
    assert sorted(runs) == [DDP.key, ZERO3.key]  # each recorded once
    ddp, zero3 = runs[DDP.key], runs[ZERO3.key]
    assert (ddp.tags["sweeper.status"], ddp.tags["sweeper.oom"]) == ("oom", "predicted")
    assert ddp.tags["sweeper.error"].startswith(f"{DDP.key}: predicted") and "samples_per_second" not in ddp.metrics
    assert zero3.tags["sweeper.status"] == "ok" and zero3.metrics["samples_per_second"] > 0
    assert (ddp.params["parallelism"], zero3.params["parallelism"]) == ("ddp", "zero3")
    assert (ddp.params["gradient_sync"], zero3.params["gradient_sync"]) == ("no_sync", "set_requires_gradient_sync")
    assert zero3.metrics["memory_predicted_bytes"] > 0
    assert abs(zero3.metrics["memory_prediction_error"]) < 0.10  # within 10 % of the largest rank's tracked peak
    assert zero3.metrics["peak_memory_bytes"] <= zero3.metrics["memory_budget_bytes"]

    doc = yaml.safe_load(open(tmp_path / "reports" / parent.info.run_name / "recommendation.yaml"))
    best = doc["recommendation"]
    assert (best["key"], best["parallelism"]) == (ZERO3.key, "zero3")
    assert "sweep.parallelism=[zero3]" in best["overrides"]
    assert f"Train {ZERO3.key}" in result.stdout
