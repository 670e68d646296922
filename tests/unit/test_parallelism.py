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
    from sweeper.worker import sharding

    assert (sharding.SYNC_MODES["zero1"], sharding.SYNC_MODES["hsdp"]) == ("no_sync", "set_requires_gradient_sync")
    # its model is DDP's: one zero1 worker reduces nothing, so `every` folds into `final` there, as DDP's does
    assert (gradient_sync("zero1", 1, 2, "every"), gradient_sync("zero1", 4, 2, "every")) == ("final", "every")
    assert gradient_sync("hsdp", 1, 2, "every") == "every"


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


def test_gradient_sync_is_an_axis_whose_default_keeps_the_key_and_that_folds_where_both_modes_are_one():
    assert GridPoint(4, 2, 2, parallelism="zero3", gradient_sync="every").key == "mb4-acc2-w2-zero3-every"
    assert GridPoint(4, 2, 2, parallelism="zero3", gradient_sync="final").key == "mb4-acc2-w2-zero3"
    points = expand_grid([4], [1, 2], [1, 2], parallelisms=["ddp", "zero3"], gradient_syncs=["final", "every"])
    keys = sorted(p.key for p in points)
    # One micro-step reduces once either way, one DDP worker reduces nothing: `final` alone there.
    assert keys == sorted(["mb4-acc1-w1", "mb4-acc1-w1-zero3", "mb4-acc1-w2", "mb4-acc1-w2-zero3",
                           "mb4-acc2-w1", "mb4-acc2-w1-zero3", "mb4-acc2-w1-zero3-every",
                           "mb4-acc2-w2", "mb4-acc2-w2-every", "mb4-acc2-w2-zero3", "mb4-acc2-w2-zero3-every"])
    assert gradient_sync("ddp", 2, 2, "every") == "every" and gradient_sync("ddp", 1, 2, "every") == "final"
    assert gradient_sync("zero2", 2, 1, "every") == "final"
    assert expand_grid([4], [2], [2]) == [GridPoint(4, 2, 2)]  # no axis given: final, as before


def test_an_oom_in_final_implies_nothing_in_every_and_an_oom_in_every_implies_final():
    final, every = GridPoint(4, 2, 2, parallelism="zero3"), GridPoint(4, 2, 2, parallelism="zero3",
                                                                      gradient_sync="every")
    assert implied_oom(GridPoint(8, 2, 2, parallelism="zero3", gradient_sync="every"), [final]) is None
    assert implied_oom(GridPoint(8, 2, 2, parallelism="zero3"), [every]) == every


def _prediction(total_mib: float) -> sharded_memory.Prediction:
    parts = (("optimizer_state", int(total_mib * MIB)),)
    return sharded_memory.Prediction(tuple((phase, parts if phase == "optimizer" else ()) for phase in
                                           ("forward", "backward", "optimizer")))


DDP, ZERO3 = GridPoint(4, 1, 2), GridPoint(4, 1, 2, parallelism="zero3")


def test_a_point_predicted_over_the_budget_beyond_the_error_is_skipped_and_one_within_it_is_launched(capsys):
    predictions = {DDP: _prediction(60), ZERO3: _prediction(40)}
    lines = predicted.over_budget(predictions, 48 * MIB)
    assert list(lines) == [DDP]
    assert lines[DDP].startswith("mb4-acc1-w2: predicted 60.0 MiB per worker (optimizer: optimizer_state 60.0")
    assert "device.memory_budget_gb (48.0 MiB) by more than the prediction's error" in lines[DDP]
    assert lines[DDP].endswith("skipped, not launched")
    assert predicted.over_budget(predictions, None) == {}  # no budget: nothing is skipped
    assert predicted.over_budget({DDP: _prediction(48)}, 48 * MIB) == {}  # at the budget: it fits
    # The point: predicted 4 % over the budget, inside the measured band: launched, and said so.
    assert predicted.over_budget({DDP: _prediction(48 * 1.04)}, 48 * MIB) == {}
    assert "mb4-acc1-w2: predicted 49.9 MiB per worker, 4.0% over" in capsys.readouterr().out


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


def _sharded(parallelism, suffix="-zero3", **more):
    """The point mb4-acc1-w2-zero3 (`suffix`), with `parallelism` as its record has it (None: a record from before
    the axis)."""
    return trial(4, 1, 2, suffix=suffix, parallelism=parallelism, precision="fp32", **more)


