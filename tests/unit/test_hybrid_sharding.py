"""ZeRO-1 and HSDP (worker.sharding) across four gloo processes on the CPU, placed on two simulated nodes (a node id
per rank, as Ray reports it): both train the same model as one process does at one global batch; HSDP's mesh is
(nodes, ranks per node), each parameter sharded over one node's ranks and replicated across the nodes, node by node
even when the nodes' ranks interleave; both continue a DDP checkpoint and save one DDP continues; and through the
worker's own loop (worker.points.run_points): ZeRO-1's ranks hold a quarter of the optimizer state each, every
rank's node is recorded, and ranks whose nodes hold unequal counts are refused in one line.

One spawn of four ranks runs every scenario (importing torch four times costs ~20 s on this machine's 2 cores);
each test asserts one of its findings.
"""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from sweeper import config, recipe
from sweeper.config import MeasureConfig
from sweeper.measure import node_traffic, sharded_memory
from sweeper.plan import GridPoint
from sweeper.worker import collectives as comm
from sweeper.worker import sharding, state
from sweeper.worker.gns import total_norm
from sweeper.worker.points import run_points
from sweeper.worker.probes import run_frontier
from sweeper.worker.spec import FrontierSpec, PointSpec, WorkerContext
from sweeper.workloads.mlp import MLP
from tests.harness import compose_cfg
from tests.unit.test_sharding import (BACK_AT, SAVE_AT, STEPS, TOLERANCE, _batches, _model, _optimizer, _snapshot,
                                      _train)

WORLD = 4
NODES = {"by node": ["a", "a", "b", "b"], "interleaved": ["a", "b", "a", "b"]}
# The worker's loop: an MLP of four equal Linear(16, 16) layers (three blocks and the classifier), so ZeRO-1's
# partition by whole tensors gives each of four ranks exactly one weight and one bias.
OVERRIDES = ["model=mlp", "model.depth=3", "model.width=16", "model.input_shape=[1,4,4]", "data=synthetic",
             "data.num_classes=16", "data.num_samples=640", "optim=adamw"]
MEASURE = MeasureConfig(warmup_steps=3, windows=2, flops=False, memory_breakdown=True)
POINT_STEPS = 7  # 3 warm-up steps, 2 windows of 2 steps


def _spec(parallelism: str, workers: int, save_to=None) -> PointSpec:
    gns = "true" if parallelism in ("ddp", "zero1") else "false"  # FSDP2's shards carry no per-sample hooks
    cfg = config.load(compose_cfg(*OVERRIDES, f"gns.enabled={gns}"))
    return PointSpec(model=cfg.model, data=cfg.data, train=cfg.train, measure=MEASURE,
                     point=GridPoint(4, 2, workers, parallelism=parallelism), lr=0.01, steps=POINT_STEPS,
                     optim=cfg.optim, loss=cfg.loss, eval=cfg.eval, divergence=cfg.divergence, gns=cfg.gns,
                     save_state_to=save_to)


def _hsdp(nodes, rank: int):
    """A GPT sharded by hsdp over the mesh of `nodes`, trained; what its mesh and a weight look like."""
    mesh = comm.node_meshes([WORLD], nodes, WorkerContext(rank, WORLD))[WORLD]
    model, done = sharding.apply(_model(), "hsdp", node_mesh=mesh)
    losses = _train(model, _optimizer(model), range(STEPS), rank, WORLD)
    weight = model.blocks[0].mlp[0].weight
    groups = {dim: dist.get_process_group_ranks(weight.device_mesh.get_group(dim)) for dim in sharding.MESH_DIMS}
    return losses, dict(text=done.mesh, placements=[repr(p) for p in weight.placements], groups=groups,
                        shape=tuple(weight.device_mesh.mesh.shape), local=weight.to_local().numel(),
                        whole=weight.numel(), units=done.units, sync=done.sync_mode)


def _grad_norms(rank: int):
    """sharding.grad_norm of an hsdp GPT after one backward on the same batch on every rank, and the norm of that
    gradient in one unsharded model (the replicas' shards must not be counted twice)."""
    mesh = comm.node_meshes([WORLD], NODES["by node"], WorkerContext(rank, WORLD))[WORLD]
    inputs, targets = _batches()
    norms = {}
    for name, model in (("sharded", sharding.apply(_model(), "hsdp", node_mesh=mesh)[0]), ("alone", _model())):
        F.cross_entropy(model(inputs[0]).flatten(0, 1), targets[0].flatten()).backward()
        norms[name] = (sharding.grad_norm(model) if name == "sharded"
                       else total_norm([p.grad for p in model.parameters()])).item()
    return norms


