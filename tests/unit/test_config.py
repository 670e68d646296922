"""The config contract: composition, typed conversion, and one clean error per bad input."""

import os
import socket
from dataclasses import fields, is_dataclass

import pytest

from sweeper import config
from sweeper.config import SweeperConfig
from sweeper.errors import ConfigError
from tests.harness import compose_cfg, run_cli
from tests.helpers import EXPERIMENTS


def test_demo_experiment_composes_to_typed_config(cfg_of):
    cfg = cfg_of("+experiment=resnet_batch")
    assert isinstance(cfg, SweeperConfig)
    assert cfg.model.name == "resnet18" and cfg.data.name == "digits"
    assert cfg.sweep.micro_batch_sizes == [16, 64]


def test_issue_overrides_compose(cfg_of):
    cfg = cfg_of(
        "sweep.micro_batch_sizes=[16,32,64]", "sweep.accumulation_steps=[1,4]",
        "sweep.num_workers=[1,2]", "model=mlp", "data=synthetic", "train.epochs=2",
    )
    assert cfg.model.depth == 4 and cfg.model.width == 1024
    assert cfg.data.name == "synthetic" and cfg.train.epochs == 2


@pytest.mark.parametrize(
    "override,key",
    [
        ("sweep.micro_batch_sizes=[-8]", "sweep.micro_batch_sizes"),
        ("sweep.accumulation_steps=[0]", "sweep.accumulation_steps"),
        ("sweep.num_workers=[]", "sweep.num_workers"),
        ("train.lr_scaling=cubic", "train.lr_scaling"),
        ("cluster.use_gpu=maybe", "cluster.use_gpu"),
        ("train.epochs=0", "train.epochs"),
        ("measure.warmup_steps=1", "measure.warmup_steps"),
        ("train.bn_recalibration_samples=-1", "train.bn_recalibration_samples"),
        ("measure.windows=2", "measure.windows"),
        ("measure.stability_tolerance=0", "measure.stability_tolerance"),
        ("sweep.points_per_worker_group=0", "sweep.points_per_worker_group"),
        ("sweep.micro_batch_sizes=fast", "sweep.micro_batch_sizes"),
        ("device.memory_budget_gb=-1", "device.memory_budget_gb"),
        ("frontier.growth=0", "frontier.growth"),
        ("frontier.max_fit_probes=1", "frontier.max_fit_probes"),
        ("cluster.placement_strategy=ANYWHERE", "cluster.placement_strategy"),
        ("cluster.max_failures=-1", "cluster.max_failures"),
        ("cluster.address=ray://head:10001", "cluster.address"),
        ("task=serve", "task"),
        ("inference.batch_sizes=[0]", "inference.batch_sizes"),
    ],
)
def test_bad_values_name_their_key(cfg_of, override, key):
    with pytest.raises(ConfigError) as err:
        cfg_of(override)
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(key)


def test_all_problems_are_collected(cfg_of):
    with pytest.raises(ConfigError) as err:
        cfg_of("sweep.micro_batch_sizes=[-1]", "sweep.accumulation_steps=[0]", "optim.lr=-1")
    assert len(err.value.problems) == 3


def test_auto_micro_batch_sizes_and_a_budget_compose(cfg_of):
    cfg = cfg_of("+experiment=resnet_frontier")
    assert cfg.sweep.micro_batch_sizes == "auto" and cfg.device.memory_budget_gb == 0.2
    assert cfg_of("sweep.micro_batch_sizes=[8,16]").sweep.micro_batch_sizes == [8, 16]
    with pytest.raises(ConfigError, match="device.memory_budget_gb"):
        cfg_of("sweep.micro_batch_sizes=auto", "cluster.use_gpu=false")


def test_use_gpu_accepts_yaml_booleans(cfg_of):
    assert cfg_of("cluster.use_gpu=false").cluster.use_gpu == "false"
    assert cfg_of("cluster.use_gpu=true").cluster.use_gpu == "true"