def test_the_override_line_names_a_sharded_parallelism_and_leaves_the_default_out():
    assert "sweep.num_workers=[2] sweep.parallelism=[zero3] sweep.precisions=[fp32]" in override_line(_sharded("zero3"))
    assert "sweep.parallelism" not in override_line(_sharded("ddp"))  # the headline's 3 lines (test_e2e_answer)
    assert "sweep.parallelism" not in override_line(_sharded(None, ""))
    assert "sweep.gradient_sync=[every]" in override_line(_sharded("zero3", gradient_sync="every"))
    assert "sweep.gradient_sync" not in override_line(_sharded("zero3", gradient_sync="final"))


def test_a_record_without_the_param_is_read_one_way_everywhere_from_its_key():
    """parallelism.of and the raw field disagreed: the override line read the field (None: ddp) where the
    elastic plan read the key (-zero3)."""
    from sweeper.report import parallelism
    from sweeper.report.output import _chosen
    from sweeper.report.trials import Recommendation

    unrecorded = _sharded(None)  # key mb4-acc1-w2-zero3, no param
    assert parallelism.of(unrecorded) == "zero3"
    assert "sweep.parallelism=[zero3]" in override_line(unrecorded)
    assert _chosen(Recommendation(unrecorded, [], "", {}, "throughput"))["parallelism"] == "zero3"


def test_the_recommendation_yaml_carries_the_parallelism_absent_meaning_ddp():
    from sweeper.report.output import _chosen
    from sweeper.report.trials import Recommendation

    for recorded, suffix, named in (("zero3", "-zero3", "zero3"), (None, "", "ddp")):
        rec = Recommendation(_sharded(recorded, suffix), [], "", {}, "throughput")
        assert _chosen(rec)["parallelism"] == named and _chosen(rec)["gradient_sync"] == "final"
        assert yaml.safe_load(yaml.safe_dump(_chosen(rec)))["parallelism"] == named


@pytest.mark.parametrize("parallelism", ["ddp", "zero3"])
def test_a_point_params_record_the_gradient_sync_its_worker_did_not_the_one_asked(parallelism):
    from sweeper import config
    from sweeper.driver.preflight import _point_spec
    from sweeper.driver.params import point_params
    from sweeper.schema import PointResult
    from tests.harness import compose_cfg

    cfg = config.load(compose_cfg("model=mlp", "gns.enabled=false"))
    point = GridPoint(4, 2, 2, parallelism=parallelism, gradient_sync="every")
    spec = _point_spec(cfg, point, 10, {}, None)
    params = point_params(cfg, spec, PointResult(gradient_sync="final"))  # a worker that did not do as asked
    assert params["parallelism"] == parallelism and params["gradient_sync"] == "final"
    assert params["point"] == point.point_key
    assert "gradient_sync" not in point_params(cfg, spec, PointResult(status="oom", oom_predicted=True))
    assert "gradient_sync" not in point_params(cfg, spec)


def test_when_even_zero3_at_the_most_workers_is_over_the_budget_the_sweep_says_data_parallelism_is_not_enough():
    from sweeper import config
    from tests.harness import compose_cfg

    sweep = ["model=gpt", "data=text", "model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.context=16",
             "gns.enabled=false", "sweep.parallelism=[ddp,zero2]", "sweep.num_workers=[1,2]"]
    points = [GridPoint(2, 1, 2, parallelism="zero2"), GridPoint(4, 2, 1)]
    tight = config.load(compose_cfg(*sweep, "device.memory_budget_gb=0.00001"))  # 10 KiB a worker
    line = predicted.beyond_data_parallelism(tight, points, 256)
    assert line.startswith("even ZeRO-3 at 2 workers (mb2-acc1-w2-zero3, the smallest layout swept) is predicted")
    assert "tensor or pipeline parallelism" in line and "outside sweeper's scope" in line
    roomy = config.load(compose_cfg(*sweep, "device.memory_budget_gb=1"))
    assert predicted.beyond_data_parallelism(roomy, points, 256) is None
    assert predicted.beyond_data_parallelism(config.load(compose_cfg(*sweep)), points, 256) is None  # no budget


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
