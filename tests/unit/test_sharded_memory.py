"""measure.sharded_memory: the per-worker peak of DDP, ZeRO-1, ZeRO-2, ZeRO-3 and HSDP on fixed numbers worked by hand
(no processes), and the units it reads off a model. Its agreement with torch's MemTracker on real gloo
ranks is scripts/bench_sharding.py's (docs/parallelism.md)."""

import ast

import pytest

from sweeper import plan, recipe
from sweeper.workloads.gpt import GPT
from sweeper.measure import sharded_memory as sm

# Two blocks of 40 values (a Linear(4, 8)) and a root of 12 whose dim 0 (3) pads to 4 over two workers.
BLOCK = sm.Unit("block0", ((8, 4), (8,)))
UNITS = [BLOCK, sm.Unit("block1", ((8, 4), (8,))), sm.Unit("root", ((3, 4),))]
PER_SAMPLE, FIXED = 100, 10  # activations: 210 bytes at a micro-batch of 2


def predict(parallelism, workers, accumulation=1, **kw):
    return sm.peak(UNITS, parallelism, workers, 2, accumulation, PER_SAMPLE, FIXED, **kw)


def test_padding_follows_fsdp2s_dim0_shards():
    assert BLOCK.numel() == 40 and BLOCK.numel(2) == 40
    assert UNITS[2].numel() == 12 and UNITS[2].numel(2) == 16 and UNITS[2].numel(3) == 12


def test_zero3_holds_its_shards_the_root_the_last_block_and_the_next_ones_gather():
    p = predict("zero3", 2)
    # 96 padded values / 2 workers x 4 bytes; the root (16) and a block (40) gathered; the next block's
    # gather in flight: its output and copy-out (2 x 40) and gloo's staging of a shard (20).
    assert (p.parameters_bytes, p.gathered_bytes, p.gather_buffers_bytes) == (192, 224, 400)
    assert p.optimizer_state_bytes == 2 * 192 + 5 * 4  # two moments of the shards, a step scalar per tensor
    assert (p.gradients_bytes, p.buckets_bytes, p.activations_bytes) == (0, 0, 210)
    assert p.total == 1430


def test_one_worker_gathers_nothing_in_flight():
    p = predict("zero3", 1)
    assert p.gather_buffers_bytes == 0 and p.parameters_bytes == 92 * 4 and p.gathered_bytes == (12 + 40) * 4
    assert predict("zero2", 1).gather_buffers_bytes == 0


def test_zero2_keeps_every_unit_gathered_and_accumulation_holds_unsharded_gradients():
    p = predict("zero2", 2, accumulation=3)
    # Every unit stays gathered to its backward; the forward's last gather's output (a block) is still held.
    assert p.gathered_bytes == 96 * 4 and p.gather_buffers_bytes == 40 * 4
    assert p.gradients_bytes == 92 * 4  # the reduce skipped: every parameter's whole gradient, until the last
    assert p.total == 192 + 384 + 368 + 404 + 210 + 160
    every = predict("zero2", 2, accumulation=3, reduce_every_micro_step=True)
    assert every.gradients_bytes == 192 and p.total - every.total == 368 - 192
    assert predict("zero2", 2, accumulation=1).gradients_bytes == 0


def test_ddp_holds_everything_and_its_buckets_across_workers():
    one, two = predict("ddp", 1), predict("ddp", 2)
    assert (one.parameters_bytes, one.optimizer_state_bytes, one.buckets_bytes) == (368, 756, 0)
    assert two.total - one.total == 368  # the buckets: a flat copy of the gradients
    assert predict("ddp", 2, accumulation=2).gradients_bytes == 368


