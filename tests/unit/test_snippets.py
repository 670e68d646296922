"""The paste-able answers: each trainer's settings are the recommended layout and the recipe its point recorded
(optimizer with its momentum or betas and eps, weight decay and the parameters it spares, the LR schedule after its
warm-up, clipping), checked against the point's params and built by the trainers' own classes: transformers'
TrainingArguments and Trainer (its optimizer and scheduler on a tiny model), a Lightning Trainer that trains a few
steps, DeepSpeed's config parser and deepspeed.initialize, Ray Train's ScalingConfig and TorchTrainer, torchrun's
argument parser. Every package is in the `test` extra: a missing one fails these tests, never skips them."""

import ast
import json
import math
import shlex
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from sweeper.report.recipe_snippets import Recipe
from sweeper.report.snippets import Layout, deepspeed_config, torchrun_argv, write_from_recommendation, write_snippets

# Three recipes as a point records them (MLflow params are text). Budgets in optimizer steps of the layout's
# global batch: cosine 23 steps, wsd 20, linear 10; the LR factors below are worked out by hand.
SGD_CONSTANT = {"optimizer": "sgd", "momentum": "0.9", "nesterov": "False", "weight_decay": "0.0",
                "no_decay": "bias,norm", "lr_schedule": "constant", "warmup_steps": "0", "min_lr_ratio": "0.0",
                "decay_fraction": "0.2", "grad_clip_norm": "None", "epochs": "2", "train_samples": "None"}
ADAMW_COSINE = {"optimizer": "adamw", "betas": "0.9,0.95", "eps": "1e-06", "weight_decay": "0.1",
                "no_decay": "bias,norm", "lr_schedule": "cosine", "warmup_steps": "3", "min_lr_ratio": "0.1",
                "grad_clip_norm": "1.0", "steps": 23}
SGD_WSD = {"optimizer": "sgd", "momentum": "0.8", "nesterov": "True", "weight_decay": "0.0005", "no_decay": "",
           "lr_schedule": "wsd", "warmup_steps": "2", "min_lr_ratio": "0.0", "decay_fraction": "0.25",
           "grad_clip_norm": "0.5", "steps": 20}
ADAMW_LINEAR = {"optimizer": "adamw", "lr_schedule": "linear", "min_lr_ratio": "0.2", "warmup_steps": "0", "steps": 10}
# step -> LR factor. Cosine: warm-up (k + 1) / 3, then 0.1 + 0.9 (1 + cos(pi (k - 3) / 20)) / 2: at k = 13 the
# middle, 0.55. wsd: warm-up (k + 1) / 2, held until 20 x (1 - 0.25) = 15, then linear to 0 at 20.
FACTORS = {
    "sgd-constant": {0: 1.0, 1: 1.0, 50: 1.0},
    "adamw-cosine": {0: 1 / 3, 1: 2 / 3, 2: 1.0, 3: 1.0, 13: 0.55, 23: 0.1},
    "sgd-wsd": {0: 0.5, 1: 1.0, 14: 1.0, 15: 1.0, 17: 0.6, 19: 0.2},
    "adamw-linear": {0: 1.0, 5: 0.6, 10: 0.2},
}
# transformers' own schedules for the same arguments: its warm-up is k / warmup_steps (one step behind).
HF_OWN_FACTORS = {
    "sgd-constant": FACTORS["sgd-constant"],
    "adamw-cosine": {0: 0.0, 1: 1 / 3, 2: 2 / 3, 3: 1.0, 13: 0.55, 23: 0.1},
    "sgd-wsd": {0: 0.0, 1: 0.5, 2: 1.0, 14: 1.0, 15: 1.0, 17: 0.6, 19: 0.2},
    "adamw-linear": FACTORS["adamw-linear"],
}
RECIPES = {"sgd-constant": SGD_CONSTANT, "adamw-cosine": ADAMW_COSINE, "sgd-wsd": SGD_WSD,
           "adamw-linear": ADAMW_LINEAR}


def point(micro, accumulation, workers, lr, recipe, **layout):
    """A recommended point's params: its layout and a recipe (a budget of `steps` optimizer steps as samples)."""
    params = {k: v for k, v in recipe.items() if k != "steps"}
    if "steps" in recipe:
        params["train_samples"] = str(recipe["steps"] * micro * accumulation * workers)
    return {"micro_batch_size": str(micro), "accumulation_steps": str(accumulation), "num_workers": str(workers),
            "lr": str(lr), **params, **layout}


