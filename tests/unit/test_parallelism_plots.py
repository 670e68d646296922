"""The report across parallelisms: memory per worker against workers and throughput against the micro-batch, one
line per parallelism, only when the sweep measured more than one (a DDP-only report is unchanged); the headline and
the alternatives name the recommended point's sharding (its key)."""

import os

from matplotlib.image import imread

from sweeper.report import headline, parallelism
from sweeper.report.plots import by_parallelism
from sweeper.report.analysis import recommend
from tests.helpers import trial

MIB = 2 ** 20


def layout(mb, acc, w, p="ddp", sps=100.0, peak=100.0, status="ok", seed=None):
    """A run (tests.helpers.trial) of parallelism `p`, named by its key only (as before the record had it), at
    `sps` samples/s and `peak` MiB."""
    return trial(mb, acc, w, status, suffix="" if p == "ddp" else f"-{p}", seed=seed, samples_per_second=sps,
                 peak_memory_bytes=None if peak is None else peak * MIB, val_accuracy=0.9, val_samples=20000, lr=0.01)


SWEEP = [
    layout(4, 2, 1, sps=40, peak=70), layout(4, 1, 2, sps=60, peak=68), layout(8, 1, 1, sps=50, peak=90),
    layout(4, 2, 1, "zero3", sps=30, peak=72), layout(4, 1, 2, "zero3", sps=45, peak=46),
    layout(8, 1, 2, "zero3", sps=55, peak=60), layout(4, 2, 2, "zero3", sps=44, peak=58),
    layout(4, 1, 2, "zero2", sps=50, peak=51), layout(16, 1, 2, "zero2", status="oom", sps=None, peak=None),
]


def test_a_points_parallelism_is_its_record_else_its_keys_suffix():
    assert [parallelism.of(t) for t in SWEEP[:5]] == ["ddp", "ddp", "ddp", "zero3", "zero3"]
    assert parallelism.of(layout(4, 1, 2, "zero2", seed=1)) == "zero2"  # mb4-acc1-w2-zero2-s1
    assert parallelism.of(type("Recorded", (), {"key": "mb4-acc1-w2", "parallelism": "zero3"})()) == "zero3"
    assert parallelism.of(type("Old", (), {"key": "mb4-acc1-w2-bf16", "parallelism": "None"})()) == "ddp"


def test_a_ddp_only_sweep_draws_nothing_more(tmp_path):
    assert by_parallelism.draw(str(tmp_path), SWEEP[:3], 2 ** 30) == {}
    assert os.listdir(tmp_path) == []


def test_one_line_per_parallelism_in_both_figures(tmp_path):
    images = by_parallelism.draw(str(tmp_path), SWEEP, 64 * MIB)
    assert sorted(images) == ["memory_per_worker_by_parallelism", "throughput_by_parallelism"]
    for path in images.values():
        assert imread(path).shape[:2] == (540, 840)
    ok = [t for t in SWEEP if t.status == "ok"]
    # Memory at micro-batch 4 (measured at the most parallelism x workers pairs): the largest peak over
    # accumulation at each worker count (zero3 at two workers: 58 MiB at accumulation 2, not 46).
    memory = by_parallelism._lines([t for t in ok if t.micro_batch_size == 4], lambda t: t.num_workers,
                                      lambda t: t.peak_memory_bytes / MIB)
    assert memory == {"ddp": [(1, 70.0), (2, 68.0)], "zero2": [(2, 51.0)], "zero3": [(1, 72.0), (2, 58.0)]}
    # Throughput at two workers, the count every parallelism measured.
    rates = by_parallelism._lines([t for t in ok if t.num_workers == 2], lambda t: t.micro_batch_size,
                                     lambda t: t.samples_per_second)
    assert rates == {"ddp": [(4, 60.0)], "zero2": [(4, 50.0)], "zero3": [(4, 45.0), (8, 55.0)]}


def test_the_headline_and_the_alternatives_name_the_recommended_sharding():
    sweep = [layout(4, 1, 2, sps=60, peak=200), layout(8, 1, 2, "zero3", sps=80, peak=60)]
    rec = recommend(sweep, objective="throughput", memory_budget_bytes=100 * MIB)
    assert rec.best.key == "mb8-acc1-w2-zero3"
    assert headline.headline(rec, None)[0].startswith("Train mb8-acc1-w2-zero3: ")
    assert headline.alternatives(rec)[0]["point"] == "mb8-acc1-w2-zero3"


def test_layouts_at_the_same_micro_batch_that_differ_by_sharding_or_sync_are_series_of_their_own(tmp_path):
    """DDP, ZeRO-3 and ZeRO-3 in the every sync at mb4-acc2-w2 all measured: one throughput per size per
    series, so the knees and the throughput plot build (they raised 'appears twice in one series')."""
    from dataclasses import replace

    from sweeper.report.figures import knees_per_recipe
    from sweeper.report.plots import throughput_vs_micro_batch

    every = replace(layout(4, 2, 2, "zero3", sps=40), key="mb4-acc2-w2-zero3-every", gradient_sync="every")
    layouts = [layout(4, 2, 2, sps=50), layout(8, 2, 2, sps=80), layout(4, 2, 2, "zero3", sps=45),
               layout(8, 2, 2, "zero3", sps=70), every]
    knees = knees_per_recipe(layouts, 0.10)
    assert set(knees) == {(2, 2, ""), (2, 2, "zero3"), (2, 2, "zero3, sync every")}
    assert knees[(2, 2, "")] is None  # 50 -> 80: still climbing
    assert throughput_vs_micro_batch(layouts, knees, str(tmp_path / "t.png"), 0.10)
