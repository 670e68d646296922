"""Sharded data parallelism (worker.sharding) across two gloo processes on the CPU: every layout (DDP, ZeRO-1,
ZeRO-2, ZeRO-3, HSDP on one node) trains the same model at one global batch, each FSDP2 rank holds 1/world of the
weights and optimizer state,
accumulation reduces once per optimizer step, and a training state moves between DDP and ZeRO-3 and
between world sizes through worker.state's layout-free checkpoint.

One spawn of two ranks runs every scenario (importing torch twice costs ~10 s on this machine's 2 cores);
each test asserts one of its findings.
"""

import contextlib
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from sweeper import recipe
from sweeper.workloads.gpt import GPT
from sweeper.worker import sharding, state

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 64, 16, 2, 2, 32  # every dim 0 even: shards are exact halves
GLOBAL_BATCH, MICRO = 8, 2
STEPS, SAVE_AT, BACK_AT = 5, 2, 4  # DDP at 1 worker saves at 2; ZeRO-3 at 2 workers goes on to 4; DDP finishes
TOLERANCE = 1e-5


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(VOCAB, CONTEXT, LAYERS, HEADS, WIDTH)


def _batches():
    # Counting sequences from random starts: learnable in a few steps, and every step's batch is new.
    starts = torch.randint(0, VOCAB, (STEPS, GLOBAL_BATCH, 1), generator=torch.Generator().manual_seed(1))
    tokens = (starts + torch.arange(CONTEXT + 1)) % VOCAB
    return tokens[..., :-1], tokens[..., 1:]


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _train(model, optimizer, steps, rank=0, world=1, on_micro_step=None, skip_reduce=True, sync="final",
           parallelism="ddp"):
    """The global batch's mean loss at each of `steps` (a range of step indices): each rank takes its share
    of the global batch in micro-batches of MICRO, reducing as sharding's context says for `sync` (final:
    skipping the reduce before the last micro-step; every: at each)."""
    inputs, targets = _batches()
    share = GLOBAL_BATCH // world
    accumulation = share // MICRO
    losses = []
    for step in steps:
        total = torch.zeros(())
        for micro in range(accumulation):
            rows = slice(rank * share + micro * MICRO, rank * share + (micro + 1) * MICRO)
            with (sharding.accumulation_context(model, micro, accumulation, sync, parallelism) if skip_reduce
                  else contextlib.nullcontext()):
                loss = F.cross_entropy(model(inputs[step, rows]).flatten(0, 1), targets[step, rows].flatten())
                (loss / accumulation).backward()
            if on_micro_step is not None:
                on_micro_step(micro)
            total += loss.detach() / accumulation
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def _snapshot(weights, optimizer_state, steps) -> state.Snapshot:
    return state.Snapshot({}, state.Position(steps * GLOBAL_BATCH, steps, 1e-2, GLOBAL_BATCH, 0, "test"),
                          weights, optimizer_state)