LAYOUTS = {
    "sgd-constant": Layout.from_params(point(64, 2, 2, 0.0707, SGD_CONSTANT, precision="bf16",
                                             activation_checkpointing="blocks", key="mb64-acc2-w2-bf16-ckpt"), "cpu"),
    "adamw-cosine": Layout.from_params(point(32, 1, 1, 0.05, ADAMW_COSINE), "gpu"),
    "sgd-wsd": Layout.from_params(point(8, 4, 8, 1e-3, SGD_WSD, precision="fp16"), "gpu"),
    "adamw-linear": Layout.from_params(point(16, 2, 1, 3e-4, ADAMW_LINEAR), "cpu"),
}


def snippet_module(folder, monkeypatch, name="measured_recipe"):
    """`folder`'s module `name`, imported fresh (every test's folder holds its own measured_recipe.py)."""
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return __import__(name)


def _call(tree: ast.AST, name: str) -> ast.Call:
    """The one call of `name` (a bare name or an attribute's last part) in the snippet."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]
    assert len(calls) == 1, f"{name}: {len(calls)} calls"
    return calls[0]


def _keywords(call: ast.Call) -> dict:
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if not isinstance(k.value, ast.Name)}


class Tiny(nn.Module):
    """Linear layers (one weight tied), a BatchNorm named bn (transformers' default decays its weight) and a
    LayerNorm: what the weight-decay groups tell apart."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.bn, self.ln, self.out = nn.Linear(4, 4), nn.BatchNorm1d(4), nn.LayerNorm(4), nn.Linear(4, 4)
        self.out.weight = self.fc.weight
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.out(self.ln(self.bn(self.fc(x)))))


SPARED_BY_BIAS_NORM = {"fc.bias", "bn.weight", "bn.bias", "ln.weight", "ln.bias", "out.bias", "head.bias"}


@pytest.fixture(params=list(LAYOUTS))
def written(request, tmp_path, monkeypatch):
    layout = LAYOUTS[request.param]
    folder = tmp_path / "snippets"
    paths = write_snippets(layout, str(folder))
    return request.param, layout, {Path(p).name: Path(p) for p in paths}, snippet_module(folder, monkeypatch)


def test_every_file_is_written_and_named_in_the_readme(written):
    _, layout, files, _ = written
    assert list(files) == ["layout.yaml", "measured_recipe.py", "lightning_trainer.py", "hf_training_arguments.py",
                           "deepspeed_config.json", "deepspeed_initialize.py", "ray_train.py", "torchrun.sh",
                           "README.md"]
    readme = files["README.md"].read_text()
    assert all(f"`{name}`" in readme for name in files if name != "README.md")
    assert f"global batch {layout.global_batch_size} = micro-batch {layout.micro_batch_size}" in readme


def test_the_recipe_is_read_from_a_points_params_and_an_older_record_gets_what_it_measured():
    cosine = LAYOUTS["adamw-cosine"].recipe
    assert (cosine.betas, cosine.eps, cosine.weight_decay, cosine.no_decay) == ((0.9, 0.95), 1e-6, 0.1,
                                                                              ("bias", "norm"))
    assert (cosine.lr_schedule, cosine.warmup_steps, cosine.min_lr_ratio, cosine.total_steps,
            cosine.grad_clip_norm) == ("cosine", 3, 0.1, 23.0, 1.0)
    wsd = LAYOUTS["sgd-wsd"].recipe
    assert (wsd.momentum, wsd.nesterov, wsd.no_decay, wsd.decay_fraction, wsd.grad_clip_norm) == (0.8, True, (), 0.25,
                                                                                               0.5)
    assert (LAYOUTS["sgd-constant"].recipe.grad_clip_norm, LAYOUTS["sgd-constant"].recipe.epochs) == (None, 2)
    # A sweep from before the recipe keys: SGD momentum 0.9, every parameter decayed (by 0), a constant LR, no clip.
    old = Layout.from_params({"micro_batch_size": "8", "accumulation_steps": "1", "num_workers": "1", "lr": "0.1"})
    assert old.recipe == Recipe() and old.recipe.no_decay == () and old.recipe.grad_clip_norm is None
    # A list logged as MLflow writes a Python list reads the same as the comma-joined one.
    listed = Recipe.from_params({"betas": "[0.9, 0.95]", "no_decay": "['bias', 'norm']"}, 16)
    assert (listed.betas, listed.no_decay) == ((0.9, 0.95), ("bias", "norm"))
    # Without a sample budget, the steps the point took (its metric) give the schedule's length.
    assert Recipe.from_params({"optimizer_steps": 40.0, "train_samples": "None"}, 16).total_steps == 40.0
    with pytest.raises(ValueError, match=r"lr_schedule='step' is invalid. Should be one of \['constant', 'linear'"):
        Recipe(lr_schedule="step")


