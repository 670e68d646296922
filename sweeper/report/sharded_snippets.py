"""The parts of the paste-able answers that name a sharded layout (`zero2`, `zero3`, `hsdp`: FSDP2's `fully_shard`
per block, then the root, as sweeper measured it; `zero1` names itself in the header and DeepSpeed's stage only):
Lightning's strategy and `configure_model`, Hugging Face's `fsdp` arguments, DeepSpeed's ZeRO stage, torchtitan's
TOML and Ray Train's sharding function. Pure (stdlib).

Each trainer's own spelling, read from its source: Lightning's `ModelParallelStrategy` (lightning/pytorch/
strategies/model_parallel.py, 2.4+), transformers 5.24's `fsdp` / `fsdp_config` (training_args.py:
`_process_fsdp_args`), DeepSpeed's `zero_optimization.stage`, torchtitan's `JobConfig` (torchtitan/config/
job_config.py at v0.2.2, the last release that reads TOML: 0.3 takes a Python function returning
`Trainer.Config`, whose sections carry the same fields).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from sweeper.report import recipe_snippets as recipes

SHARDED = ("zero2", "zero3", "hsdp")
# FSDP2's reshard_after_forward for the blocks: zero2 keeps a block's gathered weights from its forward to its
# backward, zero3 (and hsdp, within a node) frees them after forward and gathers again (the root keeps its own).
RESHARD_AFTER_FORWARD = {"zero2": False, "zero3": True, "hsdp": True}
# torchtitan's policy names for the same (parallelism.fsdp_reshard_after_forward).
TORCHTITAN_RESHARD = {"zero2": "never", "zero3": "always", "hsdp": "always"}
# DeepSpeed's nearest stage. Its stage 2 keeps whole weights between steps; FSDP2's zero2 shards them too. hsdp:
# stage 3 sharded within groups of a node's ranks (MiCS, `mics_shard_size`) and replicated across them.
DEEPSPEED_STAGE = {"zero1": 1, "zero2": 2, "zero3": 3, "hsdp": 3}
# torchtitan's training.mixed_precision_param (it has no fp16: sweeper refuses fp16 with sharding too).
TORCHTITAN_PARAM_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}

WHAT = {
    "zero2": "ZeRO-2, FSDP2 fully_shard per block then the root, reshard_after_forward=False",
    "zero3": "ZeRO-3, FSDP2 fully_shard per block then the root, reshard_after_forward=True for the blocks",
    "zero1": "ZeRO-1, DDP with torch's ZeroRedundancyOptimizer (each rank steps its share of the parameters)",
    "hsdp": "HSDP, FSDP2 fully_shard per block then the root on a 2-D mesh (replicate across nodes, shard within "
            "a node), reshard_after_forward=True for the blocks",
}


def mesh_degrees(layout: Any):
    """hsdp's (replicate, shard) degrees: (nodes, ranks per node), the workers packed onto nodes of the layout's
    GPUs per node as sweeper measured them; (1, workers) when those are unknown (one node)."""
    per_node = min(layout.num_workers, layout.gpus_per_node or layout.num_workers)
    return (layout.num_workers // per_node, per_node) if layout.parallelism == "hsdp" else (1, layout.num_workers)


def header_line(parallelism: str, marker: str = "#") -> str:
    return f"{marker} sharding: {parallelism} = {WHAT[parallelism]}\n"


def _policy_lines(precision: str, indent: str) -> List[str]:
    """FSDP2's MixedPrecisionPolicy for bf16 (weights gathered and computed in bf16, gradients reduced in
    fp32, shards and optimizer state fp32, as sweeper's bf16 points ran); nothing for fp32."""
    if precision != "bf16":
        return [f"{indent}policy = MixedPrecisionPolicy()  # fp32: gathered and reduced as stored\n"]
    return [f"{indent}# bf16 as measured: this policy, and torch.autocast(dtype=torch.bfloat16) around forward, loss\n",
            f"{indent}policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"]


