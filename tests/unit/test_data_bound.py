"""The input pipeline measured: a point whose loader cannot keep up (a dataset that sleeps per sample) records
the share of its step spent waiting for data (data_wait_fraction) above the report's threshold and is named
data-bound, with the loader's settings to raise; a point on in-memory data is not."""

from __future__ import annotations

import time
from functools import partial

import pytest
import torch
from torch.utils.data import Dataset

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.measure.timing import data_wait_fraction
from sweeper.plan import GridPoint
from sweeper.report import analysis, data_bound, headline, sections
from sweeper.report.trials import Trial
from sweeper.worker.spec import WorkerContext
from sweeper.worker.train import train_point
from tests.helpers import point_spec

SLEEP_SECONDS = 0.004  # per sample: 32 ms per micro-batch of 8, against well under 5 ms of the MLP's step


class SleepyDigits(Dataset):
    """256 random 8x8 samples that take SLEEP_SECONDS each to read: a loader slower than the model."""

    def __init__(self, n: int = 256):
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        time.sleep(SLEEP_SECONDS)
        return self.x[index], self.y[index]


def sleepy_data():
    return SleepyDigits(), None


MLP = ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=2, width=32)
MEASURE = MeasureConfig(warmup_steps=1, windows=2, stable_windows=2, stability_tolerance=1.0, memory_breakdown=False,
                        flops=False)
spec = partial(point_spec, model=MLP, lr=0.05, steps=8, train=TrainConfig(seed=0), measure=MEASURE, evaluate=False)


def test_the_data_wait_fraction_is_the_data_phase_over_the_step():
    assert data_wait_fraction({"data_seconds_per_step": 0.03, "forward_backward_seconds_per_step": 0.008,
                               "optimizer_seconds_per_step": 0.002}) == pytest.approx(0.75)
    assert data_wait_fraction({}) is None


def _trial(result, key):
    return Trial(key=key, micro_batch_size=8, accumulation_steps=1, num_workers=1, global_batch_size=8, status="ok",
                 samples_per_second=result["samples_per_second"], data_wait_fraction=result["data_wait_fraction"])


@pytest.mark.solo
def test_a_point_whose_loader_cannot_keep_up_is_named_data_bound_with_the_settings_to_raise():
    torch.set_num_threads(1)
    sleepy = DataConfig(name="custom", _target_="tests.unit.test_data_bound.sleepy_data")
    slow = train_point(spec(GridPoint(8, 1, 1), data=sleepy), WorkerContext())
    fast = train_point(spec(GridPoint(8, 1, 1), data=DataConfig(name="digits")), WorkerContext())
    assert slow["status"] == fast["status"] == "ok"
    # 32 ms asleep per step in the loader, against a step of the MLP on 8 samples that takes a few ms.
    assert slow["data_wait_fraction"] > data_bound.DATA_BOUND_FRACTION
    assert fast["data_wait_fraction"] < data_bound.DATA_BOUND_FRACTION
    trials = [_trial(slow, "mb8-acc1-w1"), _trial(fast, "mb8-acc1-w2")]
    trials[1] = Trial(**{**trials[1].__dict__, "num_workers": 2, "global_batch_size": 16,
                         "samples_per_second": slow["samples_per_second"] / 2})  # the slower: the sleepy one wins
    rec = analysis.recommend(trials, "throughput")
    assert rec.best.key == "mb8-acc1-w1"
    assert f"It waited on its data loader for {slow['data_wait_fraction']:.0%} of each step (data-bound" in rec.reason
    assert "raise data.loader_workers" in rec.reason
    rows = headline.alternatives(rec)
    assert rows[0]["verdict"] == "recommended (data-bound)" and "data-bound" not in rows[1]["verdict"]
    section = dict(sections.sections(trials, None, {"loader_workers": "0", "pin_memory": "True",
                                                   "prefetch_factor": "None"}, {}))
    words = section["Input pipeline (data-bound points)"]
    assert words.startswith(f"1 of 2 points waited on their data loader for more than 50% of each step (data-bound): "
                            f"mb8-acc1-w1 ({slow['data_wait_fraction']:.0%})")
    assert "They ran with data.loader_workers=0, data.pin_memory=True, data.prefetch_factor=None" in words
    assert data_bound.words(trials[1:], {}) == ""  # no data-bound point: no section
