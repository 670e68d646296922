"""sweep.strategy behind one interface: the train sweep finds a strategy by its name and asks it (configure,
grid_problems, opening_params, measure), never `if strategy == ...`; each strategy's decisions are pure
(sweeper/strategies/, tested here without processes) and its points run from sweeper/driver/."""

import ast
import pathlib
from dataclasses import replace
from types import SimpleNamespace

import pytest

from sweeper.config import DataConfig, ModelConfig
from sweeper.config.sweep import STRATEGIES as CONFIG_STRATEGIES
from sweeper.driver.strategy import STRATEGIES, strategy_of
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from sweeper.strategies import branch, grid
from tests.harness import typed_cfg
from tests.helpers import point_spec

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sweeper"
MLP = ["model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]", "data=digits",
       "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1,2]", "sweep.num_workers=[1]"]
# mb16/mb32 x accumulation 1/2 on one worker: global batches 16, 32, 32, 64
LAYOUTS = [GridPoint(m, a, 1) for m in (16, 32) for a in (1, 2)]


def test_every_strategy_the_config_accepts_has_one_and_each_answers_to_its_own_name():
    assert sorted(STRATEGIES) == sorted(CONFIG_STRATEGIES)
    assert all(strategy.name == name for name, strategy in STRATEGIES.items())
    for strategy in STRATEGIES.values():
        for hook in ("configure", "grid_problems", "opening_params", "measure"):
            assert callable(getattr(strategy, hook)), (strategy.name, hook)


def test_an_unknown_name_changes_nothing_before_the_configs_checks_refuse_it():
    cfg = typed_cfg(*MLP, "sweep.strategy=gird")
    strategy = strategy_of("gird")
    assert strategy.configure(cfg) is cfg and strategy.grid_problems(cfg, LAYOUTS) == []


def test_branch_trains_every_point_at_its_lr_rule_from_the_trunks_global_batch():
    # AdamW: branch.lr_scaling=auto is sqrt; train.lr_scaling none, so the base becomes the smallest
    # global batch, 16 (16 x 1 x 1), where optim.lr stays the trunk's LR
    cfg = typed_cfg(*MLP, "optim=adamw", "sweep.strategy=branch")
    configured = strategy_of("branch").configure(cfg)
    assert (configured.train.lr_scaling, configured.train.base_batch_size) == ("sqrt", 16)
    assert configured.optim.lr == cfg.optim.lr
    # SGD with train.lr_scaling=linear set: the rule is the run's own, the base left as configured
    sgd = typed_cfg(*MLP, "optim=sgd", "sweep.strategy=branch", "train.lr_scaling=linear")
    assert strategy_of("branch").configure(sgd) is sgd
    for name in ("grid", "smart"):
        assert strategy_of(name).configure(cfg) is cfg


def test_only_branch_asks_something_of_the_grid():
    cfg = typed_cfg(*MLP, "sweep.strategy=branch", "branch.base_global_batch=48")
    problem, = strategy_of("branch").grid_problems(cfg, LAYOUTS)
    assert problem.startswith("branch.base_global_batch=48 is not a global batch of the grid ([16, 32, 64])")
    top = typed_cfg(*MLP, "sweep.strategy=branch", "branch.base_global_batch=64")
    assert "needs a global batch larger than the trunk's 64" in strategy_of("branch").grid_problems(top, LAYOUTS)[0]
    assert strategy_of("grid").grid_problems(cfg, LAYOUTS) == strategy_of("smart").grid_problems(cfg, LAYOUTS) == []


def test_the_batch_coupled_layers_are_recorded_at_once_but_by_smart_with_its_classes():
    assert strategy_of("grid").opening_params(["BatchNorm2d"]) == {"batch_coupled_layers": "BatchNorm2d"}
    assert strategy_of("branch").opening_params([]) == {"batch_coupled_layers": "none"}
    assert strategy_of("smart").opening_params(["BatchNorm2d"]) == {}


