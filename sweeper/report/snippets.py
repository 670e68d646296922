"""Paste-able answers: the recommended layout written as the settings of the trainers users train
with (Lightning, Hugging Face, DeepSpeed, Ray Train, torchrun). Pure: standard library and PyYAML.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import yaml

from sweeper.plan import PARALLELISMS
from sweeper.report import sharded_snippets as sharded

PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "blocks")
DEVICES = ("gpu", "cpu")
# Lightning 2.x Trainer(precision=...) per sweeper precision: autocast with fp32 weights, as measured.
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
# Hugging Face TrainingArguments(optim=...) names; an optimizer without one is left to the user.
HF_OPTIM = {"sgd": "sgd", "adamw": "adamw_torch"}
# DeepSpeed's own optimizers by its config names; SGD is not one: pass torch's to deepspeed.initialize.
DEEPSPEED_OPTIMIZER = {"adamw": "AdamW"}


@dataclass(frozen=True)
class Layout:
    """The layout to train with: per-device micro-batch, accumulation, data-parallel workers and
    the recipe the sweep measured it in. `device`: what the sweep measured on (gpu or cpu)."""

    micro_batch_size: int
    accumulation_steps: int
    num_workers: int
    lr: float
    optimizer: str = "sgd"
    precision: str = "fp32"
    activation_checkpointing: str = "none"
    device: str = "gpu"
    key: Optional[str] = None  # the point's key, e.g. mb64-acc2-w2, named in each file's header
    parallelism: str = "ddp"  # ddp | zero2 | zero3 (FSDP2), as measured
    gradient_sync: str = "final"  # final | every: how accumulation reduced, as the worker did it

    def __post_init__(self) -> None:
        for name, allowed in (("precision", PRECISIONS), ("activation_checkpointing", CHECKPOINTING),
                              ("device", DEVICES), ("parallelism", PARALLELISMS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid. Should be one of {list(allowed)}.")
        for name in ("micro_batch_size", "accumulation_steps", "num_workers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive integer")

    @property
    def sharded(self) -> bool:
        return self.parallelism in sharded.SHARDED

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.accumulation_steps * self.num_workers

    @classmethod
    def from_params(cls, params: Mapping[str, Any], device: str = "gpu") -> "Layout":
        """From a point's recorded params (an MLflow child run's: numbers may be strings)."""
        def given(name: str, default: str) -> str:
            # A sweep from before the recipe axes records none of them (or YAML's null): its defaults.
            value = params.get(name)
            return default if value in (None, "None", "") else str(value)

        return cls(
            micro_batch_size=int(params["micro_batch_size"]), accumulation_steps=int(params["accumulation_steps"]),
            num_workers=int(params["num_workers"]), lr=float(params["lr"]),
            optimizer=given("optimizer", "sgd"), precision=given("precision", "fp32"),
            activation_checkpointing=given("activation_checkpointing", "none"), device=device,
            key=params.get("key") or params.get("trial_key"),
            # A sweep from before the parallelism axis recorded none: it measured DDP.
            parallelism=given("parallelism", "ddp"),
            # `none` (one DDP worker reduces nothing) and records before the axis: final
            gradient_sync="every" if params.get("gradient_sync") == "every" else "final",
        )


def write_snippets(layout: Layout, folder: str, elastic: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Write one ready-to-use file per trainer into `folder` (created if missing); the paths written,
    in this order: layout.yaml, lightning_trainer.py, hf_training_arguments.py, deepspeed_config.json,
    ray_train.py, torchrun.sh, (a sharded layout's) torchtitan.toml, README.md. `elastic`: the
    recommendation's elastic plan (report.elastic.plan), written into ray_train.py when it spans workers."""
    os.makedirs(folder, exist_ok=True)
    writers: Dict[str, Callable[[Layout], str]] = {
        "layout.yaml": _layout_yaml, "lightning_trainer.py": lightning, "hf_training_arguments.py": hugging_face,
        "deepspeed_config.json": deepspeed_json, "ray_train.py": lambda lay: ray_train(lay, elastic),
        "torchrun.sh": torchrun,
    }
    if layout.sharded:
        writers["torchtitan.toml"] = lambda lay: sharded.torchtitan_toml(lay, _header(lay))
    writers["README.md"] = _readme
    paths = []
    for name, write in writers.items():
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(write(layout))
        paths.append(path)
    return paths


