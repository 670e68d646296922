"""The paste-able answers for a sharded layout (zero2, zero3): each trainer's file names the sharding, checked by
running it where it runs here (FSDP2's fully_shard over a one-process gloo group for Lightning's configure_model
and Ray Train's shard_model; transformers' own parser of `fsdp_config`; Ray's ScalingConfig and TorchTrainer;
tomllib for torchtitan's TOML) and by the library's source names where it is not installed (Lightning,
DeepSpeed, torchtitan). A DDP layout's files are byte for byte what they were before the axis."""

import ast
import hashlib
import importlib.util
import json
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sweeper.report.snippets import Layout, deepspeed_config, write_snippets

# sha256 (first 16 hex digits) of every file of test_snippets.LAYOUTS as written at bcc3477, before the axis.
BEFORE_THE_AXIS = [
    ((64, 2, 2, 0.0707, "sgd", "bf16", "blocks", "cpu", "mb64-acc2-w2-bf16-ckpt"), {
        "layout.yaml": "4e213a318dce0445", "lightning_trainer.py": "2602328f1217c527",
        "hf_training_arguments.py": "e2d9675b68a18f17", "deepspeed_config.json": "794fb60ed241f5a0",
        "ray_train.py": "6f375cef07410fd0", "torchrun.sh": "c249379670922796", "README.md": "c6c946bb46fca464"}),
    ((32, 1, 1, 0.05, "adamw", "fp32", "none", "gpu", None), {
        "layout.yaml": "9e421096c4e97c64", "lightning_trainer.py": "9e5b244e56ce15b7",
        "hf_training_arguments.py": "f1a84e406c2ca491", "deepspeed_config.json": "1d30f811e94c96a5",
        "ray_train.py": "52a530e0de40884a", "torchrun.sh": "ce255fc9e525d75b", "README.md": "d85c566737d84a47"}),
    ((8, 4, 8, 1e-3, "adamw", "fp16", "none", "gpu", None), {
        "layout.yaml": "55f6299d019b91db", "lightning_trainer.py": "ce2054c24c88c0ef",
        "hf_training_arguments.py": "31210ac908aa3496", "deepspeed_config.json": "122d04519c969e75",
        "ray_train.py": "e4ab5176fe1df56a", "torchrun.sh": "13f88aa66265d7ef", "README.md": "848f36af204ac9b1"}),
]
# Lightning's ModelParallelStrategy.__init__ keywords (lightning/pytorch/strategies/model_parallel.py, 2.4+).
MODEL_PARALLEL_KEYWORDS = {"data_parallel_size", "tensor_parallel_size", "save_distributed_checkpoint",
                           "process_group_backend", "timeout"}
# torchtitan's JobConfig sections and fields used here (torchtitan/config/job_config.py at 000204a4).
TORCHTITAN_FIELDS = {
    "training": {"local_batch_size", "global_batch_size", "mixed_precision_param", "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward"},
    "activation_checkpoint": {"mode"},
    "optimizer": {"name", "lr"},
}
# accelerate's FSDP_AUTO_WRAP_POLICY (accelerate/utils/constants.py), the one name transformers' parser imports.
AUTO_WRAP_POLICIES = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]

SHARDED = [
    Layout(16, 2, 2, 0.01, "sgd", "bf16", "blocks", "cpu", key="mb16-acc2-w2-bf16-ckpt-zero2", parallelism="zero2"),
    Layout(4, 1, 4, 1e-3, "adamw", "fp32", "none", "gpu", key="mb4-acc1-w4-zero3", parallelism="zero3"),
]


@pytest.mark.parametrize("args, digests", BEFORE_THE_AXIS, ids=["bf16-w2-cpu", "fp32-w1-gpu", "fp16-w8-gpu"])
def test_a_ddp_layouts_files_are_byte_for_byte_what_they_were(args, digests, tmp_path):
    *fields, key = args
    for layout in (Layout(*fields, key=key), Layout(*fields, key=key, parallelism="ddp")):
        paths = write_snippets(layout, str(tmp_path / layout.parallelism))
        assert {Path(p).name: hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16] for p in paths} == digests