# The CLI: exit status 2, one line per problem naming key and fix, no traceback, before any trial.
BAD_INPUTS = [
    (["sweep.micro_batch_sizes=[-16]"], "sweep.micro_batch_sizes"),
    (["sweep.accumulation_steps=[0]"], "sweep.accumulation_steps"),
    (["sweep.global_batch_sizes=[7]"], "sweep.global_batch_sizes"),
    (["model.name=resnet_9000"], "model.name"),
    (["data.name=imagenet_from_mars"], "data.name"),
    (["data=cifar10", "data.root=/nonexistent"], "data.root"),
    (["model=custom", "model._target_=no_such_pkg.build"], "model._target_"),
    (["model=custom"], "model._target_"),
    (["data=custom"], "data._target_"),
    (["tracking.uri=http://127.0.0.1:9"], "tracking.uri"),
    (["cluster.address=127.0.0.1:9"], "cluster.address"),
    (["train.epochs=1", "sweep.micro_batch_sizes=[1024]", "sweep.accumulation_steps=[1]"], "train.epochs"),
    # No budget to search under on a CPU machine (a GPU's own memory would be the default).
    (["sweep.micro_batch_sizes=auto"], "sweep.micro_batch_sizes"),
]


@pytest.fixture(scope="module")
def bad_input_outcomes(tmp_path_factory):
    """Every BAD_INPUTS case through the CLI's own `main()` in one subprocess (test_bad_input's runner),
    each in a folder of its own: Python, torch and the driver's imports paid once, not ~7 s per case."""
    from tests.unit.test_bad_input import run_cases

    return run_cases([overrides for overrides, _ in BAD_INPUTS], tmp_path_factory.mktemp("config_bad_input"))