class _Collectives(TorchDispatchMode):
    """The payload bytes of every collective this rank issues inside it, by kind: every c10d op passes torch's
    dispatcher (DDP's C++ reducer's all-reduce too). A gathered output, a reduce-scatter's input, as called."""

    KINDS = {"allreduce_": "all_reduce", "broadcast_": "broadcast", "_allgather_base_": "all_gather",
             "_reduce_scatter_base_": "reduce_scatter"}

    def __init__(self):
        super().__init__()
        self.payload = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith("c10d::"):
            op = name.split("::", 1)[1]
            tensors = args[1 if op == "_reduce_scatter_base_" else 0]
            tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
            kind = self.KINDS.get(op, op)
            self.payload[kind] = self.payload.get(kind, 0) + sum(t.numel() * t.element_size() for t in tensors)
        return func(*args, **(kwargs or {}))


def _traffic(rank: int):
    """The collectives' payloads of one optimizer step (one micro-step) of zero1 and of hsdp on two nodes."""
    inputs, targets = _batches()
    mesh = comm.node_meshes([WORLD], NODES["by node"], WorkerContext(rank, WORLD))[WORLD]
    counted = {}
    for parallelism in ("zero1", "hsdp"):
        model, _ = sharding.apply(_model(), parallelism, node_mesh=mesh)
        optimizer = sharding.optimizer_for(parallelism, _optimizer(model))
        with _Collectives() as seen:
            F.cross_entropy(model(inputs[0][rank::WORLD]).flatten(0, 1), targets[0][rank::WORLD].flatten()).backward()
            optimizer.step()
        counted[parallelism] = seen.payload
    return counted


def _continue_as(parallelism: str, rank: int, folder: str):
    """`parallelism` at four workers goes on from the DDP checkpoint written at SAVE_AT to BACK_AT, and writes
    its own there (rank 0) in the same format."""
    saved = state.read(os.path.join(folder, "ddp"))
    bare = _model()
    bare.load_state_dict(saved.weights)
    mesh = comm.node_meshes([WORLD], NODES["by node"], WorkerContext(rank, WORLD))[WORLD]
    model, _ = sharding.apply(bare, parallelism, node_mesh=mesh)
    optimizer = sharding.optimizer_for(parallelism, _optimizer(model))
    sharding.load_optimizer(model, optimizer, saved.optimizer)
    losses = _train(model, optimizer, range(SAVE_AT, BACK_AT), rank, WORLD)
    weights, optimizer_state = sharding.full_state(model, optimizer)
    if rank == 0:
        state.write(_snapshot(weights, optimizer_state, BACK_AT), os.path.join(folder, parallelism))
    return losses


def _points(rank: int, folder: str):
    """The worker's loop over ddp, zero1 and hsdp at four workers and hsdp at two, the ranks' nodes interleaved;
    then hsdp on nodes holding three ranks and one."""
    reported = {}
    specs = [_spec(p, WORLD, os.path.join(folder, f"point-{p}")) for p in ("ddp", "zero1", "hsdp")]
    ctx = WorkerContext(rank, WORLD, node=NODES["interleaved"][rank])
    run_points([*specs, _spec("hsdp", 2)], ctx, lambda r: reported.setdefault(r.trial_key, r))
    uneven = WorkerContext(rank, WORLD, node=["a", "a", "a", "b"][rank])
    run_points([_spec("hsdp", WORLD)], uneven, lambda r: reported.__setitem__("uneven", r))
    # The memory frontier's probes shard within a node too (a generous budget: every probe fits).
    probes = []
    run_frontier(FrontierSpec(_spec("hsdp", WORLD), 2 ** 30, {}, 16), ctx, probes.append)
    run_frontier(FrontierSpec(_spec("hsdp", WORLD), 2 ** 30, {}, 16), uneven, probes.append)
    reported["frontier"] = probes
    return reported


