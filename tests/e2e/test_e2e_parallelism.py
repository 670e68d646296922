"""+experiment=gpt_sharded through the CLI (real Ray, a real MLflow store), shrunk to a tiny GPT at 2 workers:
DDP and ZeRO-3 in both gradient syncs. The budget is placed by the prediction's measured error band with a margin
on both sides (not between two predictions): every ZeRO-3 point without accumulation or in the `every` sync fits
even if the model under-predicts it by the whole band, and every DDP point is over it beyond the band, so it is
recorded out of memory by prediction and never launched. The accumulating ZeRO-3 points train in the `every`
sync (their records say the worker did so), and the answer names a ZeRO-3 layout."""

import numpy as np
import pytest
import yaml

from sweeper import config
from sweeper.driver import predicted
from sweeper.measure import sharded_memory
from sweeper.plan import expand_grid
from tests.e2e.test_e2e import _runs
from tests.harness import compose_cfg, run_cli

pytestmark = pytest.mark.e2e

# 4 blocks of width 128: the weights and AdamW's moments, not the activations (context 16, micro-batch 4), are
# most of a worker's peak. The data: a phrase of 12 ids among 40 repeated with 5 % noise (as test_e2e's token
# files), which 48 steps learn.
SWEEP = ["+experiment=gpt_sharded", "data=tokens", "data.vocab_size=40", "optim.lr=0.003", "model.d_model=128",
         "model.context=16", "train.samples=384", "sweep.micro_batch_sizes=[4]", "measure.warmup_steps=3",
         "measure.windows=3", "measure.flops=false"]
MARGIN = 0.05  # beyond the band, on each side


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
    """Above every ZeRO-3 point that must fit by the band's under-prediction and a margin, below every DDP point
    by the band's over-prediction and a margin (nothing runs: parameter shapes and fake tensors)."""
    cfg = config.load(compose_cfg(*sweep))
    points = expand_grid([4], [1, 2], [2], parallelisms=["ddp", "zero3"], gradient_syncs=["final", "every"])
    found = predicted.predict(cfg, points, 40)
    low, high = sharded_memory.PREDICTION_ERROR_BAND
    must_fit = [p for p in points
                if p.parallelism == "zero3" and (p.accumulation_steps == 1 or p.gradient_sync == "every")]
    budget = max(found[p].total for p in must_fit) / (1 + low) * (1 + MARGIN)
    for p in points:
        if p.parallelism == "ddp":
            assert found[p].total > budget * (1 + high) * (1 + MARGIN), (p.key, found[p].total, budget)
    return budget / 2 ** 30


def test_gpt_sharded_skips_ddp_by_prediction_and_trains_accumulating_zero3_in_the_every_sync(tmp_path):
    sweep = [*SWEEP, _token_files(tmp_path / "corpus")]
    result = run_cli(*sweep, f"device.memory_budget_gb={_budget_gb(*sweep)!r}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _, (parent,), children = _runs(tmp_path)
    runs = {r.data.tags["sweeper.trial_key"]: r.data for r in children}
    # DDP's three layouts (its `every` folds nothing at 2 workers) and ZeRO-3's, each recorded once
    assert sorted(runs) == sorted(["mb4-acc1-w2", "mb4-acc2-w2", "mb4-acc2-w2-every", "mb4-acc1-w2-zero3",
                                   "mb4-acc2-w2-zero3", "mb4-acc2-w2-zero3-every"])
    for key in ("mb4-acc1-w2", "mb4-acc2-w2", "mb4-acc2-w2-every"):
        ddp = runs[key]
        assert (ddp.tags["sweeper.status"], ddp.tags["sweeper.oom"]) == ("oom", "predicted"), key
        assert ddp.tags["sweeper.error"].startswith(f"{key}: predicted") and "samples_per_second" not in ddp.metrics
        assert "gradient_sync" not in ddp.params  # no worker trained it
        assert f"{key}: predicted" in result.stdout
    for key, sync in (("mb4-acc1-w2-zero3", "final"), ("mb4-acc2-w2-zero3-every", "every")):
        zero3 = runs[key]
        assert zero3.tags["sweeper.status"] == "ok" and zero3.metrics["samples_per_second"] > 0, key
        assert (zero3.params["parallelism"], zero3.params["gradient_sync"]) == ("zero3", sync)
        assert abs(zero3.metrics["memory_prediction_error"]) < 0.10  # within 10 % of the largest rank's tracked peak
        assert zero3.metrics["peak_memory_bytes"] <= zero3.metrics["memory_budget_bytes"]
        assert zero3.metrics["communication_bytes_per_step"] > 0
        assert abs(zero3.metrics["communication_prediction_error"]) < 0.01
    every, final = runs["mb4-acc2-w2-zero3-every"], runs["mb4-acc2-w2-zero3"]
    if final.tags["sweeper.status"] == "ok":  # near the budget: it runs, and holds more than `every`
        assert final.params["gradient_sync"] == "final"
        assert final.metrics["memory_tracked_peak_bytes"] > every.metrics["memory_tracked_peak_bytes"]
        assert final.metrics["communication_bytes_per_step"] < every.metrics["communication_bytes_per_step"]
    else:
        assert final.tags["sweeper.status"] == "oom", final.tags

    doc = yaml.safe_load(open(tmp_path / "reports" / parent.info.run_name / "recommendation.yaml"))
    best = doc["recommendation"]
    assert best["parallelism"] == "zero3" and "sweep.parallelism=[zero3]" in best["overrides"]
    assert f"Train {best['key']}" in result.stdout
