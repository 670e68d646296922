"""Your loop (loop.fn, sweeper.loop) and your LightningModule (model=lightning), trained in-process: at one global
batch they train the built-in loop's model, step for step (BatchNorm-free, so every layout trains alike), and record
the same figures; two gloo ranks under DDP and FSDP2 (zero3) train it too; what they get wrong is said in one line.
"""

from __future__ import annotations

import datetime
import functools
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sweeper.config import DataConfig, LoopConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.worker import user_loop
from sweeper.worker.spec import WorkerContext
from sweeper.worker.train import train_point
from tests.helpers import point_spec, problems

STEPS, LR = 16, 0.05
MODEL = ModelConfig(name="custom", _target_="tests.your_loop.block_net", input_shape=[8], checkpoint_modules=["Block"])
DATA = DataConfig(name="custom", _target_="tests.your_loop.blob_data", num_classes=4)
LOOP = LoopConfig(fn="tests.your_loop.train_loop_per_worker", metrics={"hit_rate": "higher"})
MEASURE = MeasureConfig(warmup_steps=2, windows=3, stable_windows=2)
# The Ray Train-style loop's optimizer: SGD with momentum 0.9, no weight decay.
spec_of = functools.partial(point_spec, model=MODEL, data=DATA, lr=LR, steps=STEPS, train=TrainConfig(samples=256),
                            measure=MEASURE, optim=OptimConfig(name="sgd", lr=LR, momentum=0.9, weight_decay=0.0))
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def built_in():
    return train_point(spec_of(GridPoint(16, 1, 1)), WorkerContext())


@pytest.fixture(scope="module")
def yours():
    """The Ray Train-style loop at two layouts of global batch 16."""
    return {point.key: user_loop.train_point(spec_of(point, loop=LOOP), WorkerContext())
            for point in (GridPoint(8, 2, 1), GridPoint(16, 1, 1))}


def test_your_loop_trains_the_built_in_loops_losses_at_one_global_batch(built_in, yours):
    assert built_in.status == "ok", built_in.error
    for key, result in yours.items():
        assert result.status == "ok", (key, result.error)
        assert len(result.train_loss) == STEPS
        assert result.train_loss == pytest.approx(built_in.train_loss, abs=TOLERANCE), key
        assert result.divergence.grad_norm == pytest.approx(built_in.divergence.grad_norm, rel=1e-4), key


def test_your_loop_records_the_built_in_loops_figures_and_its_evaluations(built_in, yours):
    result = yours["mb8-acc2-w1"]
    # What only sweeper's own evaluation knows (the split's size and classes, the loss's spread, BatchNorm's
    # recalibration, the evaluation batch size) is the built-in's alone; every other figure is recorded alike.
    evaluation_only = {"val_loss_se", "val_samples", "num_classes", "eval_batch_size"}
    # The built-in step counts the collectives it runs and records the gradient sync it did (issue 56); your loop's
    # own backward and step are not counted yet, so those three figures are the built-in's alone too.
    evaluation_only |= {"gradient_sync", "communication_bytes_per_step", "communication_collectives_per_step"}
    # at the built-in's own layout (one micro-batch per step, so both say why there is no noise scale)
    assert set(built_in.to_flat()) - set(yours["mb16-acc1-w1"].to_flat()) == evaluation_only
    assert set(built_in.to_flat()) - set(result.to_flat()) == evaluation_only | {"gns_note"}
    assert result.throughput.samples_per_second > 0 and result.throughput.timing_windows == 3
    assert result.memory.memory_tracked_peak_bytes > 0 and result.memory.peak_memory_bytes > 0
    assert result.noise.gns_b_simple is not None  # two micro-batches per step: the noise scale is measured
    # the evaluation your loop reported after its one pass: the final weights', as the built-in loop evaluates them
    assert result.accuracy.val_accuracy == pytest.approx(built_in.accuracy.val_accuracy, abs=1e-6)
    assert result.accuracy.val_loss == pytest.approx(built_in.accuracy.val_loss, abs=1e-5)
    assert result.accuracy.val_metrics == {"hit_rate": result.accuracy.val_accuracy}
    assert result.accuracy.val_metric_directions == "hit_rate=higher"
    assert result.progress.val_accuracy_curve == [(STEPS * 16, result.accuracy.val_accuracy)]


def test_an_accelerate_style_loop_trains_the_same_model():
    spec = spec_of(GridPoint(8, 2, 1), loop=LoopConfig(fn="tests.your_loop.accelerate_style_loop"))
    ray_style = user_loop.train_point(spec_of(GridPoint(8, 2, 1), loop=LOOP), WorkerContext())
    result = user_loop.train_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    assert result.train_loss == pytest.approx(ray_style.train_loss, abs=TOLERANCE)
    assert result.accuracy.val_accuracy is None  # it evaluates nothing


def test_the_passes_end_at_each_evaluation_and_the_budget():
    from sweeper.config import EvalConfig

    # every 96 samples = 6 steps of 16: evaluations after steps 6 and 12, and the budget's end (16)
    spec = spec_of(GridPoint(16, 1, 1), loop=LOOP, eval=EvalConfig(every_samples=96, target_accuracy=0.05))
    assert user_loop.passes_of(spec) == 3
    result = user_loop.train_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    assert [samples for samples, _ in result.progress.val_accuracy_curve] == [96, 192, 256]
    assert result.progress.reached_target == 1 and result.progress.steps_to_target == 6
    assert result.progress.samples_to_target == 96


