"""Streamed training data (workloads/streaming.py, sampler.RankStream): every layout of one global batch
sees the same sample ids at every optimizer step, on one rank or two, with 0 or 2 loader workers, across an
epoch boundary and a resume, for a team's own IterableDataset over shard files, Hugging Face `datasets`
streaming from local JSON files and webdataset tar shards. Ranks are simulated in one process: each rank's
DataLoader is what its worker builds (worker.step._loader)."""

from __future__ import annotations

import glob
import itertools
import io
import json
import os
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.sampler import rank_share
from sweeper.worker.spec import WorkerContext
from sweeper.worker.train import train_point
from sweeper.workloads import datasets, factory, streaming
from tests.helpers import point_spec

SHARD_LENGTHS = (300, 450, 250, 500, 500)  # 2,000 samples in five shards of unequal length
SAMPLES = sum(SHARD_LENGTHS)
ID_SCALE = 4096.0  # an id stored as id / 2^12 in a float32 feature comes back exactly
SEED = 11
# Every layout of global batch 8 on one rank and on two.
LAYOUTS = [GridPoint(8, 1, 1), GridPoint(4, 2, 1), GridPoint(1, 8, 1), GridPoint(4, 1, 2), GridPoint(2, 2, 2),
           GridPoint(1, 4, 2)]
STEPS = SAMPLES // 8 + 12  # past the first epoch's end (step 250)


def write_shards(folder) -> str:
    """Shard files of rows [id, 63 features] (numpy .npy), ids 0..1999 in file order."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    first = 0
    for i, n in enumerate(SHARD_LENGTHS):
        rows = np.concatenate([np.arange(first, first + n)[:, None] / ID_SCALE, rng.normal(size=(n, 63))], axis=1)
        np.save(os.path.join(folder, f"shard-{i:02d}.npy"), rows.astype(np.float32))
        first += n
    return str(folder)


class ShardFiles(IterableDataset):
    """A team's own stream over local shard files, as it already has it: `__iter__` reads every shard in
    turn; it lists its shards (`shards`, `read_shard`), so sweeper can open one without reading the others."""

    opened: list = []  # the shards read, in order (a test of what a resume reads)

    def __init__(self, folder: str):
        self.shards = sorted(glob.glob(os.path.join(folder, "*.npy")))

    def read_shard(self, path: str):
        ShardFiles.opened.append(os.path.basename(path))
        for row in np.load(path):
            yield torch.from_numpy(row.reshape(1, 8, 8)), int(round(row[0] * ID_SCALE)) % 10

    def __iter__(self):
        for path in self.shards:
            yield from self.read_shard(path)


class Unlisted(IterableDataset):
    """An IterableDataset that says nothing of its shards: read as one stream in its own order."""

    def __init__(self, folder: str):
        self.inner = ShardFiles(folder)

    def __iter__(self):
        return iter(self.inner)


def make_stream(folder: str, kind: str = "files"):
    """The data factory of the worker-level tests: (train stream, held-out split or None)."""
    if kind == "lengths":  # a Stream that says its shards' lengths
        files = ShardFiles(folder)
        return streaming.Stream(files.shards, files.read_shard, SHARD_LENGTHS), None
    train = ShardFiles(folder) if kind == "files" else Unlisted(folder)
    return train, None


def ids(inputs: torch.Tensor):
    return [int(round(v * ID_SCALE)) for v in inputs.reshape(len(inputs), -1)[:, 0].tolist()]


def ids_per_step(train, point: GridPoint, loader_workers: int, steps: int, start: int = 0):
    """The sample ids of each optimizer step: every rank's DataLoader read, its micro-batches gathered per step."""
    per_rank = []
    for rank in range(point.num_workers):
        dataset, sampler = rank_share(train, point, rank, steps, SEED, start)
        loader = DataLoader(dataset, batch_size=point.micro_batch_size, sampler=sampler, drop_last=True,
                            num_workers=loader_workers)
        per_rank.append([ids(inputs) for inputs, _ in loader])
    acc = point.accumulation_steps
    return [sorted(i for rank in per_rank for micro in rank[k * acc:(k + 1) * acc] for i in micro)
            for k in range(steps)]