@pytest.mark.parametrize("name", list(RECIPES))
def test_measured_recipe_builds_the_optimizer_groups_and_schedule_worked_out_by_hand(name, tmp_path, monkeypatch):
    layout = LAYOUTS[name]
    write_snippets(layout, str(tmp_path))
    recipe = snippet_module(tmp_path, monkeypatch)
    optimizer = recipe.build_optimizer(Tiny())
    decayed, spared = optimizer.param_groups
    r = layout.recipe
    assert (decayed["weight_decay"], spared["weight_decay"]) == (r.weight_decay, 0.0)
    model = Tiny()
    names = {id(p): n for n, p in model.named_parameters()}
    groups = recipe.param_groups(model)
    spared_names = {names[id(p)] for p in groups[1]["params"]}
    assert spared_names == (SPARED_BY_BIAS_NORM if r.no_decay == ("bias", "norm") else set())
    assert sum(len(g["params"]) for g in groups) == len(names)  # the tied weight once
    if layout.optimizer == "sgd":
        assert isinstance(optimizer, torch.optim.SGD)
        assert (decayed["momentum"], decayed["nesterov"]) == (r.momentum, r.nesterov)
    else:
        assert isinstance(optimizer, torch.optim.AdamW) and (decayed["betas"], decayed["eps"]) == (r.betas, r.eps)
    assert {k: recipe.lr_factor(k) for k in FACTORS[name]} == pytest.approx(FACTORS[name], rel=1e-12)
    scheduler = recipe.build_scheduler(optimizer)
    lrs = []
    for _ in range(max(FACTORS[name]) + 1):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert {k: lrs[k] for k in FACTORS[name]} == pytest.approx({k: layout.lr * f for k, f in FACTORS[name].items()})


def test_clip_gradients_clips_the_whole_gradient_or_leaves_it(tmp_path, monkeypatch):
    for name, expected in (("adamw-cosine", 1.0), ("sgd-constant", None)):
        write_snippets(LAYOUTS[name], str(tmp_path / name))
        recipe = snippet_module(tmp_path / name, monkeypatch)
        model = Tiny()
        for p in model.parameters():
            p.grad = torch.full_like(p, 3.0)
        before = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
        recipe.clip_gradients(model.parameters())
        after = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert float(after) == pytest.approx(float(before) if expected is None else expected, rel=1e-5)


def _hf_arguments(files):
    return _keywords(_call(ast.parse(files["hf_training_arguments.py"].read_text()), "TrainingArguments"))


def test_hugging_face_training_arguments_carry_the_recipe(written):
    name, layout, files, _ = written
    from transformers import TrainingArguments

    args = _hf_arguments(files)
    r = layout.recipe
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"], args["learning_rate"]) == (
        layout.micro_batch_size, layout.accumulation_steps, layout.lr)
    assert args["weight_decay"] == r.weight_decay and args["warmup_steps"] == r.warmup_steps
    # transformers clips only at max_grad_norm > 0: 0.0 is "no clipping" (its default, 1.0, clips).
    assert args["max_grad_norm"] == (0.0 if r.grad_clip_norm is None else r.grad_clip_norm)
    assert args["lr_scheduler_type"] == {"sgd-constant": "constant", "adamw-cosine": "cosine_with_min_lr",
                                         "sgd-wsd": "warmup_stable_decay", "adamw-linear": "warmup_stable_decay"}[name]
    assert args.get("lr_scheduler_kwargs") == {
        "sgd-constant": None, "adamw-cosine": {"min_lr_rate": 0.1},
        "sgd-wsd": {"num_decay_steps": 5, "decay_type": "linear", "min_lr_ratio": 0.0},
        "adamw-linear": {"num_decay_steps": 10, "decay_type": "linear", "min_lr_ratio": 0.2},
    }[name]
    assert args.get("max_steps") == (None if name == "sgd-constant" else int(r.total_steps))
    assert args["activation_checkpointing"] == (layout.activation_checkpointing == "blocks")
    assert "gradient_checkpointing" not in args  # transformers 5 deprecates it for activation_checkpointing
    built = TrainingArguments(**{**args, "use_cpu": True, "report_to": "none"})
    assert (built.max_grad_norm, built.weight_decay, built.lr_scheduler_type.value) == (
        args["max_grad_norm"], r.weight_decay, args["lr_scheduler_type"])
    if layout.optimizer == "sgd":
        assert (built.optim.value, built.optim_args) == ("sgd", f"momentum={r.momentum!r},nesterov={r.nesterov}")
    else:
        assert (built.optim.value, built.adam_beta1, built.adam_beta2, built.adam_epsilon) == (
            "adamw_torch", *r.betas, r.eps)


