"""The answer as an elastic plan (report.elastic): for each worker count from the fewest to the most measured, the
micro-batch and accumulation that keep the recommended global batch and fit memory, measured where the sweep ran
that point and predicted (and labelled so) where it did not; written into recommendation.yaml and into the Ray
Train snippet, whose ScalingConfig(num_workers=(min, max)) and per-world-size lookup are built for real."""

from pathlib import Path

import pytest
import yaml

from sweeper.report import elastic
from sweeper.report.analysis import recommend, recommendation_yaml
from sweeper.report.snippets import write_from_recommendation
from tests.helpers import trial
from tests.unit.test_snippets import snippet_module

MIB = 2 ** 20


def layout(mb, acc=1, w=1, sps=100.0, peak=100, **more):
    """A measured layout (tests.helpers.trial) at `sps` samples/s and `peak` MiB (None: none recorded), in SGD, fp32,
    no checkpointing."""
    return trial(mb, acc, w, samples_per_second=sps, peak_memory_bytes=None if peak is None else peak * MIB, lr=0.01,
                 precision="fp32",
                 activation_checkpointing="none", optimizer="sgd", **more)


def test_every_measured_worker_count_gets_its_fastest_measured_layout_of_the_global_batch():
    trials = [layout(32, 2, 1, sps=300, peak=400), layout(64, 1, 1, sps=320, peak=700),
              layout(32, 1, 2, sps=500, peak=420), layout(16, 2, 2, sps=450, peak=250)]
    found = elastic.plan(trials, trials[2])
    assert found["global_batch_size"] == 64 and found["num_workers"] == [1, 2]
    rows = {r["num_workers"]: r for r in found["rows"]}
    assert (rows[1]["micro_batch_size"], rows[1]["accumulation_steps"], rows[1]["source"]) == (64, 1, "measured")
    assert rows[1]["samples_per_second"] == 320 and rows[1]["from"] == ["mb64-acc1-w1"]
    assert (rows[2]["micro_batch_size"], rows[2]["accumulation_steps"], rows[2]["source"]) == (32, 1, "measured")


def test_a_budget_moves_a_worker_count_to_a_micro_batch_that_fits_and_says_it_was_not_run():
    # At one worker the only point of global batch 64 (mb64) is over a 512 MiB budget; mb32 fits, measured at
    # accumulation 1 and 4: the plan accumulates (64 = 32 x 2), so the accumulating point stands for it (its
    # held gradients are in its peak).
    trials = [layout(64, 1, 1, sps=320, peak=700), layout(32, 1, 1, sps=290, peak=300),
              layout(32, 4, 1, sps=280, peak=380), layout(32, 1, 2, sps=500, peak=420)]
    found = elastic.plan(trials, trials[3], budget_bytes=512 * MIB)
    one = found["rows"][0]
    assert (one["micro_batch_size"], one["accumulation_steps"], one["source"]) == (32, 2, "predicted")
    assert one["from"] == ["mb32-acc4-w1"] and one["peak_memory_bytes"] == 380 * MIB
    assert "not run" in one["why"]


def test_an_accumulating_row_never_takes_the_memory_of_a_point_without_accumulation():
    """The issue's gpt_sharded sweep (44 MiB a worker): at 2 workers ZeRO-3 measured mb2 and mb4 without
    accumulation (35.5, 37.5 MiB) and skipped both accumulating layouts by prediction (45.9, 50.1: the unsharded
    gradients held). A plan that accumulates at 2 workers used to borrow mb4-acc1's 37.5 and call mb4-acc2 fit."""
    zero3 = dict(suffix="-zero3", parallelism="zero3")
    trials = [layout(16, 1, 1, sps=90, peak=40, **zero3),
              layout(2, 1, 2, sps=200, peak=35.5, **zero3), layout(4, 1, 2, sps=111, peak=37.5, **zero3),
              layout(2, 2, 2, status="oom", sps=None, peak=None, memory_predicted_bytes=45.9 * MIB, **zero3),
              layout(4, 2, 2, status="oom", sps=None, peak=None, memory_predicted_bytes=50.1 * MIB, **zero3)]
    two = elastic.plan(trials, trials[0], budget_bytes=44 * MIB)["rows"][1]
    assert two["micro_batch_size"] is None, two  # share 8: mb4 x 2 and mb2 x 4 both hold their gradients
    roomy = elastic.plan(trials, trials[0], budget_bytes=60 * MIB)["rows"][1]
    assert (roomy["micro_batch_size"], roomy["accumulation_steps"]) == (4, 2)
    assert roomy["peak_memory_bytes"] == int(50.1 * MIB) and "memory predicted on mb4-acc2-w2-zero3" in roomy["why"]