def write_from_recommendation(recommendation_yaml: str, folder: str, use_gpu: bool) -> List[str]:
    """The snippets of a report's `recommendation.yaml` (its text): its `recommendation` section is
    the chosen point's layout, its `elastic_plan` (when there is one) goes into the Ray Train file.
    `use_gpu`: what the sweep ran on (the parent run's param `use_gpu`).
    [] when nothing was recommended (no eligible point)."""
    doc = yaml.safe_load(recommendation_yaml) or {}
    chosen = doc.get("recommendation")
    if not chosen or chosen.get("lr") in (None, "None"):
        return []  # nothing recommended, or a point that recorded no LR to put in the snippets
    return write_snippets(Layout.from_params(chosen, device="gpu" if use_gpu else "cpu"), folder,
                          doc.get("elastic_plan"))


def _header(layout: Layout, marker: str = "#") -> str:
    """Two comment lines: the layout and its recipe (three for a sharded layout: its sharding)."""
    what = f" {layout.key}" if layout.key else ""
    return (f"{marker} sweeper's recommended layout{what}: global batch {layout.global_batch_size} = micro-batch "
            f"{layout.micro_batch_size} x accumulation {layout.accumulation_steps} x {layout.num_workers} worker(s)\n"
            f"{marker} recipe: {layout.precision}, activation checkpointing {layout.activation_checkpointing}, "
            f"{layout.optimizer} lr {layout.lr!r}, measured on {layout.device}\n"
            + (sharded.header_line(layout.parallelism, marker) if layout.sharded else ""))


def _layout_yaml(layout: Layout) -> str:
    fields = asdict(layout)
    if not layout.sharded:
        del fields["parallelism"]  # a DDP layout's file as before the axis
    if layout.gradient_sync == "final":
        del fields["gradient_sync"]  # the default: the file as before the axis
    return yaml.safe_dump({**fields, "global_batch_size": layout.global_batch_size}, sort_keys=False)


def lightning(layout: Layout) -> str:
    """Lightning 2.x: the Trainer's arguments and the DataLoader's per-device batch size."""
    gpu = layout.device == "gpu"
    if layout.sharded:
        return _header(layout) + sharded.lightning(layout, "gpu" if gpu else "cpu",
                                                   LIGHTNING_PRECISION[layout.precision])
    strategy = "ddp" if layout.num_workers > 1 else "auto"
    checkpointing = (
        "# Activation checkpointing (measured with it): wrap each block's forward in\n"
        "# torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) inside your LightningModule.\n"
        if layout.activation_checkpointing == "blocks" else "")
    return (
        _header(layout)
        + "import lightning as L\nfrom torch.utils.data import DataLoader\n\n"
        + "# Per device (each of the Trainer's devices): the micro-batch.\n"
        + f"train_loader = DataLoader(train_dataset, batch_size={layout.micro_batch_size}, shuffle=True, "
        + "drop_last=True)\n"
        + "trainer = L.Trainer(\n"
        + f"    accelerator={'gpu' if gpu else 'cpu'!r},\n"
        + f"    devices={layout.num_workers},  # over several nodes: devices per node and num_nodes=N\n"
        + f"    strategy={strategy!r},\n"
        + f"    accumulate_grad_batches={layout.accumulation_steps},\n"
        + f"    precision={LIGHTNING_PRECISION[layout.precision]!r},\n"
        + ")\n"
        + checkpointing
        + f"# In configure_optimizers: {layout.optimizer} with lr={layout.lr!r} (scaled to this global batch).\n"
    )


def hugging_face(layout: Layout) -> str:
    """Hugging Face transformers: TrainingArguments (launch with torchrun for several workers); a sharded
    layout as transformers 5's `fsdp=True` and `fsdp_config` (FSDP2)."""
    lines = [
        'output_dir="out"',
        f"per_device_train_batch_size={layout.micro_batch_size}",
        f"gradient_accumulation_steps={layout.accumulation_steps}",
        f"learning_rate={layout.lr!r}",
        f"bf16={layout.precision == 'bf16'}",
        f"fp16={layout.precision == 'fp16'}",
        # Sharded: FSDP's own activation checkpointing (in fsdp_config) instead.
        f"gradient_checkpointing={layout.activation_checkpointing == 'blocks' and not layout.sharded}",
    ]
    if layout.optimizer in HF_OPTIM:
        lines.append(f"optim={HF_OPTIM[layout.optimizer]!r}")
    if layout.device == "cpu":
        lines.append("use_cpu=True")
    if layout.sharded:
        lines += ["fsdp=True", f"fsdp_config={sharded.fsdp_config(layout)!r}"]
    body = "".join(f"    {line},\n" for line in lines)
    launch = (f"# {layout.num_workers} workers: torchrun --nproc_per_node={layout.num_workers} your_train.py "
              "(one process per device; Trainer reads the world size)\n")
    return (_header(layout) + "from transformers import TrainingArguments\n\n"
            + f"args = TrainingArguments(\n{body})\n" + launch)