def stream_order(stream: streaming.Stream, epochs: int):
    """The ids in stream order, worked out from the shards (each epoch: the shards in its seeded order, each
    in file order): what step k must hold is positions [8k, 8k + 8) of it."""
    firsts = np.cumsum((0,) + SHARD_LENGTHS)
    return [i for e in range(epochs) for s in stream.epoch_shards(SEED, e)
            for i in range(firsts[s], firsts[s] + SHARD_LENGTHS[s])]


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"))


def test_every_layout_of_one_global_batch_sees_the_same_samples_at_every_step(shard_folder):
    stream = streaming.as_stream(ShardFiles(shard_folder))
    assert stream.lengths is None and stream.counted().lengths == list(SHARD_LENGTHS)  # counted once, by reading
    stream = stream.counted()
    order = stream_order(stream, 2)
    expected = [sorted(order[8 * k: 8 * k + 8]) for k in range(STEPS)]
    assert sorted(order[:SAMPLES]) == list(range(SAMPLES))  # an epoch is every sample once
    assert stream.epoch_shards(SEED, 0) != stream.epoch_shards(SEED, 1)  # a fresh shard order each epoch
    for point in LAYOUTS:
        for loader_workers in (0, 2):
            assert ids_per_step(stream, point, loader_workers, STEPS) == expected, (point.key, loader_workers)


def test_a_resumed_stream_goes_on_where_it_stood_and_skips_the_shards_before_it_unread(shard_folder):
    stream = streaming.as_stream(ShardFiles(shard_folder)).counted()
    straight = ids_per_step(stream, GridPoint(8, 1, 1), 0, STEPS)
    before = ids_per_step(stream, GridPoint(4, 2, 1), 2, 100)
    # Continued at another layout of the same global batch (two ranks, loader workers) from 100 steps seen.
    after = ids_per_step(stream, GridPoint(2, 2, 2), 2, STEPS - 100, start=100 * 8)
    assert before + after == straight
    # Continued in the second epoch, 60 samples into its fourth shard: the three before it are not read.
    order = stream.epoch_shards(SEED, 1)
    start = SAMPLES + sum(SHARD_LENGTHS[s] for s in order[:3]) + 60
    ShardFiles.opened.clear()
    resumed = ids_per_step(stream, GridPoint(4, 1, 1), 0, 10, start=start)
    assert ShardFiles.opened == [f"shard-{order[3]:02d}.npy"]
    assert [i for step in resumed for i in step] == sorted(stream_order(stream, 2)[start: start + 40])


def test_an_iterable_that_lists_no_shards_is_one_stream_read_forward(shard_folder):
    plain = streaming.as_stream(Unlisted(shard_folder))
    assert plain.lengths is None and len(plain.counted()) == SAMPLES
    plain = plain.counted()
    reference = [sorted(range(8 * k, 8 * k + 8)) for k in range(20)]  # its own order, file by file
    assert ids_per_step(plain, GridPoint(2, 2, 2), 2, 20) == reference
    assert ids_per_step(plain, GridPoint(4, 1, 2), 0, 10, start=80) == reference[10:]
    # data.stream_samples: an epoch of its first 1,000 samples, without counting
    capped = streaming.as_stream(Unlisted(shard_folder), samples=1000)
    steps = ids_per_step(capped, GridPoint(8, 1, 1), 0, 130)
    assert steps[124] == list(range(992, 1000)) and steps[125] == list(range(8))