def _trainer(files, cls_name, monkeypatch, tmp_path):
    """The snippet's TrainingArguments, built, and a Trainer of `cls_name` (Trainer or the snippet's
    MeasuredTrainer) on Tiny; on this CPU without mixed precision (the optimizer and schedule do not depend on it)."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(**{**_hf_arguments(files), "use_cpu": True, "bf16": False, "fp16": False,
                                "report_to": "none", "output_dir": str(tmp_path / "out")})
    namespace = {}
    exec(compile(files["hf_training_arguments.py"].read_text().split("\nargs = ")[0], "hf", "exec"),  # noqa: S102
         namespace)
    source = files["hf_training_arguments.py"].read_text()
    exec(compile(source[source.index("\nclass MeasuredTrainer"):], "hf", "exec"), namespace)  # noqa: S102
    trainer = (Trainer if cls_name == "Trainer" else namespace["MeasuredTrainer"])(model=Tiny(), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps if args.max_steps > 0 else 100)
    return trainer


def _lrs(optimizer, scheduler, steps):
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_transformers_builds_the_measured_optimizer_and_schedule(written, monkeypatch, tmp_path):
    """MeasuredTrainer: transformers' own optimizer (optim, optim_args, adam_*) on the measured weight-decay groups,
    and the measured LR at every step; a plain Trainer's schedule agrees after the warm-up."""
    name, layout, files, _ = written
    r = layout.recipe
    trainer = _trainer(files, "MeasuredTrainer", monkeypatch, tmp_path)
    optimizer = trainer.optimizer
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    decayed, spared = ({names[id(p)] for p in g["params"]} for g in optimizer.param_groups)
    assert spared == (SPARED_BY_BIAS_NORM if r.no_decay else set())
    assert [g["weight_decay"] for g in optimizer.param_groups] == [r.weight_decay, 0.0]
    if layout.optimizer == "sgd":
        assert isinstance(optimizer, torch.optim.SGD)
        assert all((g["momentum"], g["nesterov"]) == (r.momentum, r.nesterov) for g in optimizer.param_groups)
    else:
        assert isinstance(optimizer, torch.optim.AdamW)
        assert all((g["betas"], g["eps"]) == (r.betas, r.eps) for g in optimizer.param_groups)
    steps = max(FACTORS[name]) + 1
    lrs = _lrs(optimizer, trainer.lr_scheduler, steps)
    assert {k: lrs[k] for k in FACTORS[name]} == pytest.approx({k: layout.lr * f for k, f in FACTORS[name].items()})
    plain = _trainer(files, "Trainer", monkeypatch, tmp_path)
    own = _lrs(plain.optimizer, plain.lr_scheduler, steps)
    assert {k: own[k] for k in HF_OWN_FACTORS[name]} == pytest.approx(
        {k: layout.lr * f for k, f in HF_OWN_FACTORS[name].items()})
    # transformers' default exclusions: a BatchNorm named bn is decayed, every bias spared even with no_decay [].
    plain_names = {id(p): n for n, p in plain.model.named_parameters()}
    hf_spared = {plain_names[id(p)] for p in plain.optimizer.param_groups[1]["params"]}
    assert "bn.weight" not in hf_spared and "fc.bias" in hf_spared


