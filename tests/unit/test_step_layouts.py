"""Layouts of one global batch train the same model with your step, a cosine schedule and clipping at a norm the
gradients reach, under DDP and under ZeRO-3, across two gloo processes on the CPU: a BatchNorm-free classifier of
dict batches (a mean over samples), and token sequences padded per batch whose loss counts the tokens that are
not padding (a sum over items, normalized by the global batch's items across micro-steps and ranks). And the
memory-tracked step of a stream whose largest batch is elsewhere: every rank probes its own largest, and the
training is the same as untracked.

One spawn of two ranks runs every point (importing torch twice costs ~10 s here); rank 0 then trains the
one-process layouts the pairs must match. Each test asserts one of the findings.
"""

import dataclasses
import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sweeper.config import DataConfig, GnsConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.train import train_point

TOLERANCE = 1e-5
STEPS, GLOBAL_BATCH = 8, 16
MEASURE = MeasureConfig(warmup_steps=2, windows=3, stable_windows=2, stability_tolerance=0.9, flops=False,
                        memory_breakdown=False)
ADAMW = OptimConfig(name="adamw", lr=0.01, weight_decay=0.01)
# (model, data, your step, the clipping norm: below the gradient's norm at some of the steps)
WORKLOADS = {
    "classifier": (ModelConfig(name="blocknet", _target_="tests.your_training.block_net", checkpoint_modules=["Block"]),
                   DataConfig(name="dicts", _target_="tests.your_training.dict_data", num_classes=4),
                   "tests.your_training.classify_step", 1.6),
    "tokens": (ModelConfig(name="tokennet", _target_="tests.your_training.token_net", checkpoint_modules=["Block"]),
               DataConfig(name="tokens", _target_="tests.your_training.token_data", num_classes=16,
                          collate_fn="tests.your_training.pad_collate"),
               "tests.your_training.token_step_sum", 1.02),
    # one 40-token sequence among short ones: the memory-tracked step runs the stream's largest batch first
    "long": (ModelConfig(name="tokennet", _target_="tests.your_training.token_net", checkpoint_modules=["Block"]),
             DataConfig(name="tokens", _target_="tests.your_training.one_long_token_data", num_classes=16,
                        collate_fn="tests.your_training.pad_collate"),
             "tests.your_training.token_step_sum", 1.02),
}
PAIRS = [(8, 1), (4, 2)]  # micro-batch, accumulation at two workers: global batch 16
ALONE = [(16, 1), (4, 4)]  # at one worker


def _spec(workload: str, micro: int, accumulation: int, workers: int, parallelism: str = "ddp",
          tracked: bool = False) -> PointSpec:
    model, data, step_fn, clip = WORKLOADS[workload]
    train = TrainConfig(seed=2, step_fn=step_fn, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1,
                        grad_clip_norm=clip)
    point = GridPoint(micro, accumulation, workers, parallelism=parallelism)
    measure = dataclasses.replace(MEASURE, memory_breakdown=tracked)
    return PointSpec(model=model, data=data, train=train, measure=measure, point=point, lr=ADAMW.lr, steps=STEPS,
                     optim=ADAMW, gns=GnsConfig(enabled=False), evaluate=False,
                     schedule_samples=STEPS * GLOBAL_BATCH)


def _figures(result) -> dict:
    return dict(status=result.status, error=result.error, loss=list(result.train_loss or []),
                clipped=result.get("grad_clipped_steps"), norms=result.get("grad_norm"),
                items=result.get("items_seen"), accuracy=(result.recipe.step_metrics or {}).get("accuracy"))