def test_parallelism_is_read_from_a_points_params_and_checked():
    params = {"micro_batch_size": "4", "accumulation_steps": "2", "num_workers": "2", "lr": "0.001",
              "key": "mb4-acc2-w2-zero3"}
    assert Layout.from_params(params).parallelism == "ddp"  # a sweep from before the axis measured DDP
    assert Layout.from_params({**params, "parallelism": "None"}).parallelism == "ddp"
    assert Layout.from_params({**params, "parallelism": "zero3"}).parallelism == "zero3"
    with pytest.raises(ValueError, match=r"parallelism='zero4' is invalid. Should be one of \['ddp', 'zero2', 'zero3'"):
        Layout(8, 1, 1, 0.1, parallelism="zero4")


@pytest.fixture(params=SHARDED, ids=lambda layout: layout.parallelism)
def written(request, tmp_path):
    layout = request.param
    paths = write_snippets(layout, str(tmp_path / "snippets"))
    return layout, {Path(p).name: Path(p) for p in paths}


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
    layout, files = written
    assert list(files) == ["layout.yaml", "lightning_trainer.py", "hf_training_arguments.py", "deepspeed_config.json",
                           "ray_train.py", "torchrun.sh", "torchtitan.toml", "README.md"]
    for name in ("lightning_trainer.py", "hf_training_arguments.py", "ray_train.py", "torchrun.sh",
                 "torchtitan.toml", "README.md"):
        assert f"sharding: {layout.parallelism} = " in files[name].read_text(), name
    assert "`torchtitan.toml`" in files["README.md"].read_text()
    assert "parallelism: " + layout.parallelism in files["layout.yaml"].read_text()


def test_lightning_model_parallel_strategy_shards_for_real(written, one_rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    layout, files = written
    source = files["lightning_trainer.py"].read_text()
    tree = ast.parse(source)
    [strategy] = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and getattr(n.func, "id", None) == "ModelParallelStrategy"]
    keywords = {k.arg: ast.literal_eval(k.value) for k in strategy.keywords}
    assert keywords == {"data_parallel_size": layout.num_workers, "tensor_parallel_size": 1}
    if importlib.util.find_spec("lightning"):
        import inspect

        from lightning.pytorch.strategies import ModelParallelStrategy
        assert set(keywords) <= set(inspect.signature(ModelParallelStrategy).parameters)
    else:
        assert set(keywords) <= MODEL_PARALLEL_KEYWORDS
    assert _reshards(tree) == [layout.parallelism == "zero3", False]  # the blocks, then the root
    configure_model = _function(source, "configure_model", {"fully_shard": fully_shard, "torch": torch,
                                                             "MixedPrecisionPolicy": MixedPrecisionPolicy})
    module = types.SimpleNamespace(model=_Blocks(),
                                   device_mesh={"data_parallel": init_device_mesh("cpu", (1,))})
    configure_model(module)
    assert isinstance(module.model, FSDPModule) and all(isinstance(b, FSDPModule) for b in module.model.layers)
    assert module.model(torch.ones(2, 8)).shape == (2, 8)


def test_hugging_face_fsdp_arguments_through_transformers_own_parser(written, monkeypatch):
    from transformers import TrainingArguments

    layout, files = written
    call = next(n for n in ast.walk(ast.parse(files["hf_training_arguments.py"].read_text()))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "TrainingArguments")
    args = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    import inspect
    assert set(args) <= set(inspect.signature(TrainingArguments).parameters)
    assert args["fsdp"] is True and args["gradient_checkpointing"] is False
    if not importlib.util.find_spec("accelerate"):
        # transformers' parser imports accelerate for one list of names; accelerate is not installed here.
        stub = types.ModuleType("accelerate.utils.constants")
        stub.FSDP_AUTO_WRAP_POLICY = AUTO_WRAP_POLICIES
        for name, module in (("accelerate", types.ModuleType("accelerate")),
                             ("accelerate.utils", types.ModuleType("accelerate.utils")),
                             ("accelerate.utils.constants", stub)):
            monkeypatch.setitem(sys.modules, name, module)
    parsed = types.SimpleNamespace(fsdp=args["fsdp"], fsdp_config=dict(args["fsdp_config"]),
                                   activation_checkpointing=False)
    plugin = TrainingArguments._process_fsdp_args(parsed)
    assert plugin["fsdp_version"] == 2
    assert plugin["reshard_after_forward"] is (layout.parallelism == "zero3")
    assert plugin.get("activation_checkpointing", False) is (layout.activation_checkpointing == "blocks")