def test_lightning_trainer_is_built_and_trains_the_measured_schedule_with_clipping(written, tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    name, layout, files, recipe = written
    source = files["lightning_trainer.py"].read_text()
    tree = ast.parse(source)
    args = _keywords(_call(tree, "Trainer"))
    r = layout.recipe
    assert (args["devices"], args["accumulate_grad_batches"]) == (layout.num_workers, layout.accumulation_steps)
    assert args["precision"] == {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[layout.precision]
    assert args["strategy"] == ("ddp" if layout.num_workers > 1 else "auto") and args["accelerator"] == layout.device
    assert args["gradient_clip_val"] == r.grad_clip_norm
    assert args.get("gradient_clip_algorithm") == (None if r.grad_clip_norm is None else "norm")
    assert args.get("max_steps") == (None if name == "sgd-constant" else int(r.total_steps))
    built = L.Trainer(**{**args, "accelerator": "cpu"}, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, default_root_dir=str(tmp_path))
    assert (built.accumulate_grad_batches, built.gradient_clip_val, built.max_steps) == (
        layout.accumulation_steps, r.grad_clip_norm, args.get("max_steps", -1))
    loader_call = _call(tree, "DataLoader")
    data = TensorDataset(torch.zeros(4 * layout.micro_batch_size, 3))
    loader = eval(compile(ast.Expression(loader_call), "lightning_trainer.py", "eval"),
                  {"DataLoader": DataLoader, "train_dataset": data})
    assert loader.batch_size == layout.micro_batch_size and len(loader) == 4
    # configure_optimizers, run by a one-device Trainer for a few optimizer steps.
    namespace = {"measured_recipe": recipe}
    exec(compile(source[source.index("\ndef configure_optimizers"):], "lightning", "exec"), namespace)  # noqa: S102
    module = _lightning_module(namespace["configure_optimizers"])
    steps = 4
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                        accumulate_grad_batches=2, gradient_clip_val=args["gradient_clip_val"],
                        gradient_clip_algorithm=args.get("gradient_clip_algorithm", "norm"))
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
    assert module.lrs == pytest.approx([layout.lr * recipe.lr_factor(k) for k in range(steps)])
    assert len(module.norms) == steps
    if r.grad_clip_norm is None:
        assert module.norms[0] > 10  # the first step's gradient (before any update) left as it is
    else:
        assert module.norms == pytest.approx([r.grad_clip_norm] * steps, rel=1e-4)


def _lightning_module(configure_optimizers):
    """A LightningModule of Tiny with the snippet's configure_optimizers; it records each optimizer step's LR and
    the gradient norm after Lightning's clipping (its configure_gradient_clipping hook, which does the clipping)."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.lrs, self.norms = Tiny(), [], []

        def training_step(self, batch, batch_idx):
            return 100 * self.model(batch[0]).pow(2).mean()  # gradients far above any clip norm here

        def on_before_optimizer_step(self, optimizer):
            self.lrs.append(optimizer.param_groups[0]["lr"])

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            grads = [p.grad.flatten() for p in self.parameters() if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.cat(grads))))

    Module.configure_optimizers = configure_optimizers
    return Module()


def test_torchrun_command_parses_with_torchruns_own_parser(written):
    from torch.distributed.run import get_args_parser

    _, layout, files, _ = written
    line = [s for s in files["torchrun.sh"].read_text().splitlines() if s.startswith("torchrun ")]
    argv = shlex.split(line[0])
    assert argv == torchrun_argv(layout)
    parsed = get_args_parser().parse_args(argv[1:])
    assert parsed.nproc_per_node == str(layout.num_workers) and parsed.nnodes == "1"
    assert parsed.training_script == "your_train.py"
    flags = dict(a[2:].split("=", 1) for a in parsed.training_script_args)
    r = layout.recipe
    assert (int(flags["micro-batch-size"]), int(flags["accumulation-steps"])) == (layout.micro_batch_size,
                                                                                layout.accumulation_steps)
    assert (float(flags["weight-decay"]), flags["lr-schedule"], int(flags["warmup-steps"])) == (
        r.weight_decay, r.lr_schedule, r.warmup_steps)
    assert flags["grad-clip-norm"] == ("none" if r.grad_clip_norm is None else repr(r.grad_clip_norm))
    assert flags["no-decay"] == ",".join(r.no_decay)
    assert ("momentum" in flags) == (layout.optimizer == "sgd") and ("betas" in flags) == (layout.optimizer == "adamw")


def test_ray_train_snippet_builds_the_real_scaling_config_and_trainer_and_prepares_on_the_device(written,
                                                                                                  monkeypatch):
    import ray.train.torch
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    _, layout, files, _ = written
    namespace = {"train_loop_per_worker": lambda config: None}
    exec(compile(files["ray_train.py"].read_text(), "ray_train.py", "exec"), namespace)  # noqa: S102 - our own file
    scaling = namespace["scaling_config"]
    assert isinstance(scaling, ScalingConfig) and isinstance(namespace["trainer"], TorchTrainer)
    assert scaling.num_workers == layout.num_workers and scaling.use_gpu == (layout.device == "gpu")
    config = namespace["train_loop_config"]
    assert (config["micro_batch_size"], config["accumulation_steps"], config["lr"]) == (
        layout.micro_batch_size, layout.accumulation_steps, layout.lr)
    # prepare(model): Ray Train's prepare_model (the worker's device, DDP), outside a Ray Train run here.
    prepared = []
    monkeypatch.setattr(ray.train.torch, "prepare_model", lambda model: prepared.append(model) or model)
    model = Tiny()
    assert namespace["prepare"](model) is model and prepared == [model]


def test_layout_bad_values():
    with pytest.raises(ValueError, match=r"precision='fp8' is invalid. Should be one of \['fp32', 'bf16', 'fp16'\]"):
        Layout(8, 1, 1, 0.1, precision="fp8")
    with pytest.raises(ValueError, match="micro_batch_size=0 must be a positive integer"):
        Layout(0, 1, 1, 0.1)


def test_a_reports_recommendation_yaml_and_the_points_record_are_written_as_snippets(tmp_path):
    """The `recommendation` section of a report's recommendation.yaml (the shape analysis.py writes), with the
    recipe from the point's own record (report.build passes its child run's params and metrics)."""
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
    record = {"key": "mb16-acc2-w2-bf16", "micro_batch_size": "16", "lr": "0.05", "momentum": "0.9",
              "weight_decay": "0.0", "no_decay": "bias,norm", "lr_schedule": "constant", "grad_clip_norm": "None",
              "samples_per_second": 99.0}
    paths = {Path(p).name: Path(p) for p in write_from_recommendation(text, str(tmp_path / "s"), use_gpu=False,
                                                                      point_params=record)}
    config = json.loads(paths["deepspeed_config.json"].read_text())
    assert config["train_batch_size"] == 64 and config["bf16"]["enabled"] is True
    assert config["gradient_clipping"] == 0.0 and "optimizer" not in config
    lightning = paths["lightning_trainer.py"].read_text()
    assert "mb16-acc2-w2-bf16" in lightning and "accelerator='cpu'" in lightning
    hf = _hf_arguments(paths)
    assert (hf["optim"], hf["optim_args"], hf["max_grad_norm"], hf["weight_decay"], hf["lr_scheduler_type"]) == (
        "sgd", "momentum=0.9,nesterov=False", 0.0, 0.0, "constant")
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
    script = next(Path(p) for p in paths if p.endswith("torchrun.sh")).read_text()
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
    write_snippets(Layout(16, 1, 8, 0.1), str(tmp_path / "w8"))
    write_snippets(Layout(16, 1, 1, 0.1), str(tmp_path / "w1"))
    assert hint in (tmp_path / "w8" / "torchrun.sh").read_text()
    one = (tmp_path / "w1" / "torchrun.sh").read_text()
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


class _DataParallel(types.SimpleNamespace):
    """DeepSpeedConfig's mpu: only the data-parallel world size is asked for."""

    def get_data_parallel_world_size(self):
        return self.size


