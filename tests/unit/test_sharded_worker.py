"""A sharded point through the worker's own path (worker.train.train_point: setup's sharding, the optimizer on
the shards, divergence's gradient norm, the evaluation, the saved training state) across two gloo processes on
the CPU, against the same point under DDP; and the two places FSDP2 needs care: an evaluation whose ranks hold
shares of unequal batch counts (every sharded forward is a collective) and the norm of sharded gradients.

One spawn of two ranks runs every scenario (importing torch twice costs ~10 s here); each test asserts one of
its findings.
"""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from sweeper import config
from sweeper.config import MeasureConfig
from sweeper.plan import GridPoint
from sweeper.worker import evaluate as evaluation
from sweeper.worker import sharding, state
from sweeper.worker.gns import total_norm
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.train import train_point
from sweeper.workloads.gpt import GPT
from tests.harness import compose_cfg

TOLERANCE = 1e-5
VOCAB, CONTEXT = 32, 8
STEPS = 8  # 2 warm-up steps, 3 windows of 2 steps
MEASURE = MeasureConfig(warmup_steps=2, windows=3, flops=False, memory_breakdown=False)


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(VOCAB, CONTEXT, 2, 2, 16)


def _sequences(count: int) -> TensorDataset:
    starts = torch.randint(0, VOCAB, (count, 1), generator=torch.Generator().manual_seed(3))
    tokens = (starts + torch.arange(CONTEXT + 1)) % VOCAB
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def _spec(parallelism: str, workers: int, save_to: str, sync: str = "final") -> PointSpec:
    cfg = config.load(compose_cfg("model=mlp", "data=digits", "optim=adamw", "gns.enabled=false"))
    point = GridPoint(16, 2, workers, parallelism=parallelism, gradient_sync=sync)
    return PointSpec(model=cfg.model, data=cfg.data, train=cfg.train, measure=MEASURE, point=point, lr=0.01,
                     steps=STEPS, optim=cfg.optim, loss=cfg.loss, eval=cfg.eval, divergence=cfg.divergence,
                     gns=cfg.gns, save_state_to=save_to)


def _figures(result) -> dict:
    return dict(status=result.status, loss=list(result.train_loss or []), accuracy=result.get("val_accuracy"),
                val_loss=result.get("val_loss"), norms=result.get("grad_norm"), error=result.error,
                sync=result.gradient_sync, sent=result.get("communication_bytes_per_step"),
                collectives=result.get("communication_collectives_per_step"))


def _held_by_the_worker(spec: PointSpec, rank: int, world: int) -> list:
    """The worker's own setup of a point (worker.step.setup): each parameter of the model it trains, as (its
    type's name, elements this rank holds, elements of the whole)."""
    from sweeper.measure import telemetry
    from sweeper.worker.step import setup
    from sweeper.workloads import datasets

    splits = datasets.load(spec.data, spec.model.input_shape)
    run = setup(spec, WorkerContext(rank, world), telemetry.select(False, 0), splits)
    return [(type(p).__name__, (p.to_local() if hasattr(p, "to_local") else p).numel(), p.numel())
            for p in run.model.parameters()]


def _sharded_evaluation(rank: int, world: int) -> dict:
    """evaluate() of a ZeRO-3 GPT over 5 sequences in batches of 2: rank 0's share (3) takes 2 batches, rank 1's
    (2) one; and the same in one process, unsharded."""
    data, in_twos = _sequences(5), evaluation.Settings(batch_size=2)
    model, _ = sharding.apply(_gpt(), "zero3")
    ctx = WorkerContext(rank, world)
    sharded = evaluation.evaluate(model, data, torch.device("cpu"), ctx, in_twos)
    alone = evaluation.evaluate(_gpt(), data, torch.device("cpu"), WorkerContext(), in_twos)
    return dict(sharded=sharded, alone=alone)


def _sharded_grad_norm() -> dict:
    """sharding.grad_norm of a ZeRO-2 GPT after one backward on the same batch on both ranks (their average is
    that batch's gradient), and the norm of that gradient in one unsharded model."""
    inputs, targets = _sequences(4).tensors
    norms = {}
    for name, model in (("sharded", sharding.apply(_gpt(), "zero2")[0]), ("alone", _gpt())):
        F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).backward()
        norms[name] = (sharding.grad_norm(model) if name == "sharded"
                       else total_norm([p.grad for p in model.parameters()])).item()
    return norms