def test_worker_counts_between_measured_ones_are_predicted_or_refused():
    trials = [layout(16, 4, 1, sps=200, peak=300), layout(16, 1, 4, sps=600, peak=200)]
    found = elastic.plan(trials, trials[1])
    rows = {r["num_workers"]: r for r in found["rows"]}
    assert sorted(rows) == [1, 2, 3, 4]
    two = rows[2]
    assert (two["micro_batch_size"], two["accumulation_steps"], two["source"]) == (16, 2, "predicted")
    # Per worker: 200 at one worker, 150 at four; at two, a third of the way: 183.3 per worker.
    assert two["samples_per_second"] == pytest.approx(2 * (200 + (150 - 200) / 3))
    assert two["peak_memory_bytes"] == 300 * MIB  # the larger neighbour's
    assert rows[3]["micro_batch_size"] is None and "not a multiple of 3" in rows[3]["why"]
    # Ray Train may start the run at any size in (min, max): the range stops where a count has no layout.
    assert found["num_workers"] is None  # four workers recommended, three has none
    assert elastic.plan(trials, trials[0])["num_workers"] == [1, 2]


def test_only_the_recommended_recipe_counts_and_one_worker_count_has_no_plan():
    from dataclasses import replace

    best = layout(32, 1, 2, sps=500, suffix="-zero3")  # the key names the sharding until the record does
    others = [layout(64, 1, 1, sps=900), replace(layout(64, 1, 1, sps=900, suffix="-zero3"), precision="bf16")]
    assert elastic.plan([best, *others], best) is None  # DDP, and zero3 in bf16, at one worker: not this recipe
    assert elastic.plan([best, layout(64, 1, 1, sps=900, suffix="-zero3")], best)["num_workers"] == [1, 2]


def test_the_recommendation_yaml_and_the_ray_train_snippet_carry_the_plan(tmp_path, monkeypatch):
    import ray.train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    trials = [layout(32, 2, 1, sps=300, peak=400, val_accuracy=0.9),
              layout(32, 1, 2, sps=500, peak=420, val_accuracy=0.9)]
    rec = recommend(trials, objective="throughput")
    doc = yaml.safe_load(recommendation_yaml(rec))
    assert doc["elastic_plan"]["num_workers"] == [1, 2]
    paths = write_from_recommendation(recommendation_yaml(rec), str(tmp_path / "s"), use_gpu=False)
    source = Path(next(p for p in paths if p.endswith("ray_train.py"))).read_text()
    snippet_module(tmp_path / "s", monkeypatch)  # the measured_recipe.py it imports
    namespace = {"train_loop_per_worker": lambda config: None}
    exec(compile(source, "ray_train.py", "exec"), namespace)  # noqa: S102 - our own file
    scaling = namespace["scaling_config"]
    assert isinstance(scaling, ScalingConfig) and isinstance(namespace["trainer"], TorchTrainer)
    assert scaling.elasticity_enabled and (scaling.min_workers, scaling.max_workers) == (1, 2)
    plan = namespace["ELASTIC_PLAN"]
    assert {w: (p["micro_batch_size"] * p["accumulation_steps"] * w, p["source"]) for w, p in plan.items()} == {
        1: (64, "measured"), 2: (64, "measured")}
    for world in (1, 2, 3):
        context = type("Context", (), {"get_world_size": lambda self, world=world: world})()
        monkeypatch.setattr(ray.train, "get_context", lambda context=context: context)
        if world in plan:
            assert namespace["layout_for_world_size"]() == plan[world]
        else:
            with pytest.raises(RuntimeError, match="no layout keeps the global batch at 3 workers"):
                namespace["layout_for_world_size"]()


def test_a_sweep_at_one_worker_count_writes_no_plan_and_its_ray_train_file_as_before(tmp_path):
    trials = [layout(32, 2, 2, sps=300, val_accuracy=0.9), layout(32, 1, 2, sps=500, val_accuracy=0.9)]
    text = recommendation_yaml(recommend(trials, objective="throughput"))
    assert "elastic_plan" not in yaml.safe_load(text)
    paths = write_from_recommendation(text, str(tmp_path / "s"), use_gpu=False)
    source = Path(next(p for p in paths if p.endswith("ray_train.py"))).read_text()
    assert "ELASTIC_PLAN" not in source and "ScalingConfig(num_workers=2," in source