def _rank(rank: int, world: int, folder: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        out = {"losses": {}, "bytes": {}}
        whole = sum(p.numel() * p.element_size() for p in _model().parameters())
        for parallelism in sharding.PARALLELISMS:
            model, done = sharding.apply(_model(), parallelism)
            optimizer = sharding.optimizer_for(parallelism, _optimizer(model))
            out["losses"][parallelism] = _train(model, optimizer, range(STEPS), rank, world)
            moments = [v for s in optimizer.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
            steps = [v for s in optimizer.state.values() for k, v in s.items() if k == "step"]
            out["bytes"][parallelism] = dict(
                params=sharding.local_bytes(model.parameters()), moments=sharding.local_bytes(moments),
                steps=sharding.local_bytes(steps), whole=whole, units=done.units, sync=done.sync_mode)
        checkpointed = _model()
        recipe.apply_checkpointing(checkpointed, "blocks")
        model, _ = sharding.apply(checkpointed, "zero3")
        optimizer = _optimizer(model)
        out["losses"]["zero3 checkpointed"] = _train(model, optimizer, range(STEPS), rank, world)
        weights, optimizer_state = sharding.full_state(model, optimizer)
        out["checkpointed_state"] = ({k: tuple(v.shape) for k, v in weights.items()},
                                     sorted(optimizer_state.get("state", {})))
        out["bf16"] = _bf16_step(rank, world)
        out["reduce_scatters"] = _count_reduce_scatters(rank, world)
        out["ddp_all_reduces"] = _count_ddp_all_reduces(rank, world)
        out["every"] = {p: _train(*_built(p), range(STEPS), rank, world, sync="every", parallelism=p)
                        for p in sharding.PARALLELISMS}
        out["per_micro_step"] = {(p, sync): _collectives_per_micro_step(p, sync, rank, world)
                                 for p in sharding.PARALLELISMS for sync in ("final", "every")}
        out["continued"] = _continue_as_zero3(rank, world, folder)
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _bf16_step(rank: int, world: int):
    """One ZeRO-2 step in bf16: the dtype a block's weight has inside its forward, the sharded weights' and
    gradients' dtypes after backward, and the loss."""
    model, done = sharding.apply(_model(), "zero2", precision="bf16")
    seen = []
    model.blocks[0].mlp[0].register_forward_pre_hook(lambda m, args: seen.append(m.weight.dtype))
    inputs, targets = _batches()
    with recipe.autocast(torch.device("cpu"), "bf16"):
        loss = F.cross_entropy(model(inputs[0, :MICRO]).flatten(0, 1).float(), targets[0, :MICRO].flatten())
    loss.backward()
    weight = model.blocks[0].mlp[0].weight
    return dict(forward=seen[0], sharded=weight.dtype, grad=weight.grad.dtype, loss=loss.item(),
                policy=(done.param_dtype, done.reduce_dtype))


def _count_reduce_scatters(rank: int, world: int):
    """Reduce-scatters per micro-step of one ZeRO-2 step at accumulation 2: with the reduce skipped before the
    last micro-step, and (a control that the count sees them) with every micro-step reducing."""
    real, calls, found = dist.reduce_scatter_single, [0], {}

    def counting(*args, **kwargs):  # FSDP2 reduce-scatters through torch.distributed's module attribute
        calls[0] += 1
        return real(*args, **kwargs)

    def note(per_micro):
        per_micro.append(calls[0])
        calls[0] = 0

    for mode, skip in (("skipped", True), ("every", False)):
        model, _ = sharding.apply(_model(), "zero2")
        per_micro = []
        dist.reduce_scatter_single, calls[0] = counting, 0
        try:
            _train(model, _optimizer(model), range(1), rank, world, on_micro_step=lambda m, seen=per_micro: note(seen),
                   skip_reduce=skip)
        finally:
            dist.reduce_scatter_single = real
        found[mode] = per_micro
    return found


def _count_ddp_all_reduces(rank: int, world: int):
    """DDP's bucket all-reduces per micro-step of one step at accumulation 2 (a comm hook counts them): the
    same sharding.accumulation_context, on its no_sync path."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = [0]

    def counting(group, bucket):
        calls[0] += 1
        return allreduce_hook(group, bucket)

    model, _ = sharding.apply(_model(), "ddp")
    model.register_comm_hook(None, counting)
    per_micro = []

    def note(micro):
        per_micro.append(calls[0])
        calls[0] = 0

    _train(model, _optimizer(model), range(1), rank, world, on_micro_step=note)
    return per_micro


def _built(parallelism: str):
    model, _ = sharding.apply(_model(), parallelism)
    return model, _optimizer(model)


def _collectives_per_micro_step(parallelism: str, sync: str, rank: int, world: int):
    """The collectives of each micro-step of one step at accumulation 2 (counted where they reach the process
    group), by kind, and what sharding.observed_sync read back from the wrapped model inside the first."""
    from collections import Counter

    from sweeper.measure.collective_count import CollectiveCounter

    model, optimizer = _built(parallelism)
    _train(model, optimizer, range(1), rank, world, sync=sync, parallelism=parallelism)  # warm: DDP's buckets
    seen, read = [], []

    def note(micro):
        seen.append(Counter(kind for kind, _ in counter.calls))
        counter.calls.clear()

    def observe(micro):
        if micro == 0:
            read.append(sharding.observed_sync(model, 0, 2))

    with CollectiveCounter() as counter:
        with sharding.accumulation_context(model, 0, 2, sync, parallelism):
            observe(0)
        _train(model, optimizer, range(1, 2), rank, world, on_micro_step=note, sync=sync, parallelism=parallelism)
    return dict(kinds=seen, observed=read[0])


def _continue_as_zero3(rank: int, world: int, folder: str):
    """ZeRO-3 at `world` workers goes on from the DDP checkpoint the test wrote at SAVE_AT, to BACK_AT, and
    writes its own there (rank 0) in the same format."""
    saved = state.read(os.path.join(folder, "ddp"))
    bare = _model()
    bare.load_state_dict(saved.weights)  # into the bare model, before sharding (as worker.step does)
    model, _ = sharding.apply(bare, "zero3")
    optimizer = _optimizer(model)
    sharding.load_optimizer(model, optimizer, saved.optimizer)
    losses = _train(model, optimizer, range(SAVE_AT, BACK_AT), rank, world)
    weights, optimizer_state = sharding.full_state(model, optimizer)
    if rank == 0:
        state.write(_snapshot(weights, optimizer_state, BACK_AT), os.path.join(folder, "zero3"))
    return losses


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The uninterrupted run and the DDP checkpoint at 1 worker here, then every scenario on two ranks."""
    folder = str(tmp_path_factory.mktemp("sharding"))
    model = _model()
    optimizer = _optimizer(model)
    reference = _train(model, optimizer, range(STEPS))
    model = _model()
    optimizer = _optimizer(model)
    _train(model, optimizer, range(SAVE_AT))
    state.write(_snapshot(state.canonical_state(model), state.to_cpu(optimizer.state_dict()), SAVE_AT),
                os.path.join(folder, "ddp"))
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(_rank, args=(2, folder), nprocs=2, join=True)
    ranks = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    return dict(reference=reference, ranks=ranks, folder=folder)


def test_every_parallelism_trains_the_same_model_at_one_global_batch(two_ranks):
    losses = two_ranks["ranks"][0]["losses"]
    reference = two_ranks["reference"]  # one process, accumulation 4: the same global batch
    assert reference[-1] < reference[0] - 0.1  # it trains: equal losses of a model that does not would prove little
    for parallelism in (*sharding.PARALLELISMS, "zero3 checkpointed"):
        assert losses[parallelism] == pytest.approx(reference, abs=TOLERANCE), parallelism
    assert two_ranks["ranks"][1]["losses"] == losses  # every rank reports the global batch's loss


def test_each_rank_holds_half_the_weights_and_adam_moments_under_sharding(two_ranks):
    for rank in two_ranks["ranks"]:
        held = rank["bytes"]
        whole = held["ddp"]["whole"]
        assert held["ddp"]["params"] == whole and held["ddp"]["moments"] == 2 * whole
        for parallelism in sharding.SHARDED:
            assert held[parallelism]["params"] == whole // 2, parallelism
            assert held[parallelism]["moments"] == whole, parallelism  # 2 moments x half the weights
            # Adam's step counters are one scalar per parameter tensor on every rank: not sharded.
            assert held[parallelism]["steps"] == held["ddp"]["steps"]
            assert held[parallelism]["units"] == ["blocks.0", "blocks.1", ""]
            assert held[parallelism]["sync"] == "set_requires_gradient_sync"


def test_accumulation_reduce_scatters_only_on_the_last_micro_step(two_ranks):
    counts = two_ranks["ranks"][0]["reduce_scatters"]
    units = LAYERS + 1  # one reduce-scatter per unit: each block, then the root
    assert counts["every"] == [units, units]  # the count sees them when every micro-step reduces
    assert counts["skipped"] == [0, units]


def test_under_ddp_the_same_context_all_reduces_only_on_the_last_micro_step(two_ranks):
    counts = two_ranks["ranks"][0]["ddp_all_reduces"]
    assert counts[0] == 0 and counts[1] >= 1  # a tiny model's gradients fit one or two buckets


def test_a_ddp_checkpoint_goes_on_as_zero3_at_two_workers_and_back(two_ranks):
    reference = two_ranks["reference"]
    continued = two_ranks["ranks"][0]["continued"]
    assert continued == pytest.approx(reference[SAVE_AT:BACK_AT], abs=TOLERANCE)
    # ZeRO-3's checkpoint, gathered whole, continues in one process with plain torch (DDP's path at 1 worker).
    saved = state.read(os.path.join(two_ranks["folder"], "zero3"))
    model = _model()
    model.load_state_dict(saved.weights)
    optimizer = _optimizer(model)
    state.load_optimizer(optimizer, saved.optimizer)
    assert _train(model, optimizer, range(BACK_AT, STEPS)) == pytest.approx(reference[BACK_AT:], abs=TOLERANCE)


def test_a_checkpointed_sharded_models_state_is_named_as_the_bare_model(two_ranks):
    weights, optimizer_steps = two_ranks["ranks"][0]["checkpointed_state"]
    bare = _model()
    assert weights == {k: tuple(v.shape) for k, v in bare.state_dict().items()}  # whole, no `.block.`
    assert optimizer_steps == list(range(len(list(bare.parameters()))))  # indexed as torch.optim's own
    assert two_ranks["ranks"][1]["checkpointed_state"] == ({}, [])  # gathered to rank 0 only


def test_sharding_refuses_fp16_an_unknown_parallelism_and_a_model_without_blocks():
    plain = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    assert sharding.problems("zero4", "fp32") == [
        "sweep.parallelism='zero4' is invalid. Should be one of ['ddp', 'zero1', 'zero2', 'zero3', 'hsdp']."]
    assert "fp16" in sharding.problems("zero3", "fp16")[0] and not sharding.problems("ddp", "fp16")
    (blockless,) = sharding.problems("zero2", "fp32", plain)
    assert "no blocks" in blockless and "model.checkpoint_modules" in blockless
    assert sharding.problems("zero2", "fp32", plain, ["Linear"]) == []
    with pytest.raises(ValueError, match="no blocks"):
        sharding.apply(plain, "zero3")


def test_blocks_are_the_ones_checkpointing_wraps():
    model = _model()
    assert recipe.blocks(model) == list(model.blocks)
    recipe.apply_checkpointing(model, "blocks")
    assert recipe.blocks(model) == list(model.blocks)  # now the Checkpointed wrappers, sharded whole
    assert all(isinstance(b, recipe.Checkpointed) for b in recipe.blocks(model))


def test_bf16_computes_with_bf16_weights_and_keeps_fp32_shards_and_gradients(two_ranks):
    bf16 = two_ranks["ranks"][0]["bf16"]
    assert bf16["policy"] == (torch.bfloat16, torch.float32)
    assert bf16["forward"] == torch.bfloat16  # gathered (and computed) in bf16
    assert bf16["sharded"] == torch.float32 and bf16["grad"] == torch.float32  # what AdamW steps on
    assert abs(bf16["loss"] - two_ranks["reference"][0]) < 0.05  # bf16's rounding, the same model
    assert sharding.mixed_precision("fp32").param_dtype is None


def test_every_micro_step_reducing_trains_the_same_model_in_every_layout(two_ranks):
    every = two_ranks["ranks"][0]["every"]
    for parallelism in sharding.PARALLELISMS:
        assert every[parallelism] == pytest.approx(two_ranks["reference"], abs=TOLERANCE), parallelism


def test_each_sync_reduces_where_it_says_and_zero2_gathers_once_per_step(two_ranks):
    counts = two_ranks["ranks"][0]["per_micro_step"]
    units = LAYERS + 1
    kinds = {key: [(c.get("all_gather", 0), c.get("reduce_scatter", 0), c.get("all_reduce", 0)) for c in found["kinds"]]
             for key, found in counts.items()}
    # (all-gathers, reduce-scatters, all-reduces) at micro-steps 0 and 1 (the divergence-free loop here)
    assert kinds[("zero2", "final")] == [(units, 0, 0), (0, units, 0)]  # weights kept gathered across micro-steps
    assert kinds[("zero2", "every")] == [(units, units, 0), (0, units, 0)]
    assert kinds[("zero3", "final")] == [(units + LAYERS, 0, 0), (units + LAYERS, units, 0)]
    assert kinds[("zero3", "every")] == [(units + LAYERS, units, 0), (units + LAYERS, units, 0)]
    assert kinds[("ddp", "final")][0][2] == 0 and kinds[("ddp", "final")][1][2] >= 1
    assert kinds[("ddp", "every")][0][2] >= 1  # no no_sync: an all-reduce per micro-step
    assert {key: found["observed"] for key, found in counts.items()} == {
        (p, sync): sync for p in sharding.PARALLELISMS for sync in ("final", "every")}