def lightning(layout: Any, accelerator: str, precision: str, recipe_lines: Sequence[str], optimizers: str) -> str:
    """Lightning 2.4+: ModelParallelStrategy (FSDP2), the LightningModule's configure_model that shards, its
    configure_optimizers (`optimizers`) and, for accumulation as measured, the gradient sync of each micro-step."""
    p = layout.parallelism
    blocks = RESHARD_AFTER_FORWARD[p]
    lines = [
        "import lightning as L\nimport torch\n",
        "from lightning.pytorch.strategies import ModelParallelStrategy\n",
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n",
        "from torch.utils.data import DataLoader\n\nimport measured_recipe\n\n",
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
        f"    accumulate_grad_batches={layout.accumulation_steps},\n",
        f"    precision={precision!r},\n",
        *recipe_lines,
        ")\n\n\n",
        "# A method of your LightningModule: each repeated block (transformer layer, residual block), then the root.\n",
        "def configure_model(self):\n",
        "    mesh = self.device_mesh[\"data_parallel\"]\n",
        *_policy_lines(layout.precision, "    "),
        "    for block in self.model.layers:  # your model's blocks\n",
        f"        fully_shard(block, mesh=mesh, reshard_after_forward={blocks}, mp_policy=policy)\n",
        *_hsdp_mesh(layout, "    "),
        "    fully_shard(self.model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)\n",
        optimizers,
        _lightning_sync(layout),
        f"\n\n# FSDP1 instead: strategy=FSDPStrategy(sharding_strategy={_fsdp1(p)!r}) "
        "(lightning.pytorch.strategies).\n",
    ]
    if layout.activation_checkpointing == "blocks":
        lines.append("# Activation checkpointing (measured with it): checkpoint each block before fully_shard.\n")
    return "".join(lines)


def _hsdp_mesh(layout: Any, indent: str) -> List[str]:
    """hsdp: the 2-D mesh sweeper sharded over, to pass as every fully_shard's `mesh=` (nothing otherwise)."""
    if layout.parallelism != "hsdp":
        return []
    nodes, per_node = mesh_degrees(layout)
    mesh = f'init_device_mesh("cuda", ({nodes}, {per_node}), mesh_dim_names=("replicate", "shard"))'
    return [f"{indent}# hsdp: pass mesh={mesh} (nodes, devices per node)\n",
            f"{indent}# to every fully_shard above and below (torch.distributed.device_mesh).\n"]


def _lightning_sync(layout: Any) -> str:
    """Lightning's ModelParallelStrategy skips no gradient sync while accumulating (its block_backward_sync
    acts on DDP only): FSDP2 reduce-scatters at every micro-step. Measured `final`: a function that holds the
    unsharded gradients until the last micro-step; measured `every`: Lightning's own behaviour is the one."""
    if layout.accumulation_steps == 1:
        return ""
    if layout.gradient_sync == "every":
        return ("\n# Accumulation as measured (gradient_sync every): Lightning's ModelParallelStrategy reduce-scatters "
                "at every\n# micro-step, sharded gradients held between them.\n")
    return (
        "\n\n# A method of your LightningModule, called first in training_step(self, batch, batch_idx): accumulation "
        "as\n# measured (gradient_sync final), the unsharded gradients held and reduce-scattered once, at the last "
        "micro-step.\n# Without it Lightning's ModelParallelStrategy reduce-scatters at every micro-step (sweeper's "
        "gradient_sync every).\n"
        "def sync_at_last_micro_step(self, batch_idx):\n"
        "    last = ((batch_idx + 1) % self.trainer.accumulate_grad_batches == 0\n"
        "            or batch_idx + 1 == self.trainer.num_training_batches)\n"
        "    self.model.set_requires_gradient_sync(last)\n"
    )


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
    zero: Dict[str, Any] = {"stage": DEEPSPEED_STAGE[layout.parallelism]}
    if layout.parallelism == "hsdp":
        zero["mics_shard_size"] = mesh_degrees(layout)[1]
    return zero