def deepspeed_config(layout: Layout) -> Dict[str, Any]:
    """DeepSpeed's config: its batch identity train_batch_size = micro x accumulation x world size; a
    sharded layout's ZeRO stage."""
    config: Dict[str, Any] = {
        "train_batch_size": layout.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.accumulation_steps,
        "bf16": {"enabled": layout.precision == "bf16"},
        # loss_scale 0: dynamic loss scaling, as sweeper's fp16 points ran with a GradScaler.
        "fp16": {"enabled": layout.precision == "fp16", "loss_scale": 0},
    }
    if layout.optimizer in DEEPSPEED_OPTIMIZER:
        config["optimizer"] = {"type": DEEPSPEED_OPTIMIZER[layout.optimizer], "params": {"lr": layout.lr}}
    if layout.sharded:
        config["zero_optimization"] = sharded.deepspeed_zero(layout)
        if layout.optimizer not in DEEPSPEED_OPTIMIZER:
            # deepspeed.initialize refuses a ZeRO stage with torch's SGD ("an untested ZeRO Optimizer")
            # unless told; sweeper measured exactly that optimizer on the shards.
            config["zero_allow_untested_optimizer"] = True
    return config


def deepspeed_json(layout: Layout) -> str:
    return json.dumps(deepspeed_config(layout), indent=2) + "\n"


def ray_train(layout: Layout, elastic: Optional[Mapping[str, Any]] = None) -> str:
    """Ray Train: ScalingConfig and the train loop's config (its loop reads them); a sharded layout's
    `shard_model`; with an elastic plan over more than one worker count, ScalingConfig(num_workers=(min, max))
    and the micro-batch and accumulation for each world size."""
    config = {
        "micro_batch_size": layout.micro_batch_size, "accumulation_steps": layout.accumulation_steps,
        "lr": layout.lr, "optimizer": layout.optimizer, "precision": layout.precision,
        "activation_checkpointing": layout.activation_checkpointing,
    }
    if layout.sharded:
        config["parallelism"] = layout.parallelism
    span = (elastic or {}).get("num_workers")
    workers = f"({span[0]}, {span[1]})" if span else f"{layout.num_workers}"
    return (
        _header(layout)
        + "from ray.train import ScalingConfig\nfrom ray.train.torch import TorchTrainer\n"
        + (sharded.RAY_TRAIN_IMPORTS if layout.sharded else "") + "\n"
        + (_elastic_lines(elastic, layout.global_batch_size) if span else "")
        + f"scaling_config = ScalingConfig(num_workers={workers}, use_gpu={layout.device == 'gpu'})\n"
        + f"train_loop_config = {config!r}\n"
        + "# In train_loop_per_worker(config): DataLoader(batch_size=config['micro_batch_size']) per worker,\n"
        + ("# one optimizer step every config['accumulation_steps'] micro-batches (see shard_model below).\n"
           if layout.sharded else
           "# one optimizer step every config['accumulation_steps'] micro-batches (no_sync() on the others).\n")
        + "trainer = TorchTrainer(train_loop_per_worker, train_loop_config=train_loop_config,\n"
        + "                       scaling_config=scaling_config)\n"
        + (sharded.ray_train_shard(layout) if layout.sharded else "")
        + (_ELASTIC_LOOKUP if span else "")
    )


