"""Paste-able answers: the recommended layout and the recipe it was measured with (report.recipe_snippets)
written as the settings of the trainers users train with (Lightning, Hugging Face, DeepSpeed, Ray Train,
torchrun; torchtitan for a sharded layout). Pure: standard library and PyYAML.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from sweeper.plan import PARALLELISMS
from sweeper.report import recipe_snippets as recipes
from sweeper.report import sharded_snippets as sharded
from sweeper.report.recipe_snippets import Recipe

PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "blocks")
DEVICES = ("gpu", "cpu")
# Lightning 2.x Trainer(precision=...) per sweeper precision: autocast with fp32 weights, as measured.
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
# How a sharded layout's accumulation reduced: once at the last micro-step, holding unsharded gradients (final),
# or a reduce-scatter at every micro-step (every). The param gradient_sync records it; any other value: final.
GRADIENT_SYNCS = ("final", "every")


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
    parallelism: str = "ddp"  # ddp | zero1 | zero2 | zero3 | hsdp (plan.PARALLELISMS), as measured
    # GPUs per node where it was measured: torchrun's nodes. None (not recorded): every worker on one node.
    gpus_per_node: Optional[int] = None
    recipe: Recipe = field(default_factory=Recipe)
    gradient_sync: str = "final"
    context: Optional[int] = None  # a language model's tokens per sample (torchtitan's seq_len)

    def __post_init__(self) -> None:
        for name, allowed in (("precision", PRECISIONS), ("activation_checkpointing", CHECKPOINTING),
                              ("device", DEVICES), ("parallelism", PARALLELISMS), ("gradient_sync", GRADIENT_SYNCS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid. Should be one of {list(allowed)}.")
        for name in ("micro_batch_size", "accumulation_steps", "num_workers", "gpus_per_node"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive integer")

    @property
    def sharded(self) -> bool:
        return self.parallelism in sharded.SHARDED

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.accumulation_steps * self.num_workers

    @classmethod
    def from_params(cls, params: Mapping[str, Any], device: str = "gpu") -> "Layout":
        """From a point's recorded params (an MLflow child run's: numbers may be strings), its recipe's too."""
        def given(name: str, default: str) -> str:
            # A sweep from before the recipe axes records none of them (or YAML's null): its defaults.
            value = params.get(name)
            return default if value in (None, "None", "") else str(value)

        micro, accumulation, workers = (int(params[n]) for n in ("micro_batch_size", "accumulation_steps",
                                                                  "num_workers"))
        context = given("context", "")
        return cls(
            micro_batch_size=micro, accumulation_steps=accumulation, num_workers=workers, lr=float(params["lr"]),
            optimizer=given("optimizer", "sgd"), precision=given("precision", "fp32"),
            activation_checkpointing=given("activation_checkpointing", "none"), device=device,
            key=params.get("key") or params.get("trial_key"),
            # A sweep from before the parallelism axis recorded none: it measured DDP.
            parallelism=given("parallelism", "ddp"),
            gpus_per_node=int(given("gpus_per_node", "0")) or None,  # a sweep that recorded none: unknown
            recipe=Recipe.from_params(params, micro * accumulation * workers),
            # Today's workers reduce once at the last micro-step ("set_requires_gradient_sync", "no_sync").
            gradient_sync="every" if given("gradient_sync", "") == "every" else "final",
            context=int(context) if context else None,
        )