def test_the_grid_measures_what_is_unrecorded_in_rounds_named_after_the_sweep():
    assert [p.key for p in grid.unrecorded(LAYOUTS, {"mb16-acc1-w1", "mb32-acc2-w1"})] == \
        ["mb16-acc2-w1", "mb32-acc1-w1"]
    assert grid.round_label("sweep-a", 0, "101500", resume=True) == "sweep-a"  # what a resume restores
    assert grid.round_label("sweep-a", 1, "101500", resume=False) == "sweep-a-rerun1"
    assert grid.round_label("sweep-a", 2, "101500", resume=True) == "sweep-a-rerun2-101500"
    assert grid.run_params(LAYOUTS, [LAYOUTS[:3], LAYOUTS[3:]]) == {"num_trials": 4, "num_worker_groups": 2}


def _trunk(window, at=(0.2, 0.5), steps=179):
    cfg = SimpleNamespace(branch=SimpleNamespace(window=window, at=list(at), lr_scaling="sqrt"))
    fastest = {16: LAYOUTS[0], 32: LAYOUTS[2], 64: LAYOUTS[3]}
    specs = {p: SimpleNamespace(steps=steps) for p in LAYOUTS}
    return cfg, branch.trunk_of(cfg, LAYOUTS, specs, fastest, 16), fastest


def test_the_trunk_saves_at_whole_steps_and_branches_to_each_global_batch_its_window_judges():
    # budget 179 x 16 = 2864 samples; 0.2 and 0.5 of it rounded down to whole steps of 16: 560, 1424
    _, trunk, _ = _trunk(384)
    assert (trunk.budget, trunk.window, trunk.marks) == (2864, 384, [560, 1424])
    assert (trunk.larger, trunk.unjudged, trunk.nothing_to_branch()) == ([32, 64], [], None)
    # 192 samples: the compared second half holds 96 / 32 = 3 steps of 32, but only one of 64
    _, short, _ = _trunk(192)
    assert (short.larger, short.unjudged, short.nothing_to_branch()) == ([32], [64], None)
    _, long, _ = _trunk(4096)
    assert long.marks == [] and long.nothing_to_branch() == (
        "a branch of 4096 samples fits in the budget of 2864 samples at none of branch.at")


def test_a_branch_runs_from_each_save_the_trunk_made_at_its_rules_lr_for_the_window():
    cfg, trunk, fastest = _trunk(384)
    model, data = ModelConfig(name="mlp", depth=2, width=32, input_shape=[1, 8, 8]), DataConfig(name="digits")
    unit = GridPoint(16, 1, 1, seed=0)
    specs = {unit: point_spec(unit, model, data, lr=0.01, steps=179)}
    done = PointResult(status="ok")
    done.state.saved_at_samples = [560.0]  # the trunk diverged before its save at 1424
    saves = {0: {560: "/ckpt/s560", 1424: "/ckpt/s1424"}}
    b_specs, what = branch.branch_specs(cfg, specs, replace(trunk, seeds=[0]), fastest, {0: done}, saves)
    got = {u.key: (s.steps, s.start_from, round(s.lr, 6), what[u]) for u, s in b_specs.items()}
    # 384 samples: 12 steps of 32, 6 of 64; the LR scaled by sqrt(g / 16) from the trunk's 0.01
    assert got == {"mb32-acc1-w1-from560-s0": (12, "/ckpt/s560", 0.014142, (0, 1, 32)),
                   "mb32-acc2-w1-from560-s0": (6, "/ckpt/s560", 0.02, (0, 1, 64))}


def test_the_strategies_package_never_imports_the_driver():
    found = []
    for path in sorted((ROOT / "strategies").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n == "sweeper.driver" or n.startswith("sweeper.driver.")]
    assert found == []


@pytest.mark.parametrize("module", ["sweeper/driver/train_sweep.py", "sweeper/driver/preflight.py"])
def test_the_train_sweep_never_picks_a_strategy_by_its_name(module):
    source = (ROOT.parent / module).read_text()
    assert 'strategy == "' not in source and 'strategy != "' not in source
