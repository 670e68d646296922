"""measure.sharded_memory and measure.layouts: the per-worker peak of DDP, ZeRO-1, ZeRO-2, ZeRO-3 and HSDP at every
phase of the step (forward's top, backward, the optimizer step), in both gradient syncs, on fixed numbers worked by
hand (no processes); the units it reads off a model; the budget's error band and CUDA's margin. Its agreement with
torch's MemTracker on real gloo ranks is scripts/bench_sharding.py's (docs/parallelism.md)."""

import ast

import pytest

from sweeper import plan, recipe
from sweeper.measure import layouts
from sweeper.measure import sharded_memory as sm
from sweeper.workloads.gpt import GPT

# Two blocks of 40 values (a Linear(4, 8)) and a root of 12 whose dim 0 (3) pads to 4 over two workers: 92 values
# (368 bytes) whole, 96 padded, 48 a rank's. The largest tensor: 32 values (128 bytes).
BLOCK = sm.Unit("block0", ((8, 4), (8,)))
UNITS = [BLOCK, sm.Unit("block1", ((8, 4), (8,))), sm.Unit("root", ((3, 4),))]
PER_SAMPLE, FIXED = 100, 10  # activations: 210 bytes at a micro-batch of 2
ADAMW = sm.OptimizerCost(8.0, 4.0, 0.0, 8.0)  # two fp32 moments, a step per tensor; 2 x the largest tensor's temps


def predict(parallelism, workers, accumulation=1, sync="final", **kw):
    return sm.peak(UNITS, parallelism, workers, 2, accumulation, PER_SAMPLE, FIXED, optimizer=ADAMW,
                   gradient_sync=sync, **kw)


def phases(prediction):
    return sm.by_phase(prediction)


def test_padding_follows_fsdp2s_dim0_shards():
    assert BLOCK.numel() == 40 and BLOCK.numel(2) == 40
    assert UNITS[2].numel() == 12 and UNITS[2].numel(2) == 16 and UNITS[2].numel(3) == 12


def test_ddp_at_one_worker_peaks_at_the_optimizer_step_with_weights_gradients_state_and_its_temporaries():
    p = predict("ddp", 1)
    # forward: weights 368 + AdamW 8 x 92 + 4 x 5 = 756 + activations 210; backward: the gradients (368, more
    # than the activations) replace what backward frees, + 1.5 x the largest tensor (192); the optimizer: weights,
    # gradients, state and its two temporaries of the largest tensor (256).
    assert phases(p) == {"forward": 1334, "backward": 368 + 756 + 368 + 192, "optimizer": 368 + 368 + 756 + 256}
    assert (p.phase, p.total) == ("optimizer", 1748)
    assert p.parts == {"parameters": 368, "gradients": 368, "optimizer_state": 756, "temporaries": 256}


def test_ddp_accumulating_over_workers_holds_its_gradients_and_buckets_in_either_sync():
    p = predict("ddp", 2, accumulation=2)
    # buckets (a flat copy of the gradients) and the held .grad: 368 each, in every phase before the step
    assert phases(p) == {"forward": 368 + 756 + 368 + 368 + 210, "backward": 368 + 756 + 368 + 368 + 210 + 192,
                         "optimizer": 368 + 368 + 756 + 368 + 256}
    assert p.phase == "backward" and predict("ddp", 2, accumulation=2, sync="every").total == p.total


def test_zero3_peaks_in_backward_with_a_unit_regathered_and_the_next_in_flight():
    p = predict("zero3", 2)
    # own shards 192, AdamW 8 x 48 + 20 = 404, the root (64) and a block (160) gathered, activations 210. Forward:
    # + the last gather's output, max(210 + 160, 2 x 160) - 210 = 160. Backward's top: 1.75 units in flight (280);
    # its end: the gradients reduced so far (192 - (160 + 64) / 2 = 80), a unit's reduce (its gradient and the
    # reduce-scatter input, 320) and half the next unit's gather (80). The optimizer: shards, their gradients,
    # state, two of the largest tensor's shard (8 x 16).
    assert phases(p) == {"forward": 1190, "backward": max(1310, 1300), "optimizer": 192 + 192 + 404 + 128}
    assert (p.phase, p.get("gather_buffers")) == ("backward", 280)


