"""The paste-able answers for a sharded layout (zero2, zero3): each trainer's file names the sharding and carries
the recipe, checked by running it where it runs here (FSDP2's fully_shard over a one-process gloo group for
Lightning's configure_model and Ray Train's prepare; Lightning's own Trainer and ModelParallelStrategy;
transformers' own parser of `fsdp_config`; DeepSpeed's ZeRO check and deepspeed.initialize; Ray's ScalingConfig and
TorchTrainer) and, for torchtitan (not installed: its 0.2 release pulls datasets, tensorboard and wandb), against
its JobConfig's fields, which its ConfigManager checks the same way (an unknown field is refused)."""

import ast
import json
import socket
import tomllib
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sweeper.report.snippets import Layout, deepspeed_config, write_snippets
from tests.unit.test_snippets import ADAMW_COSINE, LAYOUTS, SGD_WSD, point, snippet_module

# torchtitan v0.2.2's JobConfig (torchtitan/config/job_config.py at tag v0.2.2, the last release that reads TOML):
# for each section the snippet writes, every field and what it takes (a type, or the Literal's values).
TORCHTITAN_FIELDS = {
    "job": {"config_file": str, "dump_folder": str, "description": str, "print_config": bool,
            "save_config_file": str, "custom_config_module": str},
    "model": {"name": str, "flavor": str, "hf_assets_path": str, "tokenizer_path": str, "converters": list,
              "print_after_conversion": bool},
    "optimizer": {"name": str, "lr": float, "beta1": float, "beta2": float, "eps": float, "weight_decay": float,
                  "implementation": {"for-loop", "foreach", "fused"}, "early_step_in_backward": bool},
    "lr_scheduler": {"warmup_steps": int, "total_steps": int, "decay_ratio": float,
                     "decay_type": {"linear", "sqrt", "cosine"}, "min_lr_factor": float},
    "training": {"dataset": str, "dataset_path": str, "local_batch_size": int, "global_batch_size": int,
                 "seq_len": int, "max_norm": (float, int), "steps": int, "enable_cpu_offload": bool,
                 "dtype": {"bfloat16", "float32"}, "mixed_precision_param": {"bfloat16", "float32"},
                 "mixed_precision_reduce": {"float32"}, "gc_freq": int, "gc_debug": bool},
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": {"default", "always", "never"}, "tensor_parallel_degree": int},
    "activation_checkpoint": {"mode": {"selective", "full", "memory_budget", "none"}},
    "checkpoint": {"enable": bool, "folder": str, "interval": int},
}

SHARDED = [
    Layout.from_params(point(16, 2, 2, 0.01, SGD_WSD, precision="bf16", activation_checkpointing="blocks",
                             parallelism="zero2", gradient_sync="set_requires_gradient_sync",
                             key="mb16-acc2-w2-bf16-ckpt-zero2"), "cpu"),
    Layout.from_params(point(4, 1, 4, 1e-3, ADAMW_COSINE, parallelism="zero3", key="mb4-acc1-w4-zero3"), "gpu"),
    Layout.from_params(point(4, 2, 2, 1e-3, ADAMW_COSINE, parallelism="zero3", gradient_sync="every",
                             context="128", key="mb4-acc2-w2-zero3-every"), "gpu"),
]


def test_a_ddp_layouts_files_name_no_sharding(tmp_path):
    for name, layout in LAYOUTS.items():
        for path in write_snippets(layout, str(tmp_path / name)):
            text = Path(path).read_text()
            assert "sharding:" not in text and "fully_shard" not in text and "zero_optimization" not in text, path