@pytest.mark.parametrize("index", range(len(BAD_INPUTS)), ids=[k for _, k in BAD_INPUTS])
def test_cli_bad_input_is_one_clean_line(bad_input_outcomes, index):
    from tests.unit.test_bad_input import NOTHING_STARTED

    key, result = BAD_INPUTS[index][1], bad_input_outcomes[index]
    assert result["status"] == 2, result["stderr"]
    assert "Traceback" not in result["stderr"] + result["stdout"]
    errors = [line for line in result["stderr"].splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result["stderr"]
    assert errors[0].startswith(f"error: {key}")
    # Nothing started: Ray not even imported, no store, Ray folder, Tune results or report made.
    assert not result["ray_imported"] and set(result["made"]) <= NOTHING_STARTED, result


def test_cli_dashboard_port_in_use_names_the_key(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(f"cluster.dashboard_port={port}", cwd=tmp_path, timeout=120, own_ray=True)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [errors[0]] and errors[0].startswith(f"error: cluster.dashboard_port={port} is in use")
    assert "Traceback" not in result.stderr


def test_cli_collects_several_problems(tmp_path):
    result = run_cli("sweep.micro_batch_sizes=[0]", "model.name=nope", "data.name=nope", cwd=tmp_path, timeout=120,
                     own_ray=True)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3 and "Traceback" not in result.stderr


def test_cli_help_and_cfg_job(tmp_path):
    help_text = run_cli("--help", cwd=tmp_path, timeout=60, own_ray=True)
    assert help_text.returncode == 0 and "micro-batch" in help_text.stdout
    assert "model: custom, gpt, hf, lightning, mlp, resnet18" in help_text.stdout
    job = run_cli("+experiment=resnet_batch", "--cfg", "job", cwd=tmp_path, timeout=60, own_ray=True)
    assert job.returncode == 0 and "name: resnet18" in job.stdout


def test_unknown_config_group_option_exits_2_without_traceback(tmp_path):
    result = run_cli("model=nope", cwd=tmp_path, timeout=60, own_ray=True)
    assert result.returncode == 2
    assert "Could not find 'model/nope'" in result.stderr and "Traceback" not in result.stderr
    assert "resnet18" in result.stderr  # Hydra lists the options


def test_own_experiment_files_with_config_dir(tmp_path):
    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "wide.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: mlp\nmodel: {width: 4096}\n"
    )
    result = run_cli("--config-dir", "my_conf", "+experiment=wide", "--cfg", "job", cwd=tmp_path, timeout=60,
                     own_ray=True)
    assert result.returncode == 0, result.stderr
    assert "width: 4096" in result.stdout




@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_file_composes_and_validates(cfg_of, name):
    cfg = cfg_of(f"+experiment={name}")
    assert cfg.sweep.micro_batch_sizes


# --- one home for defaults, scalars as lists, every number finite ----------------------------------

UNGROUPED = ("sweep", "train", "measure", "device", "frontier", "report", "tracking", "cluster", "inference",
             "task", "profile")


def test_the_composed_defaults_are_the_schemas_defaults():
    """conf/config.yaml holds group choices only; were a value set there too, the two could drift."""
    composed = config.to_typed(compose_cfg())
    schema = SweeperConfig()
    for section in UNGROUPED:
        assert getattr(composed, section) == getattr(schema, section), section


def test_one_integer_is_a_one_element_list(cfg_of):
    cfg = cfg_of(
        "sweep.micro_batch_sizes=64", "sweep.accumulation_steps=2", "sweep.num_workers=1",
        "sweep.global_batch_sizes=128", "inference.batch_sizes=8", "inference.mlp_widths=512",
    )
    assert (cfg.sweep.micro_batch_sizes, cfg.sweep.accumulation_steps, cfg.sweep.num_workers) == ([64], [2], [1])
    assert cfg.sweep.global_batch_sizes == [128]
    assert (cfg.inference.batch_sizes, cfg.inference.mlp_widths) == ([8], [512])
    assert cfg_of("sweep.micro_batch_sizes=auto", "device.memory_budget_gb=1").sweep.micro_batch_sizes == "auto"


@pytest.mark.parametrize("override", ["sweep.micro_batch_sizes=null", "sweep.micro_batch_sizes=[16,true]",
                                      "sweep.num_workers=[1.5]", "inference.mlp_widths={a:1}"])
def test_what_is_neither_a_list_nor_an_integer_names_its_key(cfg_of, override):
    with pytest.raises(ConfigError) as err:
        cfg_of(override)
    assert err.value.problems == [err.value.problems[0]] and err.value.problems[0].startswith(override.split("=")[0])


# Every float setting of every section: a new one without a rule fails here.
FLOAT_KEYS = [
    f"{section.name}.{f.name}"
    for section in fields(SweeperConfig) if is_dataclass(getattr(SweeperConfig(), section.name))
    for f in fields(getattr(SweeperConfig(), section.name)) if "float" in str(f.type) and "List" not in str(f.type)
]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_setting_must_be_finite(cfg_of, key, value):
    with pytest.raises(ConfigError) as err:
        cfg_of(f"{key}={value}")
    assert [p for p in err.value.problems if p.startswith(f"{key}=")], err.value.problems


def test_a_sample_too_big_to_allocate_is_refused_before_anything_allocates(cfg_of):
    with pytest.raises(ConfigError, match=r"model.input_shape=\[3, 100000, 100000\]: one float32 sample would take "
                                          r"111.8 GiB"):
        cfg_of("model.input_shape=[3,100000,100000]")
    assert cfg_of("model.input_shape=[3,224,224]", "data=synthetic", "data.num_samples=16")


def test_local_ray_cpus_and_loader_workers_are_bounded_by_this_machine(cfg_of):
    cores = os.cpu_count()
    with pytest.raises(ConfigError, match=f"this machine has {cores} CPUs"):
        cfg_of(f"cluster.num_cpus={cores + 1}")
    assert cfg_of(f"cluster.num_cpus={cores + 1}", "cluster.address=auto")  # a cluster's nodes: checked on connect
    assert cfg_of(f"data.loader_workers={4 * cores}")
    with pytest.raises(ConfigError, match="data.loader_workers"):
        cfg_of(f"data.loader_workers={4 * cores + 1}")
