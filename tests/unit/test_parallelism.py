"""sweep.parallelism as a grid axis, without processes: the points' keys, the grid and the frontier's grid
crossed with it, the same samples for every layout of a global batch, the skip-by-prediction decision and its
records, and the recommendation's override line and YAML naming the sharding."""

import pytest
import yaml

from sweeper.config import DeviceConfig
from sweeper.driver import predicted
from sweeper.measure import frontier, sharded_memory
from sweeper.plan import GridPoint, expand_grid, gradient_sync, mesh_by_node, stream_indices, worker_groups
from sweeper.report.output import override_line
from sweeper.worker.points import implied_oom
from tests.helpers import trial

MIB = 2 ** 20


def test_a_sharded_point_is_named_after_its_worker_count_and_a_ddp_point_keeps_its_old_key():
    assert GridPoint(4, 2, 2, parallelism="zero3").key == "mb4-acc2-w2-zero3"
    assert GridPoint(4, 2, 2, "bf16", "blocks", parallelism="zero2", seed=1).key == "mb4-acc2-w2-zero2-bf16-ckpt-s1"
    assert GridPoint(4, 2, 2).key == GridPoint(4, 2, 2, parallelism="ddp").key == "mb4-acc2-w2"


def test_zero1_and_hsdp_points_are_named_after_their_worker_count_and_zero1_reduces_as_ddp_does():
    assert GridPoint(4, 2, 4, parallelism="zero1").key == "mb4-acc2-w4-zero1"
    assert GridPoint(4, 2, 4, parallelism="hsdp").key == "mb4-acc2-w4-hsdp"
    assert (gradient_sync("zero1", 4), gradient_sync("zero1", 1)) == ("no_sync", "none")  # its model is DDP's
    assert gradient_sync("hsdp", 4) == "set_requires_gradient_sync"


def test_hsdps_mesh_has_a_row_per_node_in_rank_order_whatever_order_ray_gave_the_ranks():
    assert mesh_by_node(["a", "a", "b", "b"]) == [[0, 1], [2, 3]]
    assert mesh_by_node(["b", "a", "b", "a", "b", "a"]) == [[0, 2, 4], [1, 3, 5]]  # arranged by node
    assert mesh_by_node(["a", "b"]) == [[0], [1]] and mesh_by_node(["a", "a"]) == [[0, 1]]
    with pytest.raises(ValueError, match=r"hsdp at 3 workers: its nodes hold 2, 1 ranks.*same number on every"):
        mesh_by_node(["a", "b", "a"])


def test_the_grid_crosses_every_point_with_every_parallelism():
    points = expand_grid([4, 8], [1], [1, 2], parallelisms=["ddp", "zero3"])
    assert len(points) == 8 and len({p.key for p in points}) == 8
    assert {p.parallelism for p in points if p.micro_batch_size == 4 and p.num_workers == 2} == {"ddp", "zero3"}
    assert expand_grid([4], [1], [2]) == [GridPoint(4, 1, 2)]  # no axis given: ddp, as before


def test_every_layout_of_one_global_batch_sees_the_same_samples_whatever_its_parallelism():
    permutations = [list(range(64))]
    for layout in (GridPoint(4, 1, 2), GridPoint(4, 1, 2, parallelism="zero3"),
                   GridPoint(2, 2, 2, parallelism="zero2")):
        seen = sorted(i for rank in range(2) for i in stream_indices(permutations, 0, 3, layout, rank))
        assert seen == list(range(24)), layout.key


def test_worker_groups_keep_a_parallelism_together_and_its_oom_implies_only_its_own_points():
    points = expand_grid([4, 8], [1], [2], parallelisms=["zero3", "ddp"])
    (group,) = worker_groups(points)
    assert [p.parallelism for p in group] == ["ddp", "ddp", "zero3", "zero3"]
    ddp_oom = GridPoint(4, 1, 2)
    assert implied_oom(GridPoint(8, 1, 2), [ddp_oom]) == ddp_oom
    assert implied_oom(GridPoint(8, 1, 2, parallelism="zero3"), [ddp_oom]) is None  # sharded holds less


def test_the_frontiers_grid_is_built_per_parallelism():
    points, _ = frontier.grid_from_frontiers({2: (8, None)}, [1], parallelism="zero3")
    assert points and all(p.parallelism == "zero3" and p.key.endswith("-zero3") for p in points)


def test_the_gradient_sync_recorded_is_how_accumulation_skips_the_reduce():
    assert gradient_sync("ddp", 1) == "none"
    assert gradient_sync("ddp", 2) == "no_sync"
    assert gradient_sync("zero3", 1) == gradient_sync("zero2", 2) == "set_requires_gradient_sync"


def _prediction(total_mib: float) -> sharded_memory.Prediction:
    parts = dict(parameters_bytes=0, gathered_bytes=0, gradients_bytes=0, buckets_bytes=0, optimizer_state_bytes=0,
                 activations_bytes=0, gather_buffers_bytes=0)
    return sharded_memory.Prediction(**{**parts, "optimizer_state_bytes": int(total_mib * MIB)})