def torchtitan_toml(layout: Any, header: str) -> str:
    """A torchtitan 0.2 job config (`torchtitan --job.config_file torchtitan.toml`; its ConfigManager refuses a
    field it does not know): the per-device and global batch (it derives accumulation), the recipe, FSDP over every
    worker (hsdp: replicated across nodes, sharded within one) with the blocks' reshard policy, activation
    checkpointing and precision. Your model and dataset are torchtitan's registered names (placeholders here);
    what it cannot set is said in a comment."""
    r = layout.recipe
    optimizer, cannot = recipes.torchtitan_sections(r, layout.optimizer, layout.lr)
    steps = r.total_steps
    training = [
        "[training]\n", "dataset = \"c4_test\"  # your dataset's torchtitan name\n",
        f"local_batch_size = {layout.micro_batch_size}\n", f"global_batch_size = {layout.global_batch_size}\n",
        f"seq_len = {layout.context or 2048}{'' if layout.context else '  # your sequence length'}\n",
        # torchtitan always clips (train.py); an infinite norm leaves the gradient as it is.
        f"max_norm = {'inf  # no clipping, as measured' if r.grad_clip_norm is None else repr(r.grad_clip_norm)}\n",
        (f"steps = {int(steps)}  # the measured budget in optimizer steps\n" if steps else
         "# steps: your budget in optimizer steps (the sweep recorded none)\n"),
        f"mixed_precision_param = \"{TORCHTITAN_PARAM_DTYPE.get(layout.precision, 'float32')}\"\n",
        "mixed_precision_reduce = \"float32\"\n",
    ]
    if layout.gradient_sync == "final" and layout.accumulation_steps > 1:
        cannot.append("gradient_sync final: torchtitan reduce-scatters at every micro-step (sweeper's every)")
    return "".join([
        header, "# torchtitan derives gradient accumulation: global_batch_size / (local_batch_size x "
        "data_parallel_shard_degree)\n", *(f"# It cannot set {what}.\n" for what in cannot), "\n",
        "[job]\n", "dump_folder = \"./outputs\"\n", f"description = \"sweeper {layout.key or 'layout'}\"\n\n",
        "[model]\n", "name = \"llama3\"  # your model's torchtitan name (its TrainSpec)\n",
        "flavor = \"debugmodel\"  # and its size\n\n",
        *optimizer, "\n", *training, "\n",
        "[parallelism]\n", f"data_parallel_replicate_degree = {mesh_degrees(layout)[0]}\n",
        f"data_parallel_shard_degree = {mesh_degrees(layout)[1]}\n",
        f"fsdp_reshard_after_forward = \"{TORCHTITAN_RESHARD[layout.parallelism]}\"\n\n",
        "[activation_checkpoint]\n",
        f"mode = \"{'full' if layout.activation_checkpointing == 'blocks' else 'none'}\"\n\n",
        "[checkpoint]\n", "enable = false\n",
    ])


def ray_train_shard(layout: Any) -> str:
    """The functions a Ray Train loop calls to put its model on the worker's device and shard it as sweeper did
    (FSDP2, not prepare_model(parallel_strategy="fsdp"), which is FSDP1), and the accumulation rule under it."""
    blocks = RESHARD_AFTER_FORWARD[layout.parallelism]
    sync = ("# Accumulation as measured (gradient_sync every): a reduce-scatter at every micro-step, FSDP2's default.\n"
            if layout.gradient_sync == "every" else
            "# Accumulation: before each micro-batch,\n"
            "# model.set_requires_gradient_sync(micro_step == accumulation_steps - 1): one reduce-scatter per\n"
            "# optimizer step, the unsharded gradients held until then.\n")
    return "".join([
        "\n\ndef prepare(model, blocks):\n",
        "    \"\"\"In train_loop_per_worker: the model on this worker's device (ray.train.torch.get_device(), made the "
        "current\n    CUDA device: NCCL and FSDP2 run on it), then sharded; before building the optimizer.\"\"\"\n",
        "    device = ray.train.torch.get_device()\n",
        "    if device.type == \"cuda\":\n",
        "        torch.cuda.set_device(device)\n",
        "    return shard_model(model.to(device), blocks)\n",
        "\n\ndef shard_model(model, blocks):\n",
        f"    \"\"\"{layout.parallelism} as sweeper measured it (Ray Train has set up the process group).\"\"\"\n",
        *_policy_lines(layout.precision, "    "),
        "    for block in blocks:  # your model's repeated blocks (transformer layers, residual blocks)\n",
        f"        fully_shard(block, reshard_after_forward={blocks}, mp_policy=policy)\n",
        *_hsdp_mesh(layout, "    "),
        "    fully_shard(model, reshard_after_forward=False, mp_policy=policy)\n",
        "    return model\n\n\n",
        sync,
    ])


RAY_TRAIN_IMPORTS = "import torch\nfrom torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n"