def test_a_shuffle_buffer_gives_every_reader_the_same_order(shard_folder):
    stream = streaming.Stream(ShardFiles(shard_folder).shards, ShardFiles(shard_folder).read_shard,
                              SHARD_LENGTHS, shuffle_buffer=64)
    one = ids_per_step(stream, GridPoint(8, 1, 1), 0, 60)
    assert one == ids_per_step(stream, GridPoint(1, 4, 2), 2, 60)
    assert one != [sorted(range(8 * k, 8 * k + 8)) for k in range(60)]  # shuffled within the shards
    assert sorted(i for step in ids_per_step(stream, GridPoint(8, 1, 1), 0, SAMPLES // 8) for i in step) == \
        list(range(SAMPLES))


def _json_shards(folder):
    os.makedirs(folder, exist_ok=True)
    first = 0
    for i, n in enumerate(SHARD_LENGTHS):
        with open(os.path.join(folder, f"part-{i}.jsonl"), "w") as f:
            for sample in range(first, first + n):
                f.write(json.dumps({"id": sample, "x": [sample / ID_SCALE] + [0.5] * 63}) + "\n")
        first += n
    return sorted(glob.glob(os.path.join(folder, "*.jsonl")))


def _row(row):
    return torch.tensor(row["x"], dtype=torch.float32).reshape(1, 8, 8), row["id"] % 10


def test_hugging_face_datasets_streaming_from_local_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    files = _json_shards(tmp_path / "json")
    hf = datasets.load_dataset("json", data_files=files, streaming=True, split="train")
    stream = streaming.as_stream(hf, decode=_row).counted()
    assert stream.lengths == list(SHARD_LENGTHS)  # one shard per file
    expected = [sorted(stream_order(stream, 2)[8 * k: 8 * k + 8]) for k in range(STEPS)]
    for point, loader_workers in ((GridPoint(8, 1, 1), 0), (GridPoint(2, 2, 2), 2), (GridPoint(1, 4, 2), 2)):
        assert ids_per_step(stream, point, loader_workers, STEPS) == expected, point.key
    assert ids_per_step(stream, GridPoint(4, 1, 2), 2, 12, start=240 * 8) == expected[240:252]


def test_webdataset_tar_shards_from_a_folder(tmp_path):
    wds = pytest.importorskip("webdataset")
    folder = tmp_path / "tars"
    folder.mkdir()
    first = 0
    for i, n in enumerate(SHARD_LENGTHS):
        with wds.TarWriter(str(folder / f"shard-{i:02d}.tar")) as sink:
            for sample in range(first, first + n):
                buffer = io.BytesIO()
                np.save(buffer, np.full((1, 8, 8), sample / ID_SCALE, dtype=np.float32))
                sink.write({"__key__": f"s{sample:05d}", "x.npy": buffer.getvalue(), "cls": str(sample % 10)})
        first += n

    def decode(sample):
        return torch.from_numpy(np.load(io.BytesIO(sample["x.npy"]))), int(sample["cls"])

    stream = streaming.webdataset_folder(str(folder), decode=decode).counted()
    expected = [sorted(stream_order(stream, 2)[8 * k: 8 * k + 8]) for k in range(STEPS)]
    for point, loader_workers in ((GridPoint(8, 1, 1), 0), (GridPoint(2, 2, 2), 2)):
        assert ids_per_step(stream, point, loader_workers, STEPS) == expected, point.key
    assert ids_per_step(stream, GridPoint(2, 2, 2), 2, 12, start=240 * 8) == expected[240:252]  # a resume


def test_the_data_factory_check_accepts_a_stream_and_counts_it_once(shard_folder):
    cfg = DataConfig(name="custom", _target_="tests.unit.test_streaming.make_stream", kwargs={"folder": shard_folder})
    made, problems = factory.call_data(cfg)
    assert problems == []
    splits = factory.splits_of(made, cfg)
    assert isinstance(splits.train, streaming.Stream) and len(splits.train) == SAMPLES
    assert splits.train.lengths == list(SHARD_LENGTHS)
    told = factory.made_problems("data._target_='f'", (Unlisted(shard_folder + "/none"), None))
    assert told == ["data._target_='f' returned an empty train dataset: it needs samples to train on"]


MLP = ModelConfig(name="mlp", input_shape=[1, 8, 8], depth=2, width=32)
MEASURE = MeasureConfig(warmup_steps=1, windows=2, stable_windows=2, memory_breakdown=False, flops=False)


def _spec(folder, point, steps, loader_workers=0, **extra):
    data = DataConfig(name="custom", _target_="tests.unit.test_streaming.make_stream", kwargs={"folder": folder},
                      loader_workers=loader_workers)
    return point_spec(point, MLP, data, lr=0.01, steps=steps, train=TrainConfig(seed=SEED), measure=MEASURE,
                      optim=OptimConfig(name="sgd", lr=0.01), evaluate=False, **extra)


def test_a_stream_trains_through_the_worker_alike_at_every_layout_and_goes_on_from_its_checkpoint(shard_folder,
                                                                                                   tmp_path):
    torch.set_num_threads(1)
    run = partial(train_point, ctx=WorkerContext())
    losses = lambda r: torch.tensor(r["train_loss"], dtype=torch.float64)  # noqa: E731
    straight = run(_spec(shard_folder, GridPoint(16, 1, 1), 130))  # 2,080 samples: into the second epoch
    accumulated = run(_spec(shard_folder, GridPoint(4, 4, 1), 130, loader_workers=2))
    torch.testing.assert_close(losses(accumulated), losses(straight), rtol=1e-5, atol=1e-6)
    first = run(_spec(shard_folder, GridPoint(16, 1, 1), 60, save_state_to=str(tmp_path / "s")))
    after = run(_spec(shard_folder, GridPoint(8, 2, 1), 70, loader_workers=2, start_from=str(tmp_path / "s")))
    assert first["status"] == after["status"] == "ok" and after["start_samples"] == 60 * 16
    torch.testing.assert_close(losses(after), losses(straight)[60:], rtol=1e-5, atol=1e-6)


def test_batchnorm_is_re_estimated_from_a_streams_first_samples(shard_folder):
    from sweeper.worker.evaluate import recalibrate_batchnorm

    stream = streaming.as_stream(ShardFiles(shard_folder)).counted()  # no random access: shard 0's first samples
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(64)).eval()
    assert recalibrate_batchnorm(model, stream, micro_batch_size=8, samples=40, seed=0,
                                 device=torch.device("cpu")) == 40
    first = torch.stack([x.reshape(-1) for x, _ in itertools.islice(iter(stream), 40)])
    torch.testing.assert_close(model[1].running_mean, first.mean(0))
    assert ids(first[:, None]) == list(range(40))


class SplitsItself(ShardFiles):
    """Splits each shard across DataLoader workers itself (torch's docs' pattern): sweeper must split it."""

    def read_shard(self, path: str):
        info = torch.utils.data.get_worker_info()
        rows = super().read_shard(path)
        return rows if info is None else itertools.islice(rows, info.id, None, info.num_workers)


def test_a_stream_shorter_than_it_says_is_refused_at_its_first_shards_end(shard_folder):
    stream = streaming.as_stream(SplitsItself(shard_folder)).counted()  # counted whole, in the driver
    # Each of 2 loader workers reads half of every shard: the first shard it opens ends at half its length,
    # within 130 steps of 4 (520 samples; no shard is over 500), and the point stops there with the fix.
    with pytest.raises(ValueError, match="ended after .* samples, short of its length .* yield it whole"):
        ids_per_step(stream, GridPoint(4, 1, 1), 2, 130)
    # data.stream_samples beyond shards of known lengths: refused by the check (unknown lengths are not counted
    # when it is set: the stream then stops the point with one line where it ends).
    cfg = DataConfig(name="custom", _target_="tests.unit.test_streaming.make_stream",
                     kwargs={"folder": shard_folder, "kind": "lengths"})
    assert datasets.check(replace(cfg, stream_samples=5000)) == [
        "data.stream_samples=5000 is more than the stream holds (2000 samples): set it to at most that, or null"]
    assert datasets.check(replace(cfg, stream_samples=2000)) == []