DDP, ZERO3 = GridPoint(4, 1, 2), GridPoint(4, 1, 2, parallelism="zero3")


def test_a_point_predicted_over_the_budget_is_skipped_and_one_under_it_is_launched():
    predictions = {DDP: _prediction(60), ZERO3: _prediction(40)}
    lines = predicted.over_budget(predictions, 48 * MIB)
    assert list(lines) == [DDP]
    assert lines[DDP].startswith("mb4-acc1-w2: predicted 60.0 MiB per worker (optimizer_state 60.0")
    assert "device.memory_budget_gb (48.0 MiB): skipped, not launched" in lines[DDP]
    assert predicted.over_budget(predictions, None) == {}  # no budget: nothing is skipped
    assert predicted.over_budget({DDP: _prediction(48)}, 48 * MIB) == {}  # at the budget: it fits


class _Cfg:
    device = DeviceConfig(memory_budget_gb=48 / 1024)


def test_a_skipped_point_is_recorded_once_as_out_of_memory_by_prediction_and_never_launched():
    recorded = []
    lines = {DDP: "mb4-acc1-w2: predicted 60.0 MiB per worker ... skipped, not launched"}
    launched, skipped = predicted.skip(_Cfg(), [DDP, ZERO3], lines, frozenset(), lambda p, r: recorded.append((p, r)))
    assert launched == [ZERO3]
    ((point, result),) = recorded
    assert skipped == recorded and point == DDP
    assert (result.status, result.oom_source, result.error) == ("oom", "predicted", lines[DDP])
    assert result.trial_key == DDP.key and result.memory.memory_budget_bytes == 48 * MIB
    # A resumed sweep that already holds it records it no more, and launches it no more.
    recorded.clear()
    launched, skipped = predicted.skip(_Cfg(), [DDP, ZERO3], lines, frozenset({DDP.key}),
                                       lambda p, r: recorded.append(p))
    assert launched == [ZERO3] and skipped == [] and recorded == []


def _sharded(parallelism):
    """The point mb4-acc1-w2-zero3, with `parallelism` as its record has it (None: a record from before the axis)."""
    return trial(4, 1, 2, suffix="-zero3", parallelism=parallelism, precision="fp32")


def test_the_override_line_names_a_sharded_parallelism_and_leaves_the_default_out():
    assert "sweep.num_workers=[2] sweep.parallelism=[zero3] sweep.precisions=[fp32]" in override_line(_sharded("zero3"))
    assert "sweep.parallelism" not in override_line(_sharded("ddp"))  # the headline's 3 lines (test_e2e_answer)
    assert "sweep.parallelism" not in override_line(_sharded(None))


def test_the_recommendation_yaml_carries_the_parallelism_absent_meaning_ddp():
    from sweeper.report.output import _chosen
    from sweeper.report.trials import Recommendation

    for recorded, named in (("zero3", "zero3"), (None, "ddp")):
        rec = Recommendation(_sharded(recorded), [], "", {}, "throughput")
        assert _chosen(rec)["parallelism"] == named
        assert yaml.safe_load(yaml.safe_dump(_chosen(rec)))["parallelism"] == named


@pytest.mark.parametrize("parallelism", ["ddp", "zero3"])
def test_a_point_params_name_its_parallelism_and_gradient_sync(parallelism):
    from sweeper import config
    from sweeper.driver.preflight import _point_spec
    from sweeper.driver.params import point_params
    from tests.harness import compose_cfg

    cfg = config.load(compose_cfg("model=mlp", "gns.enabled=false"))
    point = GridPoint(4, 2, 2, parallelism=parallelism)
    params = point_params(cfg, _point_spec(cfg, point, 10, {}, None))
    assert params["parallelism"] == parallelism
    assert params["gradient_sync"] == ("no_sync" if parallelism == "ddp" else "set_requires_gradient_sync")
    assert params["point"] == point.point_key


def test_a_sharded_sweep_records_its_models_units_for_the_reports_memory_at_other_worker_counts(cfg_of):
    from sweeper.report import target_cluster

    cfg = cfg_of("model=mlp", "model.depth=3", "model.width=64", "data=synthetic", "sweep.parallelism=[zero3]",
                 "gns.enabled=false")
    units = target_cluster.decode_units(predicted.units_param(cfg, 10)["model_units"])
    # 3 MLP blocks (1,024 -> 64, then 64 -> 64 twice), the classifier at the root: 64 x 1,024 + 64, then 2 x
    # (64 x 64 + 64), then 10 x 64 + 10 parameters.
    assert [u.name for u in units] == ["block0", "block1", "block2", "root"]
    assert sum(u.numel() for u in units) == 64 * 1024 + 64 + 2 * (64 * 64 + 64) + 10 * 64 + 10
    assert predicted.units_param(cfg_of("model=mlp", "data=synthetic"), 10) == {}  # DDP: not needed