def test_a_loop_that_returns_early_or_reports_no_loss_fails_the_point_in_one_line():
    with pytest.raises(RuntimeError, match="returned after 1 of the point's 16 optimizer steps"):
        user_loop.train_point(spec_of(GridPoint(1, 1, 1), loop=LoopConfig(fn="tests.your_loop.loop_that_stops_early"),
                                      steps=16), WorkerContext())
    with pytest.raises(RuntimeError, match=r"reported no loss in step 0: call sweeper.loop.report\(loss=loss\)"):
        user_loop.train_point(spec_of(GridPoint(1, 1, 1), loop=LoopConfig(fn="tests.your_loop.loop_without_loss")),
                              WorkerContext())
    with pytest.raises(RuntimeError, match="sweeper.loop is called outside a point"):
        import sweeper.loop

        sweeper.loop.step()


def test_your_loop_and_lightning_are_refused_where_they_cannot_run():
    loop = ("loop.fn=tests.your_loop.train_loop_per_worker",)
    assert problems(*loop, "train.step_fn=tests.your_training.classify_step", "train.samples=256") == [
        "loop.fn=tests.your_loop.train_loop_per_worker with train.step_fn=tests.your_training.classify_step: the "
        "step is your loop's; drop train.step_fn"]
    assert problems(*loop) == [
        "loop.fn=tests.your_loop.train_loop_per_worker with train.samples=null: your data is your own, so the budget "
        "is given in samples; set train.samples, e.g. train.samples=4096"]
    assert problems(*loop, "train.samples=256", "sweep.strategy=smart") == [
        "loop.fn=tests.your_loop.train_loop_per_worker with sweep.strategy=smart: its runs continue saved training "
        "states, which a loop of yours cannot hand over yet; use sweep.strategy=grid"]
    assert problems(*loop, "train.samples=256", "sweep.parallelism=[ddp,zero1]") == [
        "loop.fn=tests.your_loop.train_loop_per_worker with sweep.parallelism=zero1: your loop's optimizer is not "
        "split per rank; use ddp or zero2"]
    # Your DataLoader's dataset is read by index in the point's order (worker/point_stream): no streamed data.
    assert problems(*loop, "train.samples=256", "data.stream_samples=100") == [
        "loop.fn=tests.your_loop.train_loop_per_worker with data.stream_samples=100: your DataLoader's dataset is "
        "read by index in the point's order (map-style, len() and indexing); streamed data is sweeper's own "
        "loop's: drop data.stream_samples"]
    lightning = ("model=lightning", "model.module=tests.your_lightning.LitClassifier", "train.samples=256")
    assert problems(*lightning, "data.datamodule=tests.your_lightning.BlobDataModule") == [
        "model=lightning with data=digits: Lightning trains on your LightningDataModule; add data=lightning "
        "data.datamodule=<its import path>"]
    assert problems(*lightning, "data=lightning", "data.datamodule=tests.your_lightning.BlobDataModule",
                    "sweep.parallelism=[zero3]", "model.checkpoint_modules=[Block]", "gns.enabled=false") == [
        "model=lightning with sweep.parallelism=zero3: sharded points are not run under Lightning's "
        "ModelParallelStrategy yet; use sweep.parallelism=[ddp]"]
    assert problems("data.datamodule=tests.your_lightning.BlobDataModule") == [
        "data.datamodule=tests.your_lightning.BlobDataModule is a LightningDataModule: use model=lightning "
        "data=lightning, or drop it"]


def test_a_lightning_module_fitted_by_lightnings_trainer_trains_the_built_in_loops_model(built_in):
    from sweeper.worker import lightning_point

    model = ModelConfig(name="lightning", module="tests.your_lightning.LitClassifier", kwargs={"lr": LR})
    data = DataConfig(name="lightning", datamodule="tests.your_lightning.BlobDataModule")
    spec = spec_of(GridPoint(8, 2, 1), model=model, data=data)
    result = lightning_point.train_point(spec, WorkerContext())
    assert result.status == "ok", result.error
    assert result.train_loss == pytest.approx(built_in.train_loss, abs=TOLERANCE)
    assert result.accuracy.val_accuracy == pytest.approx(built_in.accuracy.val_accuracy, abs=1e-6)
    assert result.accuracy.val_loss == pytest.approx(built_in.accuracy.val_loss, abs=1e-5)
    assert result.throughput.samples_per_second > 0 and result.memory.memory_tracked_peak_bytes > 0


# ---------------------------------------------------------------------------------------------------------------
# Two gloo ranks: your loop under DDP and sharded by FSDP2 (zero3)


def _rank(rank: int, world: int, folder: str, specs) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        out = {}
        for name, spec in specs.items():
            result = user_loop.train_point(spec, WorkerContext(rank, world))
            out[name] = (result.status, result.error, result.train_loss)
    finally:
        dist.destroy_process_group()
    torch.save(out, os.path.join(folder, f"rank{rank}.pt"))


def test_your_loop_on_two_ranks_under_ddp_and_zero3_trains_the_built_in_loops_losses(built_in, tmp_path):
    specs = {"ddp": spec_of(GridPoint(8, 1, 2), loop=LOOP),
             "zero3": spec_of(GridPoint(4, 2, 2, parallelism="zero3"), loop=LOOP)}
    mp.spawn(_rank, args=(2, str(tmp_path), specs), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name in specs:
        status, error, losses = ranks[0][name]
        assert status == "ok", (name, error)
        assert losses == pytest.approx(built_in.train_loss, abs=TOLERANCE), name
        assert ranks[1][name][2] == losses
