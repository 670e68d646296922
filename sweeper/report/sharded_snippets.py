"""The parts of the paste-able answers that name a sharded layout (`zero2`, `zero3`: FSDP2's `fully_shard` per
block, then the root, as sweeper measured it): Lightning's strategy and `configure_model`, Hugging Face's
`fsdp` arguments, DeepSpeed's ZeRO stage, torchtitan's TOML and Ray Train's sharding function. Pure (stdlib).

Each trainer's own spelling, read from its source: Lightning's `ModelParallelStrategy` (lightning/pytorch/
strategies/model_parallel.py, 2.4+), transformers 5.24's `fsdp` / `fsdp_config` (training_args.py:
`_process_fsdp_args`), DeepSpeed's `zero_optimization.stage`, torchtitan's `JobConfig` (torchtitan/config/
job_config.py: `[training]`, `[parallelism]`, `[activation_checkpoint]`).
"""

from __future__ import annotations

from typing import Any, Dict, List

SHARDED = ("zero2", "zero3")
# FSDP2's reshard_after_forward for the blocks: zero2 keeps a block's gathered weights from its forward to its
# backward, zero3 frees them after forward and gathers again (the root keeps its own in both).
RESHARD_AFTER_FORWARD = {"zero2": False, "zero3": True}
# torchtitan's policy names for the same (parallelism.fsdp_reshard_after_forward).
TORCHTITAN_RESHARD = {"zero2": "never", "zero3": "always"}
# DeepSpeed's nearest stage. Its stage 2 keeps whole weights between steps; FSDP2's zero2 shards them too.
DEEPSPEED_STAGE = {"zero2": 2, "zero3": 3}
# torchtitan's training.mixed_precision_param (it has no fp16: sweeper refuses fp16 with sharding too).
TORCHTITAN_PARAM_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}
# torchtitan's optimizer names (components/optimizer.py builds Adam and AdamW only).
TORCHTITAN_OPTIMIZER = {"adamw": "AdamW"}

WHAT = {
    "zero2": "ZeRO-2, FSDP2 fully_shard per block then the root, reshard_after_forward=False",
    "zero3": "ZeRO-3, FSDP2 fully_shard per block then the root, reshard_after_forward=True for the blocks",
}


def header_line(parallelism: str, marker: str = "#") -> str:
    return f"{marker} sharding: {parallelism} = {WHAT[parallelism]}\n"


def _policy_lines(precision: str, indent: str) -> List[str]:
    """FSDP2's MixedPrecisionPolicy for bf16 (weights gathered and computed in bf16, gradients reduced in
    fp32, shards and optimizer state fp32, as sweeper's bf16 points ran); nothing for fp32."""
    if precision != "bf16":
        return [f"{indent}policy = MixedPrecisionPolicy()  # fp32: gathered and reduced as stored\n"]
    return [f"{indent}# bf16 as measured: this policy, and torch.autocast(dtype=torch.bfloat16) around forward, loss\n",
            f"{indent}policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"]


def lightning(layout: Any, accelerator: str, precision: str) -> str:
    """Lightning 2.4+: ModelParallelStrategy (FSDP2) and the LightningModule's configure_model that shards."""
    p = layout.parallelism
    blocks = RESHARD_AFTER_FORWARD[p]
    lines = [
        "import lightning as L\nimport torch\n",
        "from lightning.pytorch.strategies import ModelParallelStrategy\n",
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n",
        "from torch.utils.data import DataLoader\n\n",
        "# Per device (each of the Trainer's devices): the micro-batch.\n",
        f"train_loader = DataLoader(train_dataset, batch_size={layout.micro_batch_size}, shuffle=True, "
        "drop_last=True)\n",
        f"# FSDP2 over {layout.num_workers} device(s); your LightningModule shards itself in configure_model "
        "(below).\n",
        f"strategy = ModelParallelStrategy(data_parallel_size={layout.num_workers}, tensor_parallel_size=1)\n",
        "trainer = L.Trainer(\n",
        f"    accelerator={accelerator!r},\n",
        f"    devices={layout.num_workers},  # over several nodes: devices per node and num_nodes=N\n",
        "    strategy=strategy,\n",
        f"    accumulate_grad_batches={layout.accumulation_steps},{_lightning_sync(layout)}\n",
        f"    precision={precision!r},\n",
        ")\n\n\n",
        "# A method of your LightningModule: each repeated block (transformer layer, residual block), then the root.\n",
        "def configure_model(self):\n",
        "    mesh = self.device_mesh[\"data_parallel\"]\n",
        *_policy_lines(layout.precision, "    "),
        "    for block in self.model.layers:  # your model's blocks\n",
        f"        fully_shard(block, mesh=mesh, reshard_after_forward={blocks}, mp_policy=policy)\n",
        "    fully_shard(self.model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)\n\n\n",
        f"# FSDP1 instead: strategy=FSDPStrategy(sharding_strategy={_fsdp1(p)!r}) (lightning.pytorch.strategies).\n",
    ]
    if layout.activation_checkpointing == "blocks":
        lines.append("# Activation checkpointing (measured with it): checkpoint each block before fully_shard.\n")
    return "".join(lines)