def test_deepspeed_parses_its_config_the_batch_identity_clipping_and_optimizer(written, monkeypatch):
    from deepspeed.runtime import config as deepspeed_config_module
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig asks its mpu for the world size only once a process group answers get_rank: rank 0 here.
    monkeypatch.setattr(deepspeed_config_module.dist, "get_rank", lambda: 0)
    _, layout, files, _ = written
    config = json.loads(files["deepspeed_config.json"].read_text())
    assert config == deepspeed_config(layout)
    # DeepSpeed refuses a config whose train_batch_size is not micro x accumulation x world size.
    parsed = DeepSpeedConfig(config, mpu=_DataParallel(size=layout.num_workers))
    assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == (
        layout.global_batch_size, layout.micro_batch_size, layout.accumulation_steps)
    assert (parsed.bfloat16_config.enabled, parsed.float16_config.enabled) == (layout.precision == "bf16",
                                                                               layout.precision == "fp16")
    r = layout.recipe
    assert parsed.gradient_clipping == (0.0 if r.grad_clip_norm is None else r.grad_clip_norm)
    if layout.optimizer == "adamw":
        assert parsed.optimizer_name == "adamw" and parsed.optimizer_params == {
            "lr": layout.lr, "betas": list(r.betas), "eps": r.eps, "weight_decay": r.weight_decay}
    else:
        assert parsed.optimizer_name is None  # torch's SGD, passed to deepspeed.initialize
    # DeepSpeed 0.19 clips at 1.0 unless told: "no clipping" must be written.
    bare = {k: config[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                   "gradient_accumulation_steps")}
    assert DeepSpeedConfig(bare, mpu=_DataParallel(size=layout.num_workers)).gradient_clipping == 1.0