def test_sharded_states_shrink_with_workers_and_activations_do_not():
    units = [sm.Unit(f"block{i}", ((256, 256), (256,))) for i in range(8)] + [sm.Unit("root", ((512, 256),))]
    peaks = {w: sm.peak(units, "zero3", w, 4, 1, 1000) for w in (1, 2, 4, 8)}
    assert [peaks[w].parameters_bytes for w in (2, 4, 8)] == [peaks[1].parameters_bytes // w for w in (2, 4, 8)]
    assert len({p.activations_bytes for p in peaks.values()}) == 1
    at_two = {p: sm.peak(units, p, 2, 4, 1, 1000).total for p in sm.PARALLELISMS}
    assert at_two["ddp"] > at_two["zero2"] > at_two["zero3"]


def test_zero1_is_ddp_with_the_most_loaded_ranks_share_of_the_optimizer_state():
    # Tensors of 32, 32, 12, 8 and 8 values over 2 ranks, the largest first, each to the less loaded (the first
    # on a tie): 32 + 12 | 32 + 8 + 8.
    assert sm.zero1_shares(UNITS, 2) == [(44, 2), (48, 3)]
    ddp, zero1 = predict("ddp", 2), predict("zero1", 2)
    assert zero1.optimizer_state_bytes == 2 * 48 * 4 + 3 * 4  # the second rank's: two moments, a step per tensor
    assert zero1.total == ddp.total - ddp.optimizer_state_bytes + zero1.optimizer_state_bytes  # the rest is DDP's
    assert predict("zero1", 1) == predict("ddp", 1)  # one rank holds it all
    # Four equal layers over four ranks: exactly a quarter each.
    layers = [sm.Unit(f"block{i}", ((16, 16), (16,))) for i in range(3)] + [sm.Unit("root", ((16, 16), (16,)))]
    assert sm.zero1_shares(layers, 4) == [(272, 2)] * 4


def test_hsdp_is_zero3_over_a_nodes_ranks():
    assert predict("hsdp", 4, ranks_per_node=2) == predict("zero3", 2)  # 2 nodes of 2: shards of a half
    assert predict("hsdp", 4) == predict("zero3", 4)  # placement unknown: one node of 4
    assert predict("hsdp", 4, ranks_per_node=1) == predict("zero3", 1)  # a rank per node: whole, as one rank


def test_bf16_gathers_half_the_bytes():
    assert predict("zero2", 2, gather_bytes_per_value=2).gathered_bytes == 96 * 2


def test_a_point_over_budget_is_skipped_with_its_prediction():
    p = predict("ddp", 2)
    assert sm.over_budget(p, p.total, "ddp x2") is None
    line = sm.over_budget(p, 1000, "ddp x2, micro-batch 2")
    assert line.startswith("ddp x2, micro-batch 2: predicted 0.0 MiB per worker (optimizer_state")
    assert "device.memory_budget_gb" in line and "skipped, not launched" in line


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="Should be one of"):
        predict("zero4", 2)
    with pytest.raises(ValueError, match="at least 1"):
        predict("zero3", 0)


def test_units_of_a_gpt_count_the_tied_head_once_in_the_root():
    model = GPT(64, 16, 3, 2, 32)
    units = sm.units_of(model, recipe.blocks(model))
    assert [u.name for u in units] == ["block0", "block1", "block2", "root"]
    assert sum(u.numel() for u in units) == sum(p.numel() for p in model.parameters())
    assert units[-1].shapes == ((64, 32), (16, 32), (32,), (32,))  # wte (= head), wpe, ln_f


def _imported(module) -> set:
    """Top-level names a module imports; sweeper's own modules by their full name."""
    tree = ast.parse(open(module.__file__).read())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    return {name if name.startswith("sweeper.") else name.split(".")[0] for name in names}


def test_the_memory_model_imports_the_standard_library_only():
    """It takes the layouts' names from plan.py, which is standard library only itself."""
    assert _imported(sm) <= {"__future__", "math", "dataclasses", "typing", "sweeper.plan"}
    assert _imported(plan) <= {"__future__", "itertools", "math", "dataclasses", "typing"}