def test_deepspeed_zero_stage(written):
    layout, files = written
    config = json.loads(files["deepspeed_config.json"].read_text())
    assert config == deepspeed_config(layout)
    assert config["zero_optimization"] == {"stage": {"zero2": 2, "zero3": 3}[layout.parallelism]}
    assert config["train_batch_size"] == layout.global_batch_size
    # deepspeed.initialize (0.19.8) refuses a ZeRO stage with torch's SGD unless this is set; AdamW is its own
    assert config.get("zero_allow_untested_optimizer") is ({"sgd": True, "adamw": None}[layout.optimizer])


def test_torchtitan_toml_parses_into_its_job_config_fields(written):
    layout, files = written
    config = tomllib.loads(files["torchtitan.toml"].read_text())
    assert all(set(v) <= TORCHTITAN_FIELDS[k] for k, v in config.items())
    assert config["training"]["local_batch_size"] == layout.micro_batch_size
    # torchtitan derives accumulation from these: global / (local x shard degree).
    assert config["training"]["global_batch_size"] // (layout.micro_batch_size * layout.num_workers) == \
        layout.accumulation_steps
    assert config["parallelism"]["data_parallel_shard_degree"] == layout.num_workers
    assert config["parallelism"]["fsdp_reshard_after_forward"] == {"zero2": "never", "zero3": "always"}[
        layout.parallelism]
    checkpointing = "full" if layout.activation_checkpointing == "blocks" else "none"
    assert config["activation_checkpoint"]["mode"] == checkpointing
    assert ("optimizer" in config) == (layout.optimizer == "adamw")


def test_ray_train_builds_and_its_shard_model_shards_for_real(written, one_rank):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from torch.distributed.fsdp import FSDPModule

    layout, files = written
    source = files["ray_train.py"].read_text()
    namespace = {"train_loop_per_worker": lambda config: None}
    exec(compile(source, "ray_train.py", "exec"), namespace)  # noqa: S102 - our own file
    assert isinstance(namespace["scaling_config"], ScalingConfig) and isinstance(namespace["trainer"], TorchTrainer)
    assert namespace["scaling_config"].num_workers == layout.num_workers
    assert namespace["train_loop_config"]["parallelism"] == layout.parallelism
    assert _reshards(ast.parse(source)) == [layout.parallelism == "zero3", False]
    model = _Blocks()
    before = model(torch.ones(2, 8))
    sharded = namespace["shard_model"](model, model.layers)
    assert isinstance(sharded, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.layers)
    # bf16 as sweeper trained it: FSDP2's policy gathers bf16 weights, torch.autocast stays around forward.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=layout.precision == "bf16"):
        after = sharded(torch.ones(2, 8))
    assert torch.allclose(before, after.float(), atol=5e-2 if layout.precision == "bf16" else 1e-6)


@pytest.mark.parametrize("sync", ["final", "every"])
def test_the_accumulation_rule_follows_the_sync_the_worker_did(sync, tmp_path):
    params = {"micro_batch_size": "4", "accumulation_steps": "2", "num_workers": "2", "lr": "0.001",
              "parallelism": "zero3", "gradient_sync": sync, "optimizer": "adamw"}
    layout = Layout.from_params(params)
    assert layout.gradient_sync == sync
    files = {Path(p).name: Path(p).read_text() for p in write_snippets(layout, str(tmp_path))}
    ray, lightning = files["ray_train.py"], files["lightning_trainer.py"]
    assert ("set_requires_gradient_sync(micro_step == accumulation_steps - 1)" in ray) == (sync == "final")
    assert ("leave the gradient sync on" in ray) == (sync == "every")
    # Lightning reduces at every micro-batch under FSDP2: said where that is not what was measured
    assert ("measured: final, one reduce per step" in lightning) == (sync == "final")
    assert "torch.cuda.set_device(ray.train.torch.get_device())" in ray  # FSDP2's mesh on this worker's GPU
    assert Layout.from_params({**params, "gradient_sync": "none"}).gradient_sync == "final"
    assert Layout.from_params({k: v for k, v in params.items() if k != "gradient_sync"}).gradient_sync == "final"