def test_zero3_accumulating_holds_unsharded_gradients_under_final_and_its_shards_under_every():
    final, every = predict("zero3", 2, 2, "final"), predict("zero3", 2, 2, "every")
    assert final.get("held_gradients") == 368 and every.get("held_gradients") == 192
    assert (final.total, every.total) == (1310 + 368, 1310 + 192)
    assert final.total - every.total == 368 - 192  # the memory `every` buys with a reduce per micro-step


def test_zero2_keeps_every_unit_gathered_and_gathers_nothing_after_its_first_micro_step():
    one = predict("zero2", 2)
    # forward: every unit gathered (384) + the last gather's output (160); backward: the activations and a
    # gradient in flight (210 + 192 = 402) outweigh a unit's reduce (320).
    assert phases(one)["forward"] == 192 + 404 + 384 + 210 + 160
    assert (one.phase, one.total) == ("backward", 192 + 404 + 384 + 402)
    final = predict("zero2", 2, 2, "final")
    # the second micro-step's forward holds the unsharded gradients, no gather buffer (kept gathered)
    assert phases(final)["forward"] == 192 + 404 + 368 + 384 + 210
    assert final.total == 192 + 404 + 384 + 368 + 402
    assert predict("zero2", 2, 2, "every").total == 192 + 404 + 384 + 192 + 402


def test_one_worker_gathers_nothing_in_flight():
    p = predict("zero3", 1)
    assert p.get("gather_buffers") == 1.75 * 160 and phases(p)["forward"] == 368 + 756 + (12 + 40) * 4 + 210
    assert sm.sizes_of(UNITS, "zero3", 1, 2, 1, PER_SAMPLE, FIXED).own == 368


def test_sharded_states_shrink_with_workers_and_activations_do_not():
    units = [sm.Unit(f"block{i}", ((256, 256), (256,))) for i in range(8)] + [sm.Unit("root", ((512, 256),))]
    peaks = {w: sm.peak(units, "zero3", w, 4, 1, 1000) for w in (1, 2, 4, 8)}
    sizes = {w: sm.sizes_of(units, "zero3", w, 4, 1, 1000) for w in (1, 2, 4, 8)}
    assert [sizes[w].own for w in (2, 4, 8)] == [sizes[1].own // w for w in (2, 4, 8)]
    assert len({s.activations for s in sizes.values()}) == 1
    assert peaks[1].total > peaks[2].total > peaks[4].total > peaks[8].total
    at_two = {p: sm.peak(units, p, 2, 4, 1, 1000).total for p in sm.PARALLELISMS}
    assert at_two["ddp"] > at_two["zero2"] > at_two["zero3"]


def test_bf16_gathers_half_the_bytes_and_counts_autocasts_weight_copies_once():
    fp32, bf16 = predict("zero2", 2), predict("zero2", 2, gather_bytes_per_value=2)
    assert sm.sizes_of(UNITS, "zero2", 2, 2, 1, PER_SAMPLE, FIXED, gather_bytes_per_value=2).gathered == 96 * 2
    # The fitted intercept (FIXED + 2 bytes x 92 parameters: autocast's bf16 copies under DDP) is not added
    # again under FSDP2, whose bf16 weights are the gathered ones: its activations are the slope's alone.
    with_copies = sm.sizes_of(UNITS, "zero2", 2, 2, 1, PER_SAMPLE, FIXED + 2 * 92, gather_bytes_per_value=2)
    assert with_copies.activations == 2 * PER_SAMPLE + FIXED
    assert sm.sizes_of(UNITS, "ddp", 2, 2, 1, PER_SAMPLE, FIXED + 2 * 92).activations == 210 + 2 * 92
    assert bf16.total < fp32.total


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


def test_cudas_margin_is_named_and_added_on_cuda_only():
    tensors = predict("zero3", 2).total
    assert sm.margin_for("cpu") == sm.NO_MARGIN and sm.margin_for("cuda") is sm.CUDA_MARGIN
    on_cuda = predict("zero3", 2, margin=sm.DeviceMargin(0.1, 1000))
    assert (on_cuda.tensor_bytes, on_cuda.total) == (tensors, tensors + 131 + 1000)
    assert "CUDA margin" in sm.over_budget(on_cuda, 1000, "x")


def test_a_point_predicted_over_the_budget_within_the_error_band_runs():
    p = predict("ddp", 2)
    low, high = sm.PREDICTION_ERROR_BAND
    assert low < 0 < high
    four_percent_under = int(p.total / 1.04)  # the issue's point: predicted 4 % over the budget
    assert sm.over_budget(p, four_percent_under, "x") is None
    said = sm.near_budget(p, four_percent_under, "mb2-acc1-w2")
    assert said.startswith("mb2-acc1-w2: predicted") and "4.0% over" in said and "launched" in said
    assert sm.near_budget(p, p.total, "x") is None  # it fits: nothing to say
    line = sm.over_budget(p, 1000, "ddp x2, micro-batch 2")
    assert line.startswith("ddp x2, micro-batch 2: predicted 0.0 MiB per worker (optimizer: ")
    assert "device.memory_budget_gb" in line and "skipped, not launched" in line


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="Should be one of"):
        predict("zero4", 2)
    with pytest.raises(ValueError, match="at least 1"):
        predict("zero3", 0)