def test_parallelism_is_read_from_a_points_params_and_checked():
    params = {"micro_batch_size": "4", "accumulation_steps": "2", "num_workers": "2", "lr": "0.001",
              "key": "mb4-acc2-w2-zero3"}
    assert Layout.from_params(params).parallelism == "ddp"  # a sweep from before the axis measured DDP
    assert Layout.from_params({**params, "parallelism": "None"}).parallelism == "ddp"
    assert Layout.from_params({**params, "parallelism": "zero3"}).parallelism == "zero3"
    # Today's workers reduce once at the last micro-step; "every" (issue 56's second mode) as recorded.
    assert Layout.from_params({**params, "gradient_sync": "set_requires_gradient_sync"}).gradient_sync == "final"
    assert Layout.from_params({**params, "gradient_sync": "every"}).gradient_sync == "every"
    with pytest.raises(ValueError, match=r"parallelism='zero4' is invalid. Should be one of \['ddp', 'zero1', "
                                         r"'zero2', 'zero3', 'hsdp'"):
        Layout(8, 1, 1, 0.1, parallelism="zero4")


@pytest.fixture(params=SHARDED, ids=lambda layout: layout.key)
def written(request, tmp_path, monkeypatch):
    layout = request.param
    folder = tmp_path / "snippets"
    paths = write_snippets(layout, str(folder))
    return layout, {Path(p).name: Path(p) for p in paths}, snippet_module(folder, monkeypatch)


@pytest.fixture
def one_rank(tmp_path):
    """A gloo process group of one (this process): what fully_shard needs to run, torn down after."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _reshards(tree: ast.AST) -> list:
    """Each fully_shard call's reshard_after_forward, in the file's order."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "fully_shard"]
    calls.sort(key=lambda n: n.lineno)
    return [ast.literal_eval(k.value) for c in calls for k in c.keywords if k.arg == "reshard_after_forward"]