def _elastic_lines(elastic: Mapping[str, Any], global_batch_size: int) -> str:
    """ELASTIC_PLAN: world size -> the micro-batch and accumulation that keep the global batch, and what
    sweeper measured (or predicted, between measured worker counts) for them."""
    low, high = elastic["num_workers"]
    rows: Sequence[Mapping[str, Any]] = [r for r in elastic["rows"] if r.get("micro_batch_size")]
    entries = "".join(
        f"    {int(r['num_workers'])}: {{'micro_batch_size': {int(r['micro_batch_size'])}, "
        f"'accumulation_steps': {int(r['accumulation_steps'])}, 'samples_per_second': "
        f"{_rounded(r.get('samples_per_second'))}, 'source': {r['source']!r}}},  # {r.get('why', '')}\n"
        for r in rows)
    return (f"# Elastic: Ray Train resizes this run between {low} and {high} workers and leaves the global batch to\n"
            f"# you: at each world size, this micro-batch x accumulation keeps global batch {global_batch_size} and "
            "fits memory.\n# 'measured': a point the sweep ran; 'predicted': between measured worker counts, not run.\n"
            f"ELASTIC_PLAN = {{\n{entries}}}\n")


def _rounded(value: Any) -> str:
    return "None" if value is None else repr(round(float(value), 1))


_ELASTIC_LOOKUP = (
    "\n\ndef layout_for_world_size():\n"
    "    \"\"\"In train_loop_per_worker, at every (re)start: this run's micro-batch and accumulation at the world\n"
    "    size Ray Train started it with (an elastic run restarts from its last checkpoint when resized).\"\"\"\n"
    "    import ray.train\n\n"
    "    world_size = ray.train.get_context().get_world_size()\n"
    "    if world_size not in ELASTIC_PLAN:\n"
    "        raise RuntimeError(f\"no layout keeps the global batch at {world_size} workers: \"\n"
    "                           f\"{sorted(ELASTIC_PLAN)}\")\n"
    "    return ELASTIC_PLAN[world_size]\n"
)


def torchrun_argv(layout: Layout) -> List[str]:
    """torchrun's own arguments, then your script's (named as sweeper's keys: rename to yours)."""
    return [
        "torchrun", "--nnodes=1", f"--nproc_per_node={layout.num_workers}", "your_train.py",
        f"--micro-batch-size={layout.micro_batch_size}", f"--accumulation-steps={layout.accumulation_steps}",
        f"--lr={layout.lr!r}", f"--optimizer={layout.optimizer}", f"--precision={layout.precision}",
        f"--activation-checkpointing={layout.activation_checkpointing}",
    ]


def torchrun(layout: Layout) -> str:
    return ("#!/bin/sh\n" + _header(layout) + "# One process per worker; your_train.py's flags are placeholders "
            "for your own script's.\n" + shlex.join(torchrun_argv(layout)) + "\n")


def _readme(layout: Layout) -> str:
    return (
        "# Train with this layout\n\n" + _header(layout, "-")
        + "\nThe same layout for the trainer you use. The micro-batch is per device (per worker); the\n"
        + "global batch counts every worker and accumulation step. The learning rate is the one the sweep\n"
        + "trained this point with (already scaled to its global batch).\n\n"
        + "| file | for |\n| --- | --- |\n"
        + "| `layout.yaml` | the layout itself |\n"
        + "| `lightning_trainer.py` | Lightning `Trainer(...)` and the `DataLoader` batch size |\n"
        + "| `hf_training_arguments.py` | Hugging Face `TrainingArguments(...)` |\n"
        + "| `deepspeed_config.json` | DeepSpeed config (`deepspeed.initialize(config=...)`); SGD is not a DeepSpeed "
        + "optimizer: pass `optimizer=torch.optim.SGD(...)` to `deepspeed.initialize` |\n"
        + "| `ray_train.py` | Ray Train `ScalingConfig` and `train_loop_config` |\n"
        + "| `torchrun.sh` | the torchrun command line |\n"
        + (_SHARDED_README if layout.sharded else "")
    )


_SHARDED_README = (
    "| `torchtitan.toml` | torchtitan's `[training]`, `[parallelism]` and `[activation_checkpoint]` |\n"
    "\nSharded: Lightning's `ModelParallelStrategy` with `fully_shard` in `configure_model`, Hugging Face's\n"
    "`fsdp=True` with `fsdp_config` (FSDP2), DeepSpeed's `zero_optimization.stage` (its stage 2 keeps whole\n"
    "weights between steps; FSDP2's zero2 shards them too), torchtitan's `fsdp_reshard_after_forward`, and\n"
    "Ray Train's `shard_model` (FSDP2's `fully_shard` per block, then the root).\n"
)