def _rank(rank: int, world: int, folder: str, specs) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        out = {"evaluation": _sharded_evaluation(rank, world), "grad_norm": _sharded_grad_norm(),
               "held": {name: _held_by_the_worker(spec, rank, world) for name, spec in specs.items()}}
        for name, spec in specs.items():
            out[name] = _figures(train_point(spec, WorkerContext(rank, world)))
    finally:
        dist.destroy_process_group()
    if rank == 0:  # one worker with no process group (a Ray Tune trial's own process): a gloo group of one
        out["zero3 alone"] = _figures(train_point(_spec("zero3", 1, None), WorkerContext()))
        out["group after"] = dist.is_initialized()
    torch.save(out, os.path.join(folder, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("sharded_worker"))
    specs = {name: _spec(name, 2, os.path.join(folder, name)) for name in ("ddp", "zero3")}
    specs["zero3 every"] = _spec("zero3", 2, None, "every")
    mp.spawn(_rank, args=(2, folder, specs), nprocs=2, join=True)
    ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    return dict(ranks=ranks, folder=folder)


def test_a_zero3_point_trains_evaluates_and_checks_divergence_as_the_ddp_point_does(two_ranks):
    rank0 = two_ranks["ranks"][0]
    ddp, zero3 = rank0["ddp"], rank0["zero3"]
    assert ddp["status"] == zero3["status"] == "ok", (ddp["error"], zero3["error"])
    assert len(zero3["loss"]) == STEPS
    assert zero3["loss"] == pytest.approx(ddp["loss"], abs=TOLERANCE)
    assert zero3["accuracy"] == pytest.approx(ddp["accuracy"], abs=TOLERANCE)
    assert zero3["val_loss"] == pytest.approx(ddp["val_loss"], abs=TOLERANCE)
    # divergence's gradient norm at every step: the whole gradient's, not this rank's shards'
    assert zero3["norms"] and zero3["norms"] == pytest.approx(ddp["norms"], rel=1e-4)
    assert two_ranks["ranks"][1]["zero3"]["loss"] == zero3["loss"]


def test_a_zero3_points_saved_state_is_whole_and_named_as_the_bare_model(two_ranks):
    ddp = state.read(os.path.join(two_ranks["folder"], "ddp"))
    zero3 = state.read(os.path.join(two_ranks["folder"], "zero3"))
    assert set(zero3.weights) == set(ddp.weights)
    for name, weight in ddp.weights.items():
        assert torch.allclose(zero3.weights[name], weight, atol=TOLERANCE), name
    assert sorted(zero3.optimizer["state"]) == sorted(ddp.optimizer["state"])


def test_a_zero3_point_at_one_worker_without_a_process_group_trains_in_a_group_of_its_own(two_ranks):
    alone = two_ranks["ranks"][0]["zero3 alone"]
    assert alone["status"] == "ok", alone["error"]
    assert len(alone["loss"]) == STEPS
    assert two_ranks["ranks"][0]["group after"] is False  # the group of one ends with the point


def test_a_sharded_evaluation_pads_the_shorter_share_and_scores_each_sample_once(two_ranks):
    for rank in two_ranks["ranks"]:
        sharded, alone = rank["evaluation"]["sharded"], rank["evaluation"]["alone"]
        assert sharded[3] == alone[3] == 5 * CONTEXT  # predictions: no padded sample counted
        assert sharded[:3] == pytest.approx(alone[:3], abs=TOLERANCE)


def test_the_gradient_norm_of_a_sharded_model_is_the_whole_gradients(two_ranks):
    for rank in two_ranks["ranks"]:
        norms = rank["grad_norm"]
        assert norms["sharded"] == pytest.approx(norms["alone"], rel=1e-5)


def test_the_worker_trains_zero3_on_dtensor_shards_of_half_of_every_parameter(two_ranks):
    """Would fail if ZeRO-3 silently ran as DDP: the worker's own setup holds DTensors, 1/2 of each on a rank."""
    for rank in two_ranks["ranks"]:
        sharded, whole = rank["held"]["zero3"], rank["held"]["ddp"]
        assert {name for name, _, _ in sharded} == {"DTensor"} and "DTensor" not in {name for name, _, _ in whole}
        assert all(local * 2 == total for _, local, total in sharded)  # every dim 0 of the MLP is even
        assert sum(local for _, local, _ in sharded) * 2 == sum(local for _, local, _ in whole)


def test_each_point_records_the_gradient_sync_its_worker_did_and_the_collectives_it_counted(two_ranks):
    from sweeper.measure import communication, fake_memory

    rank0 = two_ranks["ranks"][0]
    ddp, final, every = rank0["ddp"], rank0["zero3"], rank0["zero3 every"]
    assert (ddp["sync"], final["sync"], every["sync"]) == ("final", "final", "every")
    assert every["status"] == "ok" and every["loss"] == pytest.approx(final["loss"], abs=TOLERANCE)
    cfg = config.load(compose_cfg("model=mlp", "data=digits", "optim=adamw", "gns.enabled=false"))
    units = fake_memory.model_units(cfg, 10)
    whole = sum(u.numel() for u in units) * 4
    # One ring all-reduce of the gradients at 2 workers (2 x 1/2 x their bytes), and DDP's own broadcasts of a few
    # bytes of its state in forward (52 here).
    assert whole <= ddp["sent"] < whole + 1024
    for figures, sync in ((final, "final"), (every, "every")):
        predicted = communication.per_step(units, "zero3", 2, 2, sync).bytes
        # + 8 bytes: the divergence check's all-reduce of the gradient norm's square (a float64), sweeper's own
        assert figures["sent"] == predicted + 8 and predicted > ddp["sent"]
    assert every["collectives"] > final["collectives"]  # a reduce-scatter per unit per micro-step