def test_recipe_keys_by_trainer_for_the_cosine_point(tmp_path):
    """One point, each trainer's spelling of its cosine-to-0.1 schedule, clip 1.0 and AdamW (betas 0.9, 0.95)."""
    layout = LAYOUTS["adamw-cosine"]
    files = {Path(p).name: Path(p).read_text() for p in write_snippets(layout, str(tmp_path))}
    assert "lr_scheduler_type='cosine_with_min_lr'" in files["hf_training_arguments.py"]
    assert "gradient_clip_val=1.0" in files["lightning_trainer.py"]
    assert "--betas=0.9,0.95" in files["torchrun.sh"] and "--min-lr-ratio=0.1" in files["torchrun.sh"]
    assert "TOTAL_STEPS = 23.0" in files["measured_recipe.py"] and "NO_DECAY = ('bias', 'norm')" in files[
        "measured_recipe.py"]
    assert math.isclose(json.loads(files["deepspeed_config.json"])["optimizer"]["params"]["eps"], 1e-6)


def test_a_built_reports_snippets_carry_the_recommended_points_recorded_recipe(tmp_path):
    """report.build hands the recommended point's own record (its MLflow child run) to the snippets: the recipe
    keys the recommendation.yaml section does not hold reach every trainer's file."""
    from sweeper.config import ReportConfig
    from sweeper.plan import GridPoint
    from sweeper.report import build as report
    from sweeper.schema import PointResult
    from sweeper.tracking import Tracker
    from tests.harness import mlflow_store

    tracker = Tracker(mlflow_store(tmp_path), "exp")
    parent = tracker.start_sweep("sweep-recipe", {"use_gpu": "False"}, "a: 1\n")
    recipe = {**{k: v for k, v in ADAMW_COSINE.items() if k != "steps"}, "train_samples": 23 * 32}
    for micro, speed in ((16, 300.0), (32, 450.0)):
        point = GridPoint(micro, 32 // micro, 1)
        params = {"micro_batch_size": micro, "accumulation_steps": 32 // micro, "num_workers": 1,
                  "global_batch_size": 32, "lr": 0.001, **recipe}
        tracker.log_point(point, params, PointResult.from_flat(dict(
            status="ok", samples_per_second=speed, samples_per_second_cv=0.01, throughput_stable=True,
            peak_memory_bytes=2**27, val_accuracy=0.9, val_samples=20000, samples_seen=736, train_seconds=2.0)))
    made = report.build(tracker.store, parent, ReportConfig(), str(tmp_path / "out"), log=False)
    assert made.recommendation.best.key == "mb32-acc1-w1"
    folder = Path(made.folder) / "snippets"
    args = _hf_arguments({"hf_training_arguments.py": folder / "hf_training_arguments.py"})
    assert (args["lr_scheduler_type"], args["lr_scheduler_kwargs"], args["max_steps"], args["warmup_steps"]) == (
        "cosine_with_min_lr", {"min_lr_rate": 0.1}, 23, 3)
    assert (args["adam_beta2"], args["adam_epsilon"], args["weight_decay"], args["max_grad_norm"]) == (
        0.95, 1e-6, 0.1, 1.0)
    assert "NO_DECAY = ('bias', 'norm')" in (folder / "measured_recipe.py").read_text()
    assert json.loads((folder / "deepspeed_config.json").read_text())["gradient_clipping"] == 1.0