def _rank(rank: int, world: int, folder: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        out = {"losses": {}, "hsdp": {}}
        for name, nodes in NODES.items():
            out["losses"][f"hsdp {name}"], out["hsdp"][name] = _hsdp(nodes, rank)
        model, done = sharding.apply(_model(), "zero1")
        optimizer = sharding.optimizer_for("zero1", _optimizer(model))
        out["losses"]["zero1"] = _train(model, optimizer, range(STEPS), rank, world)
        out["zero1"] = dict(kind=type(optimizer).__name__, local=type(sharding.local_optimizer(optimizer)).__name__,
                            sync=done.sync_mode, lr=optimizer.param_groups[0]["lr"])
        out["uneven"] = comm.node_meshes([world], ["a", "a", "a", "b"], WorkerContext(rank, world))
        out["grad_norm"] = _grad_norms(rank)
        out["traffic"] = _traffic(rank)
        out["continued"] = {p: _continue_as(p, rank, folder) for p in ("zero1", "hsdp")}
        out["points"] = _points(rank, folder)
    finally:
        dist.destroy_process_group()
    torch.save(out, os.path.join(folder, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """The uninterrupted run and the DDP checkpoint at 1 worker here, then every scenario on four ranks."""
    folder = str(tmp_path_factory.mktemp("hybrid_sharding"))
    model = _model()
    reference = _train(model, _optimizer(model), range(STEPS))
    model = _model()
    optimizer = _optimizer(model)
    _train(model, optimizer, range(SAVE_AT))
    state.write(_snapshot(state.canonical_state(model), state.to_cpu(optimizer.state_dict()), SAVE_AT),
                os.path.join(folder, "ddp"))
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(_rank, args=(WORLD, folder), nprocs=WORLD, join=True)
    ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    return dict(reference=reference, ranks=ranks, folder=folder)


def test_zero1_and_hsdp_train_the_same_model_as_one_process_at_one_global_batch(four_ranks):
    reference = four_ranks["reference"]
    assert reference[-1] < reference[0] - 0.1  # it trains
    for rank in four_ranks["ranks"]:
        assert sorted(rank["losses"]) == ["hsdp by node", "hsdp interleaved", "zero1"]
        for layout, losses in rank["losses"].items():
            assert losses == pytest.approx(reference, abs=TOLERANCE), layout


def test_zero1_is_ddp_stepping_a_zero_redundancy_optimizer_that_rebuilds_adamw_per_rank(four_ranks):
    zero1 = four_ranks["ranks"][0]["zero1"]
    assert (zero1["kind"], zero1["local"], zero1["sync"]) == ("ZeroRedundancyOptimizer", "AdamW", "no_sync")
    assert zero1["lr"] == 1e-2  # the point's hyperparameters, on the groups the LR warmup writes to


def test_hsdp_shards_each_parameter_over_one_nodes_ranks_and_replicates_it_across_nodes(four_ranks):
    for rank, found in enumerate(four_ranks["ranks"]):
        for name, nodes in NODES.items():
            mesh = found["hsdp"][name]
            assert mesh["shape"] == (2, 2)  # (nodes, ranks per node)
            assert mesh["placements"] == ["Replicate()", "Shard(dim=0)"]
            shard, replicate = mesh["groups"]["shard"], mesh["groups"]["replicate"]
            assert {nodes[r] for r in shard} == {nodes[rank]} and rank in shard and len(shard) == 2
            assert {nodes[r] for r in replicate} == {"a", "b"} and rank in replicate
            assert mesh["local"] * 2 == mesh["whole"]  # half of each weight: one node's two ranks share it
            assert mesh["units"] == ["blocks.0", "blocks.1", ""]
            assert mesh["sync"] == "set_requires_gradient_sync"
    assert four_ranks["ranks"][0]["hsdp"]["by node"]["text"] == (
        "replicate 2 x shard 2; shard groups [0, 1] [2, 3]; placements (Replicate(), Shard(dim=0))")
    # Interleaved nodes: arranged by node, not by rank order.
    assert "shard groups [0, 2] [1, 3]" in four_ranks["ranks"][0]["hsdp"]["interleaved"]["text"]


def test_ranks_whose_nodes_hold_unequal_counts_make_no_mesh_and_say_so_in_one_line(four_ranks):
    for rank in four_ranks["ranks"]:
        (line,) = rank["uneven"].values()
        assert line == rank["uneven"][WORLD] and "\n" not in line
        assert line.startswith("sweep.parallelism=hsdp at 4 workers: its nodes hold 3, 1 ranks")


def test_the_gradient_norm_of_an_hsdp_model_counts_each_shard_once(four_ranks):
    for rank in four_ranks["ranks"]:
        norms = rank["grad_norm"]
        assert norms["sharded"] == pytest.approx(norms["alone"], rel=1e-5)


def test_the_collectives_zero1_and_hsdp_issue_in_a_step_are_node_traffics_prediction(four_ranks):
    # sweeper's GPT here: 28032 parameters (2 blocks of 12704, a root of 2624 with the tied head), 112128 fp32 bytes.
    model = _model()
    units = sharded_memory.units_of(model, recipe.blocks(model))
    zero1 = node_traffic.per_step(units, "zero1", WORLD, 1, nodes=2)
    hsdp = node_traffic.per_step(units, "hsdp", WORLD, 1, nodes=2)
    for rank in four_ranks["ranks"]:
        # zero1: DDP's one bucket all-reduced, then every parameter broadcast once from the rank that stepped it.
        assert rank["traffic"]["zero1"] == {"all_reduce": 112128, "broadcast": 112128}
        assert (zero1.all_reduce_payload_bytes, zero1.broadcast_payload_bytes) == (112128, 112128)
        # hsdp: every unit gathered for forward and both blocks again for backward (2624 + 4 x 12704 values at half
        # each per rank, gathered whole: 213760 bytes), every gradient reduce-scattered within the node, and only
        # the rank's half of them (56064 bytes) all-reduced across the nodes.
        assert rank["traffic"]["hsdp"] == {"all_gather": 213760, "reduce_scatter": 112128, "all_reduce": 56064}
        assert (hsdp.all_gather_payload_bytes, hsdp.reduce_scatter_payload_bytes, hsdp.all_reduce_payload_bytes) == \
            (213760, 112128, 56064)
    # Sent per rank: hsdp 56064 bytes across nodes (2 x 1/2 x 56064), zero1 all of its 252288 (2 x 3/4 + 3/4 of
    # 112128); within the node hsdp sends 1/2 x (213760 + 112128).
    assert (hsdp.across_nodes_bytes, hsdp.within_node_bytes) == (56064, 162944)
    assert (zero1.across_nodes_bytes, zero1.within_node_bytes) == (252288, 0)


def test_a_ddp_checkpoint_goes_on_as_zero1_and_as_hsdp_and_their_checkpoints_go_on_in_one_process(four_ranks):
    reference = four_ranks["reference"]
    for parallelism in ("zero1", "hsdp"):
        continued = four_ranks["ranks"][0]["continued"][parallelism]
        assert continued == pytest.approx(reference[SAVE_AT:BACK_AT], abs=TOLERANCE), parallelism
        saved = state.read(os.path.join(four_ranks["folder"], parallelism))
        model = _model()
        model.load_state_dict(saved.weights)
        optimizer = _optimizer(model)
        state.load_optimizer(optimizer, saved.optimizer)
        assert _train(model, optimizer, range(BACK_AT, STEPS)) == pytest.approx(reference[BACK_AT:], abs=TOLERANCE)


def test_through_the_worker_loop_zero1_and_hsdp_train_as_ddp_does_and_record_every_ranks_node(four_ranks):
    points = four_ranks["ranks"][0]["points"]
    ddp, zero1, hsdp = (points[GridPoint(4, 2, WORLD, parallelism=p).key] for p in ("ddp", "zero1", "hsdp"))
    for result in (ddp, zero1, hsdp):
        assert result.status == "ok", result.error
        assert result.cost.rank_nodes == "0,1,0,1" and result.cost.nodes == "a,b" and result.cost.num_nodes == 2
    assert zero1.train_loss == pytest.approx(ddp.train_loss, abs=TOLERANCE)
    assert hsdp.train_loss == pytest.approx(ddp.train_loss, abs=TOLERANCE)
    # The noise scale's hooks sit on DDP's whole parameters under zero1 as under ddp: the same estimates.
    assert ddp.noise.gns_trace_sigma_per_step and ddp.noise.gns_grad_sq_norm_per_step
    assert zero1.noise.gns_trace_sigma_per_step == pytest.approx(ddp.noise.gns_trace_sigma_per_step, rel=1e-4)
    assert zero1.noise.gns_grad_sq_norm_per_step == pytest.approx(ddp.noise.gns_grad_sq_norm_per_step, rel=1e-4)
    assert hsdp.cost.mesh == "replicate 2 x shard 2; shard groups [0, 2] [1, 3]; placements (Replicate(), Shard(dim=0))"
    assert ddp.cost.mesh is None and zero1.cost.mesh is None
    two = points[GridPoint(4, 2, 2, parallelism="hsdp").key]  # ranks 0 and 1: one on each node
    assert two.status == "ok" and two.cost.rank_nodes == "0,1"
    assert two.cost.mesh.startswith("replicate 2 x shard 1; shard groups [0] [1]")
    # Bytes a rank sends per step, predicted where the ranks ran (four units of 272 values, 4352 fp32 bytes, two
    # nodes). zero1: 2 x 3/4 x 4352 all-reduced and 3/4 x 4352 broadcast, over ranks spanning both nodes. hsdp,
    # accumulation 2: within a node 1/2 x ((4 + 3 blocks) x 272 x 4 x 2 gathered + 4352 reduce-scattered), across
    # 2 x 1/2 x its half of the gradients.
    assert (zero1.cost.communication_within_node_bytes_per_step, zero1.cost.communication_across_nodes_bytes_per_step
            ) == (0, 9792)
    assert (hsdp.cost.communication_within_node_bytes_per_step, hsdp.cost.communication_across_nodes_bytes_per_step
            ) == (9792, 2176)
    # A rank on each node: nothing to shard within, the whole gradient all-reduced across (2 x 1/2 x 4352).
    assert (two.cost.communication_within_node_bytes_per_step, two.cost.communication_across_nodes_bytes_per_step
            ) == (0, 4352)
    assert ddp.cost.communication_across_nodes_bytes_per_step is None


def test_through_the_worker_loop_each_zero1_rank_holds_a_quarter_of_ddps_optimizer_state(four_ranks):
    points = four_ranks["ranks"][0]["points"]
    ddp, zero1, hsdp = (points[GridPoint(4, 2, WORLD, parallelism=p).key] for p in ("ddp", "zero1", "hsdp"))
    whole = ddp.memory.memory_optimizer_state_bytes_by_rank
    # AdamW: two moments of 4 x (16 x 16 + 16) fp32 values, and a 4-byte step per tensor (8 tensors)
    assert whole == [2 * 4 * 4 * 272 + 8 * 4] * WORLD
    assert zero1.memory.memory_optimizer_state_bytes_by_rank == [whole[0] / 4] * WORLD
    assert hsdp.memory.memory_optimizer_state_bytes_by_rank == [2 * 4 * 2 * 272 + 8 * 4] * WORLD  # half: 2 per node
    # The tracked step's breakdown (MemTracker) counts the largest rank's share as optimizer state, as predicted.
    assert zero1.memory.memory_optimizer_state_bytes == whole[0] / 4
    model = MLP(16, 16, depth=3, width=16)
    units = sharded_memory.units_of(model, recipe.blocks(model))
    assert sharded_memory.peak(units, "zero1", WORLD, 4, 2, 0.0).optimizer_state_bytes == whole[0] / 4
    assert sharded_memory.peak(units, "hsdp", WORLD, 4, 2, 0.0, ranks_per_node=2).optimizer_state_bytes == \
        hsdp.memory.memory_optimizer_state_bytes_by_rank[0]


def test_the_worker_loop_refuses_hsdp_on_nodes_of_three_ranks_and_one_as_the_points_error(four_ranks):
    for rank in four_ranks["ranks"]:
        uneven = rank["points"]["uneven"]
        assert uneven.status == "failed" and uneven.cost.rank_nodes == "0,0,0,1"
        assert uneven.error.startswith("sweep.parallelism=hsdp at 4 workers: its nodes hold 3, 1 ranks")


def test_zero1_and_hsdp_points_save_their_state_whole_named_as_the_bare_model(four_ranks):
    folder = four_ranks["folder"]
    ddp = state.read(os.path.join(folder, "point-ddp"))
    for parallelism in ("zero1", "hsdp"):
        saved = state.read(os.path.join(folder, f"point-{parallelism}"))
        assert set(saved.weights) == set(ddp.weights)
        for name, weight in ddp.weights.items():
            assert torch.allclose(saved.weights[name], weight, atol=TOLERANCE), (parallelism, name)
        assert sorted(saved.optimizer["state"]) == sorted(ddp.optimizer["state"])
        for index, moments in ddp.optimizer["state"].items():
            assert torch.allclose(saved.optimizer["state"][index]["exp_avg"], moments["exp_avg"], atol=1e-6)


def test_an_hsdp_frontier_probes_on_the_mesh_by_node_and_refuses_uneven_nodes(four_ranks):
    *probes, found, refused = four_ranks["ranks"][0]["points"]["frontier"]
    assert probes and found.status == "ok" and found.plain.micro_batch_size == 16  # the upper bound: all fit
    assert all(p.cost.mesh.startswith("replicate 2 x shard 2; shard groups [0, 2] [1, 3]") for p in probes)
    assert refused.status == "failed" and refused.error.startswith("sweep.parallelism=hsdp at 4 workers: its nodes")
