"""The paste-able answers: each trainer's settings are the recommended layout, checked by building
the real object where the library is installed here (Ray Train's ScalingConfig, torch's DataLoader,
torchrun's argument parser) and by the library's documented names where it is not (Lightning,
Hugging Face transformers, DeepSpeed are not installed in this venv)."""

import ast
import importlib.util
import inspect
import json
import shlex
from pathlib import Path

import pytest

from sweeper.report.snippets import Layout, deepspeed_config, torchrun_argv, write_from_recommendation, write_snippets

# Lightning 2.x `Trainer.__init__` keywords and precision strings (lightning/fabric/plugins/precision/
# precision.py: _PRECISION_INPUT_STR); used when Lightning is not installed.
LIGHTNING_TRAINER_KEYWORDS = {"accelerator", "strategy", "devices", "num_nodes", "precision", "accumulate_grad_batches"}
LIGHTNING_PRECISIONS = {"16-mixed", "bf16-mixed", "32-true", "64-true"}
# transformers' TrainingArguments fields (4.34+: use_cpu) and OptimizerNames used here.
HF_FIELDS = {"output_dir", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "bf16",
             "fp16", "gradient_checkpointing", "optim", "use_cpu"}
HF_OPTIMS = {"sgd", "adamw_torch"}
# DeepSpeed's documented config keys (deepspeed.ai/docs/config-json) and its own optimizer types.
DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                  "fp16", "optimizer"}
DEEPSPEED_OPTIMIZERS = {"Adam", "AdamW", "OneBitAdam", "Lamb", "OneBitLamb"}

LAYOUTS = [
    Layout(64, 2, 2, 0.0707, "sgd", "bf16", "blocks", "cpu", key="mb64-acc2-w2-bf16-ckpt"),
    Layout(32, 1, 1, 0.05, "adamw", "fp32", "none", "gpu"),
    Layout(8, 4, 8, 1e-3, "adamw", "fp16", "none", "gpu"),
]