def _function(source: str, name: str, namespace: dict):
    """One top-level function of a snippet, compiled and defined in `namespace` (the rest is not run)."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module([node], []), name, "exec"), namespace)  # noqa: S102 - our own file
    return namespace[name]


def test_every_file_names_the_sharding_and_torchtitans_is_written(written):
    layout, files, _ = written
    assert list(files) == ["layout.yaml", "measured_recipe.py", "lightning_trainer.py", "hf_training_arguments.py",
                           "deepspeed_config.json", "deepspeed_initialize.py", "ray_train.py", "torchrun.sh",
                           "torchtitan.toml", "README.md"]
    for name in files:
        if name not in ("layout.yaml", "deepspeed_config.json"):
            assert f"sharding: {layout.parallelism} = " in files[name].read_text(), name
    assert "`torchtitan.toml`" in files["README.md"].read_text()
    assert "parallelism: " + layout.parallelism in files["layout.yaml"].read_text()


def test_lightning_model_parallel_strategy_trainer_and_sync_for_real(written, one_rank):
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    layout, files, _ = written
    source = files["lightning_trainer.py"].read_text()
    tree = ast.parse(source)
    [strategy] = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and getattr(n.func, "id", None) == "ModelParallelStrategy"]
    keywords = {k.arg: ast.literal_eval(k.value) for k in strategy.keywords}
    assert keywords == {"data_parallel_size": layout.num_workers, "tensor_parallel_size": 1}
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "Trainer"]
    args = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "strategy"}
    assert args["gradient_clip_val"] == layout.recipe.grad_clip_norm and args["max_steps"] == int(
        layout.recipe.total_steps)
    trainer = L.Trainer(**{**args, "accelerator": "cpu"}, strategy=ModelParallelStrategy(**keywords), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy, ModelParallelStrategy)
    assert (trainer.accumulate_grad_batches, trainer.gradient_clip_val) == (layout.accumulation_steps,
                                                                           layout.recipe.grad_clip_norm)
    assert _reshards(tree) == [layout.parallelism == "zero3", False]  # the blocks, then the root
    configure_model = _function(source, "configure_model", {"fully_shard": fully_shard, "torch": torch,
                                                             "MixedPrecisionPolicy": MixedPrecisionPolicy})
    module = types.SimpleNamespace(model=_Blocks(), device_mesh={"data_parallel": init_device_mesh("cpu", (1,))})
    configure_model(module)
    assert isinstance(module.model, FSDPModule) and all(isinstance(b, FSDPModule) for b in module.model.layers)
    assert module.model(torch.ones(2, 8)).shape == (2, 8)
    # Accumulation as measured: "final" holds the gradients until the last micro-step of each optimizer step (and
    # the epoch's last batch); "every" is Lightning's own behaviour, so nothing is written.
    has_sync = "def sync_at_last_micro_step" in source
    assert has_sync == (layout.gradient_sync == "final" and layout.accumulation_steps > 1)
    if has_sync:
        sync = _function(source, "sync_at_last_micro_step", {})
        asked = []
        model = types.SimpleNamespace(set_requires_gradient_sync=asked.append)
        owner = types.SimpleNamespace(model=model, trainer=types.SimpleNamespace(accumulate_grad_batches=2,
                                                                                 num_training_batches=5))
        for batch_idx in range(5):
            sync(owner, batch_idx)
        assert asked == [False, True, False, True, True]
        sync(types.SimpleNamespace(model=module.model, trainer=owner.trainer), 0)  # FSDP2's own method takes it


def test_hugging_face_fsdp_arguments_through_transformers_own_parser(written):
    import inspect

    from transformers import TrainingArguments

    layout, files, _ = written
    call = next(n for n in ast.walk(ast.parse(files["hf_training_arguments.py"].read_text()))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "TrainingArguments")
    args = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert set(args) <= set(inspect.signature(TrainingArguments).parameters)
    assert args["fsdp"] is True and args["activation_checkpointing"] is False
    parsed = types.SimpleNamespace(fsdp=args["fsdp"], fsdp_config=dict(args["fsdp_config"]),
                                   activation_checkpointing=False)
    plugin = TrainingArguments._process_fsdp_args(parsed)
    assert plugin["fsdp_version"] == 2
    assert plugin["reshard_after_forward"] is (layout.parallelism == "zero3")
    assert plugin.get("activation_checkpointing", False) is (layout.activation_checkpointing == "blocks")


def test_deepspeed_zero_stage_and_its_untested_optimizer_check(written):
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    layout, files, _ = written
    config = json.loads(files["deepspeed_config.json"].read_text())
    assert config == deepspeed_config(layout)
    assert config["zero_optimization"] == {"stage": {"zero2": 2, "zero3": 3}[layout.parallelism]}
    assert config["train_batch_size"] == layout.global_batch_size
    # deepspeed.initialize asserts on a ZeRO optimizer outside its list unless the config allows it: torch's SGD.
    # (is_zero_supported_optimizer's list; the function itself asks the process group for its rank.)
    assert torch.optim.SGD not in ZERO_SUPPORTED_OPTIMIZERS and torch.optim.AdamW in ZERO_SUPPORTED_OPTIMIZERS
    assert config.get("zero_allow_untested_optimizer", False) is (layout.optimizer == "sgd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_deepspeed_initialize_takes_the_sgd_zero_snippets_and_steps_the_measured_schedule(tmp_path, monkeypatch):
    """deepspeed.initialize on one gloo rank through deepspeed_initialize.py, for SGD under ZeRO-2 and ZeRO-3 (what
    issue 56 found refused): with zero_allow_untested_optimizer it builds and steps at the measured LR; without
    it DeepSpeed refuses. Its CPU shared-memory all-reduce kernel is not compiled here (built on first use, about 2
    minutes): the one-rank group needs none."""
    import importlib

    import deepspeed

    monkeypatch.setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(_free_port()))):
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        for parallelism in ("zero2", "zero3"):
            layout = Layout.from_params(point(2, 2, 1, 0.01, SGD_WSD, parallelism=parallelism), "cpu")
            folder = tmp_path / parallelism
            write_snippets(layout, str(folder))
            recipe = snippet_module(folder, monkeypatch)
            monkeypatch.chdir(folder)  # the snippet names its config file beside it
            namespace = {"model": _Blocks()}
            exec(compile((folder / "deepspeed_initialize.py").read_text(), "ds", "exec"), namespace)  # noqa: S102
            engine, optimizer = namespace["engine"], namespace["optimizer"]
            lrs = []
            for _ in range(2 * 4):  # four optimizer steps of two micro-steps
                engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
                lrs.append(optimizer.param_groups[0]["lr"])
                engine.step()
            assert lrs[::2] == pytest.approx([0.01 * recipe.lr_factor(k) for k in range(4)])
            assert {g["momentum"] for g in optimizer.param_groups} == {0.8}
            refused = {k: v for k, v in json.loads((folder / "deepspeed_config.json").read_text()).items()
                       if k != "zero_allow_untested_optimizer"}
            with pytest.raises(AssertionError, match="untested ZeRO Optimizer"):
                deepspeed.initialize(model=_Blocks(), config=refused,
                                     optimizer=recipe.build_optimizer(_Blocks()))
    finally:
        dist.destroy_process_group()


def test_torchtitan_toml_is_a_job_config_of_the_measured_recipe(written):
    layout, files, _ = written
    config = tomllib.loads(files["torchtitan.toml"].read_text())
    for section, values in config.items():
        known = TORCHTITAN_FIELDS[section]
        for name, value in values.items():
            kind = known[name]
            assert value in kind if isinstance(kind, set) else isinstance(value, kind), f"{section}.{name}={value!r}"
    training, r = config["training"], layout.recipe
    assert training["local_batch_size"] == layout.micro_batch_size
    # torchtitan derives accumulation from these: global / (local x shard degree).
    assert training["global_batch_size"] // (layout.micro_batch_size * layout.num_workers) == layout.accumulation_steps
    assert training["steps"] == int(r.total_steps) and training["seq_len"] == (layout.context or 2048)
    assert training["max_norm"] == r.grad_clip_norm  # both clip (torchtitan always clips: no clip is an inf norm)
    assert config["parallelism"]["data_parallel_shard_degree"] == layout.num_workers
    assert config["parallelism"]["fsdp_reshard_after_forward"] == {"zero2": "never", "zero3": "always"}[
        layout.parallelism]
    checkpointing = "full" if layout.activation_checkpointing == "blocks" else "none"
    assert config["activation_checkpoint"]["mode"] == checkpointing
    schedule, optimizer = config["lr_scheduler"], config["optimizer"]
    assert schedule["warmup_steps"] == r.warmup_steps and schedule["min_lr_factor"] == r.min_lr_ratio
    assert schedule["decay_type"] == ("cosine" if r.lr_schedule == "cosine" else "linear")
    assert schedule.get("decay_ratio") == (r.decay_fraction if r.lr_schedule == "wsd" else None)
    text = files["torchtitan.toml"].read_text()
    if layout.optimizer == "adamw":
        assert (optimizer["beta1"], optimizer["beta2"], optimizer["eps"], optimizer["weight_decay"]) == (
            *r.betas, r.eps, r.weight_decay)
        assert "It cannot set no_decay bias,norm" in text
    else:
        assert "It cannot set optimizer sgd" in text
    assert ("It cannot set gradient_sync final" in text) == (layout.accumulation_steps > 1
                                                              and layout.gradient_sync == "final")


def test_torchtitan_without_clipping_and_with_a_constant_lr(tmp_path):
    """No clipping is an infinite max_norm (torchtitan always clips: clip_grad_norm_ by inf scales by 1); a
    constant LR is decay_ratio 0.0 (its schedule never reaches the decay)."""
    constant = {"optimizer": "adamw", "lr_schedule": "constant", "warmup_steps": "5", "grad_clip_norm": "None"}
    layout = Layout.from_params(point(4, 1, 2, 1e-3, constant, parallelism="zero3"), "gpu")
    write_snippets(layout, str(tmp_path))
    config = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    assert config["training"]["max_norm"] == float("inf") and config["lr_scheduler"]["decay_ratio"] == 0.0
    grads = nn.Linear(3, 3)
    for p in grads.parameters():
        p.grad = torch.full_like(p, 10.0)
    before = [p.grad.clone() for p in grads.parameters()]
    torch.nn.utils.clip_grad_norm_(grads.parameters(), config["training"]["max_norm"])
    assert all(torch.equal(a, p.grad) for a, p in zip(before, grads.parameters()))


def test_ray_train_builds_and_its_prepare_shards_on_the_workers_device(written, one_rank, monkeypatch):
    import ray.train.torch
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from torch.distributed.fsdp import FSDPModule

    layout, files, _ = written
    source = files["ray_train.py"].read_text()
    namespace = {"train_loop_per_worker": lambda config: None}
    exec(compile(source, "ray_train.py", "exec"), namespace)  # noqa: S102 - our own file
    assert isinstance(namespace["scaling_config"], ScalingConfig) and isinstance(namespace["trainer"], TorchTrainer)
    assert namespace["scaling_config"].num_workers == layout.num_workers
    assert namespace["train_loop_config"]["parallelism"] == layout.parallelism
    assert _reshards(ast.parse(source)) == [layout.parallelism == "zero3", False]
    # prepare(model, blocks): on the device Ray Train gives this worker (outside a Ray Train run: asked here).
    asked = []
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: asked.append(1) or torch.device("cpu"))
    model = _Blocks()
    before = model(torch.ones(2, 8))
    sharded = namespace["prepare"](model, model.layers)
    assert asked and isinstance(sharded, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.layers)
    # bf16 as sweeper trained it: FSDP2's policy gathers bf16 weights, torch.autocast stays around forward.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=layout.precision == "bf16"):
        after = sharded(torch.ones(2, 8))
    assert torch.allclose(before, after.float(), atol=5e-2 if layout.precision == "bf16" else 1e-6)


def test_a_zero1_layout_is_ddps_files_naming_zero1_and_deepspeeds_stage_1(tmp_path):
    layout = Layout(8, 2, 4, 1e-3, "adamw", key="mb8-acc2-w4-zero1", parallelism="zero1")
    files = {Path(p).name: Path(p).read_text() for p in write_snippets(layout, str(tmp_path))}
    assert "torchtitan.toml" not in files  # no FSDP2 to configure
    assert "# sharding: zero1 = ZeRO-1, DDP with torch's ZeroRedundancyOptimizer" in files["lightning_trainer.py"]
    assert "strategy='ddp'" in files["lightning_trainer.py"]
    assert json.loads(files["deepspeed_config.json"])["zero_optimization"] == {"stage": 1}
    assert "parallelism: zero1" in files["layout.yaml"]


def test_an_hsdp_layouts_mesh_is_nodes_by_devices_per_node_in_torchtitan_and_deepspeed(tmp_path):
    layout = Layout(4, 2, 4, 1e-3, "adamw", "bf16", "none", "gpu", key="mb4-acc2-w4-bf16-hsdp", parallelism="hsdp",
                    gpus_per_node=2)  # 4 workers on nodes of 2 GPUs
    files = {Path(p).name: Path(p).read_text() for p in write_snippets(layout, str(tmp_path))}
    degrees = tomllib.loads(files["torchtitan.toml"])["parallelism"]
    assert (degrees["data_parallel_replicate_degree"], degrees["data_parallel_shard_degree"]) == (2, 2)
    assert json.loads(files["deepspeed_config.json"])["zero_optimization"] == {"stage": 3, "mics_shard_size": 2}
    assert 'init_device_mesh("cuda", (2, 2), mesh_dim_names=("replicate", "shard"))' in files["ray_train.py"]