def _lightning_sync(layout: Any) -> str:
    """A comment on accumulate_grad_batches: under ModelParallelStrategy Lightning reduces at every micro-batch,
    which is sweeper's `every` sync; a layout measured in `final` held more memory and sent less."""
    if layout.accumulation_steps == 1:
        return ""
    if getattr(layout, "gradient_sync", "final") == "every":
        return "  # reduces every micro-batch: as measured (gradient_sync=every)"
    return ("  # Lightning reduces every micro-batch (sweeper's gradient_sync=every); measured: final, one reduce "
            "per step")


def _fsdp1(parallelism: str) -> str:
    return "SHARD_GRAD_OP" if parallelism == "zero2" else "FULL_SHARD"


def fsdp_config(layout: Any) -> Dict[str, Any]:
    """transformers 5's fsdp_config (with `fsdp=True`): FSDP2, the blocks resharded as measured; activation
    checkpointing as FSDP's own (transformers warns that gradient_checkpointing adds an all-gather)."""
    config: Dict[str, Any] = {"version": 2, "reshard_after_forward": RESHARD_AFTER_FORWARD[layout.parallelism]}
    if layout.activation_checkpointing == "blocks":
        config["activation_checkpointing"] = True
    return config


def deepspeed_zero(layout: Any) -> Dict[str, Any]:
    return {"stage": DEEPSPEED_STAGE[layout.parallelism]}


def torchtitan_toml(layout: Any, header: str) -> str:
    """torchtitan's job config: the per-device batch and the global batch (it derives accumulation from them),
    FSDP over every worker, the blocks' reshard policy, activation checkpointing and precision."""
    lines = [header, "# torchtitan derives gradient accumulation: global_batch_size / (local_batch_size x "
             "data_parallel_shard_degree)\n\n",
             "[training]\n", f"local_batch_size = {layout.micro_batch_size}\n",
             f"global_batch_size = {layout.global_batch_size}\n",
             f"mixed_precision_param = \"{TORCHTITAN_PARAM_DTYPE.get(layout.precision, 'float32')}\"\n",
             "mixed_precision_reduce = \"float32\"\n\n",
             "[parallelism]\n", "data_parallel_replicate_degree = 1\n",
             f"data_parallel_shard_degree = {layout.num_workers}\n",
             f"fsdp_reshard_after_forward = \"{TORCHTITAN_RESHARD[layout.parallelism]}\"\n\n",
             "[activation_checkpoint]\n",
             f"mode = \"{'full' if layout.activation_checkpointing == 'blocks' else 'none'}\"\n"]
    if layout.optimizer in TORCHTITAN_OPTIMIZER:
        lines += ["\n[optimizer]\n", f"name = \"{TORCHTITAN_OPTIMIZER[layout.optimizer]}\"\n", f"lr = {layout.lr!r}\n"]
    else:
        lines.append(f"# optimizer: {layout.optimizer} lr {layout.lr!r} is not one of torchtitan's (Adam, AdamW)\n")
    return "".join(lines)


def ray_train_shard(layout: Any) -> str:
    """The function a Ray Train loop calls to shard its model as sweeper did (FSDP2, not
    prepare_model(parallel_strategy="fsdp"), which is FSDP1), and the accumulation rule under it."""
    blocks = RESHARD_AFTER_FORWARD[layout.parallelism]
    return "".join([
        "\n\ndef shard_model(model, blocks):\n",
        f"    \"\"\"{layout.parallelism} as sweeper measured it. In train_loop_per_worker, after building the model "
        "(Ray Train\n    has set up the process group) and before building the optimizer; instead of "
        "prepare_model.\"\"\"\n",
        "    if torch.cuda.is_available():  # FSDP2 builds its mesh on the current device: this worker's GPU\n",
        "        import ray.train.torch\n\n",
        "        torch.cuda.set_device(ray.train.torch.get_device())\n",
        *_policy_lines(layout.precision, "    "),
        "    for block in blocks:  # your model's repeated blocks (transformer layers, residual blocks)\n",
        f"        fully_shard(block, reshard_after_forward={blocks}, mp_policy=policy)\n",
        "    fully_shard(model, reshard_after_forward=False, mp_policy=policy)\n",
        "    return model\n\n\n",
        *_ray_train_sync(layout),
    ])


def _ray_train_sync(layout: Any) -> List[str]:
    """How the loop accumulates, as the worker did it (gradient_sync)."""
    if getattr(layout, "gradient_sync", "final") == "every":
        return ["# Accumulation as measured (gradient_sync=every): leave the gradient sync on; each micro-batch's\n",
                "# backward reduce-scatters, only the gradient shards are held.\n"]
    return ["# Accumulation as measured (gradient_sync=final): before each micro-batch,\n",
            "# model.set_requires_gradient_sync(micro_step == accumulation_steps - 1): one reduce-scatter per\n",
            "# optimizer step, the unsharded gradients held until then.\n"]


RAY_TRAIN_IMPORTS = "import torch\nfrom torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n"