def _call(tree: ast.AST, name: str) -> ast.Call:
    """The one call of `name` (a bare name or an attribute's last part) in the snippet."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]
    assert len(calls) == 1, f"{name}: {len(calls)} calls"
    return calls[0]


def _keywords(call: ast.Call) -> dict:
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if not isinstance(k.value, ast.Name)}


@pytest.fixture(params=LAYOUTS, ids=lambda layout: f"{layout.precision}-w{layout.num_workers}-{layout.device}")
def written(request, tmp_path):
    layout = request.param
    paths = write_snippets(layout, str(tmp_path / "snippets"))
    return layout, {Path(p).name: Path(p) for p in paths}


def test_every_file_is_written_and_named_in_the_readme(written):
    layout, files = written
    assert list(files) == ["layout.yaml", "lightning_trainer.py", "hf_training_arguments.py",
                           "deepspeed_config.json", "ray_train.py", "torchrun.sh", "README.md"]
    readme = files["README.md"].read_text()
    assert all(f"`{name}`" in readme for name in files if name != "README.md")
    assert f"global batch {layout.global_batch_size} = micro-batch {layout.micro_batch_size}" in readme


def test_lightning_trainer_and_dataloader(written):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    layout, files = written
    tree = ast.parse(files["lightning_trainer.py"].read_text())
    trainer = _keywords(_call(tree, "Trainer"))
    assert trainer["devices"] == layout.num_workers and trainer["accumulate_grad_batches"] == layout.accumulation_steps
    assert trainer["precision"] == {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[layout.precision]
    assert trainer["strategy"] == ("ddp" if layout.num_workers > 1 else "auto")
    assert trainer["accelerator"] == layout.device
    if importlib.util.find_spec("lightning"):
        import lightning

        assert set(trainer) <= set(inspect.signature(lightning.Trainer).parameters)
    else:
        assert set(trainer) <= LIGHTNING_TRAINER_KEYWORDS and trainer["precision"] in LIGHTNING_PRECISIONS
    # The DataLoader line, built for real: its batch is the per-device micro-batch.
    loader_call = _call(tree, "DataLoader")
    data = TensorDataset(torch.zeros(4 * layout.micro_batch_size, 3))
    loader = eval(compile(ast.Expression(loader_call), "lightning_trainer.py", "eval"),
                  {"DataLoader": DataLoader, "train_dataset": data})
    assert loader.batch_size == layout.micro_batch_size and len(loader) == 4


def test_hugging_face_training_arguments(written):
    layout, files = written
    args = _keywords(_call(ast.parse(files["hf_training_arguments.py"].read_text()), "TrainingArguments"))
    assert args["per_device_train_batch_size"] == layout.micro_batch_size
    assert args["gradient_accumulation_steps"] == layout.accumulation_steps
    assert args["learning_rate"] == layout.lr
    assert (args["bf16"], args["fp16"]) == (layout.precision == "bf16", layout.precision == "fp16")
    assert args["gradient_checkpointing"] == (layout.activation_checkpointing == "blocks")
    assert args.get("use_cpu", False) == (layout.device == "cpu")
    if importlib.util.find_spec("transformers"):
        from transformers import TrainingArguments

        assert set(args) <= set(inspect.signature(TrainingArguments).parameters)
    else:
        assert set(args) <= HF_FIELDS and args["optim"] in HF_OPTIMS


def test_deepspeed_config_keeps_its_batch_identity(written):
    layout, files = written
    config = json.loads(files["deepspeed_config.json"].read_text())
    assert config == deepspeed_config(layout)
    assert set(config) <= DEEPSPEED_KEYS
    # DeepSpeed refuses a config where these disagree (train_batch_size = micro x accumulation x world size).
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * layout.num_workers)
    assert config["bf16"]["enabled"] == (layout.precision == "bf16")
    assert config["fp16"]["enabled"] == (layout.precision == "fp16")
    assert not (config["bf16"]["enabled"] and config["fp16"]["enabled"])
    if layout.optimizer == "sgd":
        assert "optimizer" not in config  # not a DeepSpeed optimizer: the README says to pass torch's
    else:
        assert config["optimizer"]["type"] in DEEPSPEED_OPTIMIZERS and config["optimizer"]["params"]["lr"] == layout.lr


def test_ray_train_snippet_builds_the_real_scaling_config_and_trainer(written):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    layout, files = written
    namespace = {"train_loop_per_worker": lambda config: None}
    exec(compile(files["ray_train.py"].read_text(), "ray_train.py", "exec"), namespace)  # noqa: S102 - our own file
    scaling = namespace["scaling_config"]
    assert isinstance(scaling, ScalingConfig) and isinstance(namespace["trainer"], TorchTrainer)
    assert scaling.num_workers == layout.num_workers and scaling.use_gpu == (layout.device == "gpu")
    config = namespace["train_loop_config"]
    assert (config["micro_batch_size"], config["accumulation_steps"], config["lr"]) == (
        layout.micro_batch_size, layout.accumulation_steps, layout.lr)


def test_torchrun_command_parses_with_torchruns_own_parser(written):
    from torch.distributed.run import get_args_parser

    layout, files = written
    line = [s for s in files["torchrun.sh"].read_text().splitlines() if s.startswith("torchrun ")]
    argv = shlex.split(line[0])
    assert argv == torchrun_argv(layout)
    parsed = get_args_parser().parse_args(argv[1:])
    assert parsed.nproc_per_node == str(layout.num_workers) and parsed.nnodes == "1"
    assert parsed.training_script == "your_train.py"
    assert f"--micro-batch-size={layout.micro_batch_size}" in parsed.training_script_args
    assert f"--accumulation-steps={layout.accumulation_steps}" in parsed.training_script_args


def test_layout_from_a_points_recorded_params_and_bad_values():
    params = {"micro_batch_size": "64", "accumulation_steps": "2", "num_workers": "2", "lr": "0.07",
              "optimizer": "sgd", "precision": "bf16", "activation_checkpointing": "none", "key": "mb64-acc2-w2-bf16"}
    layout = Layout.from_params(params, device="cpu")
    assert (layout.micro_batch_size, layout.global_batch_size, layout.lr, layout.key) == (64, 256, 0.07,
                                                                                          "mb64-acc2-w2-bf16")
    with pytest.raises(ValueError, match=r"precision='fp8' is invalid. Should be one of \['fp32', 'bf16', 'fp16'\]"):
        Layout(8, 1, 1, 0.1, precision="fp8")
    with pytest.raises(ValueError, match="micro_batch_size=0 must be a positive integer"):
        Layout(0, 1, 1, 0.1)


def test_a_reports_recommendation_yaml_is_written_as_snippets(tmp_path):
    """The `recommendation` section of a report's recommendation.yaml (the shape analysis.py writes)."""
    text = """objective: throughput
recommendation:
  key: mb16-acc2-w2-bf16
  micro_batch_size: 16
  accumulation_steps: 2
  num_workers: 2
  global_batch_size: 64
  lr: 0.05
  lr_multiplier: 1.0
  precision: bf16
  activation_checkpointing: none
  optimizer: sgd
  samples_per_second: 100.0
reason: fastest
"""
    paths = write_from_recommendation(text, str(tmp_path / "s"), use_gpu=False)
    config = json.loads(Path(paths[3]).read_text())
    assert config["train_batch_size"] == 64 and config["bf16"]["enabled"] is True
    assert "mb16-acc2-w2-bf16" in Path(paths[1]).read_text() and "accelerator='cpu'" in Path(paths[1]).read_text()
    assert write_from_recommendation("recommendation: null\nreason: no eligible point\n", str(tmp_path / "n"),
                                     use_gpu=True) == []