def write_snippets(layout: Layout, folder: str, elastic: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Write one ready-to-use file per trainer into `folder` (created if missing); the paths written,
    in this order: layout.yaml, measured_recipe.py, lightning_trainer.py, hf_training_arguments.py,
    deepspeed_config.json, deepspeed_initialize.py, ray_train.py, torchrun.sh, (a sharded layout's)
    torchtitan.toml, README.md. `elastic`: the recommendation's elastic plan (report.elastic.plan), written into
    ray_train.py when it spans workers."""
    os.makedirs(folder, exist_ok=True)
    writers: Dict[str, Callable[[Layout], str]] = {
        "layout.yaml": _layout_yaml, "measured_recipe.py": measured_recipe, "lightning_trainer.py": lightning,
        "hf_training_arguments.py": hugging_face, "deepspeed_config.json": deepspeed_json,
        "deepspeed_initialize.py": deepspeed_initialize, "ray_train.py": lambda lay: ray_train(lay, elastic),
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


def write_from_recommendation(recommendation_yaml: str, folder: str, use_gpu: bool,
                              point_params: Optional[Mapping[str, Any]] = None) -> List[str]:
    """The snippets of a report's `recommendation.yaml` (its text): its `recommendation` section is
    the chosen point's layout, its `elastic_plan` (when there is one) goes into the Ray Train file.
    `use_gpu`: what the sweep ran on (the parent run's param `use_gpu`). `point_params`: the chosen point's
    own record (its MLflow child run's params and metrics), whose recipe keys the section does not carry.
    [] when nothing was recommended (no eligible point)."""
    doc = yaml.safe_load(recommendation_yaml) or {}
    chosen = doc.get("recommendation")
    if not chosen or chosen.get("lr") in (None, "None"):
        return []  # nothing recommended, or a point that recorded no LR to put in the snippets
    params = {**(point_params or {}), **{k: v for k, v in chosen.items() if v is not None}}
    return write_snippets(Layout.from_params(params, device="gpu" if use_gpu else "cpu"), folder,
                          doc.get("elastic_plan"))


def _header(layout: Layout, marker: str = "#") -> str:
    """Three comment lines: the layout, its precision and LR, its optimizer and schedule (four for a layout
    other than ddp: its sharding)."""
    what = f" {layout.key}" if layout.key else ""
    return (f"{marker} sweeper's recommended layout{what}: global batch {layout.global_batch_size} = micro-batch "
            f"{layout.micro_batch_size} x accumulation {layout.accumulation_steps} x {layout.num_workers} worker(s)\n"
            f"{marker} recipe: {layout.precision}, activation checkpointing {layout.activation_checkpointing}, "
            f"{layout.optimizer} lr {layout.lr!r}, measured on {layout.device}\n"
            f"{marker} optimizer: {layout.recipe.summary(layout.optimizer)}\n"
            + (sharded.header_line(layout.parallelism, marker) if layout.parallelism != "ddp" else ""))


def _layout_yaml(layout: Layout) -> str:
    # gpus_per_node only when recorded: the file as before it was otherwise
    plain = {f.name: getattr(layout, f.name) for f in fields(layout)
             if f.name != "recipe" and not (f.name == "gpus_per_node" and layout.gpus_per_node is None)}
    recipe = {f.name: (list(v) if isinstance(v, tuple) else v)
              for f in fields(Recipe) for v in [getattr(layout.recipe, f.name)]}
    return yaml.safe_dump({**plain, "global_batch_size": layout.global_batch_size, "recipe": recipe},
                          sort_keys=False)


def measured_recipe(layout: Layout) -> str:
    return recipes.python_module(layout.recipe, layout.optimizer, layout.lr, _header(layout))


def _lightning_recipe(layout: Layout) -> List[str]:
    """The Trainer's keywords for the recipe: clipping (Lightning's None: none) and, for a decaying schedule,
    the budget it spans (max_steps counts optimizer steps)."""
    clip = layout.recipe.grad_clip_norm
    lines = ([f"    gradient_clip_val={clip!r},\n", "    gradient_clip_algorithm='norm',\n"] if clip is not None
             else ["    gradient_clip_val=None,  # no clipping, as measured\n"])
    steps = layout.recipe.total_steps
    if layout.recipe.decays and steps:
        lines.append(f"    max_steps={int(steps)},  # the measured budget: the decay spans it\n")
    return lines


LIGHTNING_OPTIMIZERS = (
    "\n\n# A method of your LightningModule: the measured optimizer (its parameter groups spare NO_DECAY) and\n"
    "# schedule, stepped after every optimizer step.\n"
    "def configure_optimizers(self):\n"
    "    optimizer = measured_recipe.build_optimizer(self)\n"
    "    scheduler = measured_recipe.build_scheduler(optimizer)\n"
    "    return {\"optimizer\": optimizer, \"lr_scheduler\": {\"scheduler\": scheduler, \"interval\": \"step\"}}\n"
)


def lightning(layout: Layout) -> str:
    """Lightning 2.x: the Trainer's arguments, the DataLoader's per-device batch size and configure_optimizers."""
    gpu = layout.device == "gpu"
    if layout.sharded:
        return _header(layout) + sharded.lightning(layout, "gpu" if gpu else "cpu",
                                                   LIGHTNING_PRECISION[layout.precision],
                                                   _lightning_recipe(layout), LIGHTNING_OPTIMIZERS)
    strategy = "ddp" if layout.num_workers > 1 else "auto"
    checkpointing = (
        "# Activation checkpointing (measured with it): wrap each block's forward in\n"
        "# torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) inside your LightningModule.\n"
        if layout.activation_checkpointing == "blocks" else "")
    return (
        _header(layout)
        + "import lightning as L\nfrom torch.utils.data import DataLoader\n\nimport measured_recipe\n\n"
        + "# Per device (each of the Trainer's devices): the micro-batch.\n"
        + f"train_loader = DataLoader(train_dataset, batch_size={layout.micro_batch_size}, shuffle=True, "
        + "drop_last=True)\n"
        + "trainer = L.Trainer(\n"
        + f"    accelerator={'gpu' if gpu else 'cpu'!r},\n"
        + f"    devices={layout.num_workers},  # over several nodes: devices per node and num_nodes=N\n"
        + f"    strategy={strategy!r},\n"
        + f"    accumulate_grad_batches={layout.accumulation_steps},\n"
        + f"    precision={LIGHTNING_PRECISION[layout.precision]!r},\n"
        + "".join(_lightning_recipe(layout))
        + ")\n"
        + checkpointing
        + LIGHTNING_OPTIMIZERS
    )


def hugging_face(layout: Layout) -> str:
    """Hugging Face transformers 5: TrainingArguments with the recipe (launch with torchrun for several
    workers), a sharded layout as `fsdp=True` and `fsdp_config` (FSDP2); MeasuredTrainer sets the measured
    schedule and weight-decay groups where transformers' own differ."""
    lines = [
        'output_dir="out"',
        f"per_device_train_batch_size={layout.micro_batch_size}",
        f"gradient_accumulation_steps={layout.accumulation_steps}",
        f"learning_rate={layout.lr!r}",
        *recipes.hf_arguments(layout.recipe, layout.optimizer),
        f"bf16={layout.precision == 'bf16'}",
        f"fp16={layout.precision == 'fp16'}",
        # transformers 5 renamed gradient_checkpointing; sharded: FSDP's own (in fsdp_config) instead.
        f"activation_checkpointing={layout.activation_checkpointing == 'blocks' and not layout.sharded}",
    ]
    if layout.device == "cpu":
        lines.append("use_cpu=True")
    if layout.sharded:
        lines += ["fsdp=True", f"fsdp_config={sharded.fsdp_config(layout)!r}"]
    body = "".join(f"    {_keyword(line)}\n" for line in lines)
    if layout.optimizer not in recipes.HF_OPTIM:
        body += f"    # optim: {layout.optimizer} is your own: pass it as Trainer(optimizers=(optimizer, None))\n"
    launch = (f"# {layout.num_workers} workers: torchrun --nproc_per_node={layout.num_workers} your_train.py "
              "(one process per device; Trainer reads the world size)\n")
    return (_header(layout) + "from transformers import Trainer, TrainingArguments\n\nimport measured_recipe\n\n"
            + f"args = TrainingArguments(\n{body})\n" + launch + _HF_TRAINER)


def _keyword(line: str) -> str:
    """`name=value,` for a call's argument list, its comment (`  # ...`) after the comma."""
    code, _, comment = line.partition("  # ")
    return f"{code},  # {comment}" if comment else f"{code},"


_HF_TRAINER = '''
# With a plain Trainer, these arguments give transformers' own schedule (its warm-up one step behind the measured
# one: its step k at k / warmup_steps, the first at LR 0; its warmup_stable_decay's warm-up starts at min_lr_ratio)
# and its own weight-decay exclusions (biases, nn.LayerNorm modules, names holding layernorm, rmsnorm, a "norm"
# part or "_norm": not a BatchNorm named e.g. "bn1", nor a norm class of your own; every bias even with an empty
# NO_DECAY). MeasuredTrainer(model=..., args=args, ...) trains with the measured ones.


class MeasuredTrainer(Trainer):
    def get_decay_parameter_names(self, model):
        return measured_recipe.decayed_names(model)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = measured_recipe.build_scheduler(optimizer or self.optimizer)
            self._created_lr_scheduler = True
        return self.lr_scheduler
'''


def deepspeed_config(layout: Layout) -> Dict[str, Any]:
    """DeepSpeed's config: its batch identity train_batch_size = micro x accumulation x world size, the recipe's
    clipping and optimizer (report.recipe_snippets.deepspeed_keys), a sharded layout's ZeRO stage."""
    config: Dict[str, Any] = {
        "train_batch_size": layout.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.accumulation_steps,
        "bf16": {"enabled": layout.precision == "bf16"},
        # loss_scale 0: dynamic loss scaling, as sweeper's fp16 points ran with a GradScaler.
        "fp16": {"enabled": layout.precision == "fp16", "loss_scale": 0},
        **recipes.deepspeed_keys(layout.recipe, layout.optimizer, layout.lr, layout.parallelism != "ddp"),
    }
    if layout.parallelism != "ddp":  # zero1 too: DeepSpeed's stage 1
        config["zero_optimization"] = sharded.deepspeed_zero(layout)
    return config


def deepspeed_json(layout: Layout) -> str:
    return json.dumps(deepspeed_config(layout), indent=2) + "\n"


def deepspeed_initialize(layout: Layout) -> str:
    """What the JSON cannot hold: the parameter groups that spare NO_DECAY, torch's optimizer where DeepSpeed
    has none of its own, and the measured schedule (DeepSpeed's WarmupLR family starts its warm-up at LR 0)."""
    own = layout.optimizer in recipes.DEEPSPEED_OPTIMIZER
    optimizer = ("    model_parameters=measured_recipe.param_groups(model),  # its AdamW (the JSON's) on these groups\n"
                 if own else
                 f"    optimizer=measured_recipe.build_optimizer(model),  # {layout.optimizer}: not a DeepSpeed "
                 "optimizer\n")
    return (_header(layout) + "import deepspeed\n\nimport measured_recipe\n\n"
            "# model: your torch.nn.Module; launch with the deepspeed launcher or torchrun (one process per device).\n"
            "engine, optimizer, _, scheduler = deepspeed.initialize(\n"
            "    model=model,\n    config=\"deepspeed_config.json\",\n" + optimizer
            + "    lr_scheduler=measured_recipe.build_scheduler,  # called with the optimizer; steps at each "
            "optimizer step\n)\n")


def ray_train(layout: Layout, elastic: Optional[Mapping[str, Any]] = None) -> str:
    """Ray Train: ScalingConfig and the train loop's config (its loop reads them); `prepare(model)` puts the
    model on the worker's device (ray.train.torch.get_device) and wraps or shards it; with an elastic plan over
    more than one worker count, ScalingConfig(num_workers=(min, max)) and the layout at each world size."""
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
        + "import ray.train.torch\nfrom ray.train import ScalingConfig\nfrom ray.train.torch import TorchTrainer\n"
        + (sharded.RAY_TRAIN_IMPORTS if layout.sharded else "") + "\nimport measured_recipe\n\n"
        + (_elastic_lines(elastic, layout.global_batch_size) if span else "")
        + f"scaling_config = ScalingConfig(num_workers={workers}, use_gpu={layout.device == 'gpu'})\n"
        + f"train_loop_config = {config!r}\n"
        + "# In train_loop_per_worker(config): ray.train.torch.prepare_data_loader(DataLoader(dataset,\n"
        + "# batch_size=config['micro_batch_size'])) per worker (its batches on the worker's device);\n"
        + f"# model = {'prepare(your_model, your_model.layers)' if layout.sharded else 'prepare(your_model)'}; "
        + "optimizer = measured_recipe.build_optimizer(model);\n"
        + "# scheduler = measured_recipe.build_scheduler(optimizer); one optimizer step every\n"
        + ("# config['accumulation_steps'] micro-batches (see shard_model below), "
           if layout.sharded else "# config['accumulation_steps'] micro-batches (model.no_sync() on the others), ")
        + "measured_recipe.clip_gradients(\n# model.parameters()) before it and scheduler.step() after it.\n"
        + "trainer = TorchTrainer(train_loop_per_worker, train_loop_config=train_loop_config,\n"
        + "                       scaling_config=scaling_config)\n"
        + (sharded.ray_train_shard(layout) if layout.sharded else _RAY_PREPARE)
        + (_ELASTIC_LOOKUP if span else "")
    )


_RAY_PREPARE = (
    "\n\ndef prepare(model):\n"
    "    \"\"\"In train_loop_per_worker: the model on this worker's device (ray.train.torch.get_device(), which it\n"
    "    also makes the current CUDA device) and wrapped in DDP.\"\"\"\n"
    "    return ray.train.torch.prepare_model(model)\n"
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


def torchrun_nodes(layout: Layout) -> Tuple[int, int]:
    """torchrun's --nnodes and --nproc_per_node: the workers packed onto nodes of `gpus_per_node` GPUs
    as Ray's PACK placed them, ceil(W / G) nodes of min(W, G) workers (12 on 8-GPU nodes: 2 of 8, the
    last running 4, which torchrun.sh says); all on one node when the GPUs per node are unknown."""
    per_node = min(layout.num_workers, layout.gpus_per_node or layout.num_workers)
    return -(-layout.num_workers // per_node), per_node


def torchrun_argv(layout: Layout) -> List[str]:
    """torchrun's own arguments, then your script's (named as sweeper's keys: rename to yours): the layout, then
    the recipe (measured_recipe.py holds the same, built). Over several nodes, one rendezvous at the first node
    (FIRST_NODE: its address) for every node's torchrun."""
    nnodes, per_node = torchrun_nodes(layout)
    rendezvous = ["--rdzv_backend=c10d", "--rdzv_endpoint=FIRST_NODE:29400"] if nnodes > 1 else []
    r = layout.recipe
    optimizer = ([f"--momentum={r.momentum!r}", f"--nesterov={r.nesterov}"] if layout.optimizer == "sgd" else
                 [f"--betas={r.betas[0]!r},{r.betas[1]!r}", f"--eps={r.eps!r}"] if layout.optimizer == "adamw" else [])
    decay = ([f"--min-lr-ratio={r.min_lr_ratio!r}", f"--total-steps={r.total_steps!r}"]
             + ([f"--decay-fraction={r.decay_fraction!r}"] if r.lr_schedule == "wsd" else []) if r.decays else [])
    return [
        "torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={per_node}", *rendezvous, "your_train.py",
        f"--micro-batch-size={layout.micro_batch_size}", f"--accumulation-steps={layout.accumulation_steps}",
        f"--lr={layout.lr!r}", f"--optimizer={layout.optimizer}", *optimizer,
        f"--weight-decay={r.weight_decay!r}", f"--no-decay={','.join(r.no_decay)}",
        f"--lr-schedule={r.lr_schedule}", f"--warmup-steps={r.warmup_steps}", *decay,
        f"--grad-clip-norm={'none' if r.grad_clip_norm is None else repr(r.grad_clip_norm)}",
        f"--precision={layout.precision}", f"--activation-checkpointing={layout.activation_checkpointing}",
    ]


def _torchrun_nodes_comment(layout: Layout) -> str:
    """How to run torchrun.sh over its nodes; with the GPUs per node unknown, how to spread a GPU layout
    over some."""
    nnodes, per_node = torchrun_nodes(layout)
    workers = layout.num_workers
    if layout.gpus_per_node is None:
        return "" if workers == 1 or layout.device == "cpu" else (
            f"# Over nodes of G < {workers} GPUs: --nnodes=ceil({workers}/G) --nproc_per_node=G --rdzv_backend=c10d "
            "--rdzv_endpoint=FIRST_NODE:29400, run on every node.\n")
    if nnodes == 1:
        return ""
    last = workers - per_node * (nnodes - 1)
    uneven = f"# On the last node: --nproc_per_node={last} ({workers} workers = {nnodes - 1} x {per_node} + {last}).\n"
    return (f"# Run it on each of the {nnodes} nodes ({layout.gpus_per_node} GPUs each); FIRST_NODE: the "
            "first's address.\n" + ("" if last == per_node else uneven))


def torchrun(layout: Layout) -> str:
    return ("#!/bin/sh\n" + _header(layout) + "# One process per worker; your_train.py's flags are placeholders "
            "for your own script's\n# (or build the optimizer, schedule and clipping with measured_recipe.py).\n"
            + _torchrun_nodes_comment(layout) + shlex.join(torchrun_argv(layout)) + "\n")


def _readme(layout: Layout) -> str:
    return (
        "# Train with this layout\n\n" + _header(layout, "-")
        + "\nThe same layout and recipe for the trainer you use. The micro-batch is per device (per worker); the\n"
        + "global batch counts every worker and accumulation step. The learning rate is the one the sweep\n"
        + "trained this point with (already scaled to its global batch); the schedule counts optimizer steps of\n"
        + "this global batch. What a trainer cannot set is said in a comment where it would go.\n\n"
        + "| file | for |\n| --- | --- |\n"
        + "| `layout.yaml` | the layout and its recipe |\n"
        + "| `measured_recipe.py` | the recipe in plain PyTorch: optimizer and parameter groups (weight decay and "
        + "its exclusions), LR schedule with warm-up, clipping; the Python files below import it |\n"
        + "| `lightning_trainer.py` | Lightning `Trainer(...)`, the `DataLoader` batch size, `configure_optimizers` |\n"
        + "| `hf_training_arguments.py` | Hugging Face `TrainingArguments(...)` and `MeasuredTrainer` (the measured "
        + "schedule and weight-decay groups) |\n"
        + "| `deepspeed_config.json` | DeepSpeed config: batch, precision, clipping, its AdamW, ZeRO stage |\n"
        + "| `deepspeed_initialize.py` | `deepspeed.initialize(...)` with the parameter groups, torch's SGD (not a "
        + "DeepSpeed optimizer) and the measured schedule |\n"
        + "| `ray_train.py` | Ray Train `ScalingConfig`, `train_loop_config` and `prepare(model)` |\n"
        + "| `torchrun.sh` | the torchrun command line |\n"
        + (_SHARDED_README if layout.sharded else "")
    )


_SHARDED_README = (
    "| `torchtitan.toml` | a torchtitan 0.2 job config (`--job.config_file`) for the layout and recipe |\n"
    "\nSharded: Lightning's `ModelParallelStrategy` with `fully_shard` in `configure_model`, Hugging Face's\n"
    "`fsdp=True` with `fsdp_config` (FSDP2), DeepSpeed's `zero_optimization.stage` (its stage 2 keeps whole\n"
    "weights between steps; FSDP2's zero2 shards them too), torchtitan's `fsdp_reshard_after_forward`, and\n"
    "Ray Train's `shard_model` (FSDP2's `fully_shard` per block, then the root).\n"
)