def test_every_parallelism_is_one_layout_class_or_priced_from_one():
    assert set(layouts.LAYOUTS) | set(sm.DERIVED) == set(plan.PARALLELISMS)
    assert not set(layouts.LAYOUTS) & set(sm.DERIVED) and set(sm.DERIVED.values()) <= set(layouts.LAYOUTS)
    assert all(isinstance(layout, layouts.Layout) for layout in layouts.LAYOUTS.values())


def test_units_of_a_gpt_count_the_tied_head_once_in_the_root():
    model = GPT(64, 16, 3, 2, 32)
    units = sm.units_of(model, recipe.blocks(model))
    assert [u.name for u in units] == ["block0", "block1", "block2", "root"]
    assert sum(u.numel() for u in units) == sum(p.numel() for p in model.parameters())
    assert units[-1].shapes == ((64, 32), (16, 32), (32,), (32,))  # wte (= head), wpe, ln_f


def test_the_issues_weight_heavy_gpt_is_predicted_at_its_optimizer_step():
    """The issue's probe (GPT d_model 384, context 8, micro-batch 1, AdamW, fp32, one worker): MemTracker measured
    114.37 MiB for DDP and 123.86 for ZeRO-3 (scripts/bench_sharding.py's `weights` shape); the model at forward's
    top alone said 83.2 and 90.3 (-27 %). 0.78 MiB: the activation fit's intercept there."""
    model = GPT(256, 8, 4, 4, 384)
    units = sm.units_of(model, recipe.blocks(model))
    mib = 2 ** 20
    ddp, zero3 = (sm.peak(units, p, 1, 1, 1, 0, 0.78 * mib, optimizer=sm.ADAMW_CPU) for p in ("ddp", "zero3"))
    assert ddp.phase == "optimizer" and ddp.total / mib == pytest.approx(114.37, rel=0.01)
    assert zero3.phase == "backward" and zero3.total / mib == pytest.approx(123.86, rel=0.01)
    assert sm.by_phase(ddp)["forward"] / mib == pytest.approx(83.2, rel=0.01)  # what forward's top alone says


def _imported(module) -> set:
    """Top-level names a module imports; sweeper's own modules by their full name."""
    tree = ast.parse(open(module.__file__).read())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    return {name if name.startswith("sweeper.") else name.split(".")[0] for name in names}


def test_the_memory_model_imports_the_standard_library_only():
    """It takes the layouts' names from plan.py and their phases from measure.layouts, standard library only."""
    assert _imported(sm) <= {"__future__", "math", "dataclasses", "typing", "sweeper.plan", "sweeper.measure.layouts"}
    assert _imported(layouts) <= {"__future__", "dataclasses", "typing"}
    assert _imported(plan) <= {"__future__", "itertools", "math", "dataclasses", "typing"}