@pytest.mark.parametrize("workers, gpus_per_node, nnodes, per_node, last", [
    (8, None, 1, 8, 8),  # not recorded: every worker on one node, as before
    (8, 8, 1, 8, 8),
    (2, 8, 1, 2, 2),  # fewer workers than a node's GPUs: one node, only them
    (8, 4, 2, 4, 4),
    (16, 8, 2, 8, 8),
    (12, 8, 2, 8, 4),  # Ray's PACK fills the first node: 8 + 4
    (5, 2, 3, 2, 1),
])
def test_torchrun_spans_the_nodes_of_its_gpus_per_node(workers, gpus_per_node, nnodes, per_node, last, tmp_path):
    from torch.distributed.run import get_args_parser

    layout = Layout(16, 1, workers, 0.1, gpus_per_node=gpus_per_node)
    paths = write_snippets(layout, str(tmp_path))
    script = Path(paths[5]).read_text()
    (line,) = [s for s in script.splitlines() if s.startswith("torchrun ")]
    parsed = get_args_parser().parse_args(shlex.split(line)[1:])
    assert (parsed.nnodes, parsed.nproc_per_node) == (str(nnodes), str(per_node))
    assert per_node * (nnodes - 1) + last == workers  # every worker runs, none more
    if nnodes > 1:  # one rendezvous for every node's torchrun, at the first node
        assert (parsed.rdzv_backend, parsed.rdzv_endpoint) == ("c10d", "FIRST_NODE:29400")
        assert f"# Run it on each of the {nnodes} nodes ({gpus_per_node} GPUs each)" in script
    assert (f"# On the last node: --nproc_per_node={last} " in script) == (last != per_node)


def test_torchrun_says_how_to_spread_workers_over_nodes_when_the_gpus_per_node_are_unknown(tmp_path):
    hint = "# Over nodes of G < 8 GPUs: --nnodes=ceil(8/G) --nproc_per_node=G --rdzv_backend=c10d"
    assert hint in Path(write_snippets(Layout(16, 1, 8, 0.1), str(tmp_path / "w8"))[5]).read_text()
    one = Path(write_snippets(Layout(16, 1, 1, 0.1), str(tmp_path / "w1"))[5]).read_text()
    assert "# Over nodes" not in one  # a single worker has nothing to spread


def test_gpus_per_node_from_a_points_params_and_in_layout_yaml(tmp_path):
    import yaml

    params = {"micro_batch_size": "16", "accumulation_steps": "1", "num_workers": "12", "lr": "0.1"}
    assert Layout.from_params(params).gpus_per_node is None
    assert Layout.from_params({**params, "gpus_per_node": "None"}).gpus_per_node is None
    layout = Layout.from_params({**params, "gpus_per_node": "8"})
    assert layout.gpus_per_node == 8
    written = yaml.safe_load(Path(write_snippets(layout, str(tmp_path / "g8"))[0]).read_text())
    assert written["gpus_per_node"] == 8 and written["num_workers"] == 12
    unknown = yaml.safe_load(Path(write_snippets(Layout.from_params(params), str(tmp_path / "g"))[0]).read_text())
    assert "gpus_per_node" not in unknown
    with pytest.raises(ValueError, match="gpus_per_node=0 must be a positive integer"):
        Layout(8, 1, 1, 0.1, gpus_per_node=0)