def _rank(rank: int, world: int, folder: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    out = {}
    try:
        out["probes"] = _tracked_points(rank, world)
        for workload in ("classifier", "tokens"):
            for parallelism in ("ddp", "zero3"):
                for micro, accumulation in PAIRS:
                    spec = _spec(workload, micro, accumulation, 2, parallelism)
                    out[(workload, parallelism, micro, accumulation, 2)] = _figures(
                        train_point(spec, WorkerContext(rank, world)))
    finally:
        dist.destroy_process_group()
    if rank == 0:
        for workload in ("classifier", "tokens"):
            for micro, accumulation in ALONE:
                spec = _spec(workload, micro, accumulation, 1)
                out[(workload, "ddp", micro, accumulation, 1)] = _figures(train_point(spec, WorkerContext()))
    torch.save(out, os.path.join(folder, f"rank{rank}.pt"))


def _tracked_points(rank: int, world: int) -> dict:
    """The long-sequence stream at (4, 2) on both ranks, memory-tracked and not, under DDP and ZeRO-3, with the
    elements of each batch the tracked step probed (worker.largest.probe, spied on)."""
    from sweeper.worker import largest
    from sweeper.workloads import batches

    probed, real = [], largest.probe
    largest.probe = lambda run, batch: (probed.append(batches.element_count(batch)), real(run, batch))
    out = {}
    for parallelism in ("ddp", "zero3"):
        for tracked in (True, False):
            probed.clear()
            figures = _figures(train_point(_spec("long", 4, 2, 2, parallelism, tracked), WorkerContext(rank, world)))
            out[(parallelism, tracked)] = dict(figures, probed=list(probed))
    largest.probe = real
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("step_layouts"))
    mp.spawn(_rank, args=(2, folder), nprocs=2, join=True)
    return [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(2)]


def _runs(ranks, workload):
    return {key[1:]: figures for key, figures in ranks[0].items() if key != "probes" and key[0] == workload}


@pytest.mark.parametrize("parallelism", ["ddp", "zero3"])
def test_every_rank_probes_the_streams_largest_batch_in_the_tracked_step_and_trains_as_without_it(ranks, parallelism):
    """One rank's share holds the 40-token sequence, so both probe (the same collectives), each with its own
    largest batch; the training is the same as untracked."""
    tracked = [rank["probes"][(parallelism, True)] for rank in ranks]
    plain = ranks[0]["probes"][(parallelism, False)]
    assert all(t["status"] == "ok" for t in tracked) and plain["status"] == "ok", [t["error"] for t in tracked]
    assert [len(t["probed"]) for t in tracked] == [1, 1] and plain["probed"] == []
    assert max(t["probed"][0] for t in tracked) == 3 * 4 * 40  # micro-batch 4 x the 40 tokens, 3 tensors
    assert tracked[0]["loss"] == pytest.approx(plain["loss"], abs=1e-6)


@pytest.mark.parametrize("workload", ["classifier", "tokens"])
def test_every_layout_of_one_global_batch_gives_the_same_losses_under_ddp_and_zero3(ranks, workload):
    runs = _runs(ranks, workload)
    assert all(r["status"] == "ok" for r in runs.values()), {k: r["error"] for k, r in runs.items()}
    reference = runs[("ddp", 16, 1, 1)]["loss"]
    assert len(reference) == STEPS and reference[-1] < reference[0]  # it learns
    for layout, figures in runs.items():
        assert figures["loss"] == pytest.approx(reference, abs=TOLERANCE, rel=TOLERANCE), layout
    for key, figures in ranks[1].items():  # the second rank agrees with the first
        if key != "probes":
            assert figures["loss"] == ranks[0][key]["loss"]


@pytest.mark.parametrize("workload", ["classifier", "tokens"])
def test_the_clipping_norm_was_reached_and_clipped_alike_in_every_layout(ranks, workload):
    runs = _runs(ranks, workload)
    clipped = {layout: figures["clipped"] for layout, figures in runs.items()}
    assert set(clipped.values()) == {clipped[("ddp", 16, 1, 1)]} and 0 < clipped[("ddp", 16, 1, 1)] < STEPS
    reference = runs[("ddp", 16, 1, 1)]["norms"]
    for layout, figures in runs.items():  # the whole gradient's norm before clipping, ZeRO-3's over every shard
        assert figures["norms"] == pytest.approx(reference, rel=1e-4), layout


def test_padded_sequences_hold_different_token_counts_and_each_layout_counted_them_all(ranks):
    runs = _runs(ranks, "tokens")
    items = {figures["items"] for figures in runs.values()}
    assert len(items) == 1 and STEPS * GLOBAL_BATCH * 2 < items.pop() < STEPS * GLOBAL_BATCH * 12


def test_your_steps_figures_are_averaged_over_the_ranks(ranks):
    runs = _runs(ranks, "classifier")
    accuracies = [figures["accuracy"] for figures in runs.values()]
    assert all(0.0 <= a <= 1.0 for a in accuracies)
    assert max(accuracies) - min(accuracies) < 1e-6  # the timed steps' samples are the same in every layout
