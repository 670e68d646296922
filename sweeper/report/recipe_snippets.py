"""The recipe a point was measured with (optimizer and its momentum or betas and eps, weight decay and the
parameters it spares, the LR schedule after its warm-up, gradient clipping) in each trainer's own spelling, for
report.snippets: read from the point's params, with what an older record measured where it recorded none; and
`measured_recipe.py`, the recipe in plain PyTorch that the Lightning, DeepSpeed, Ray Train and torchrun files and
Hugging Face's MeasuredTrainer build with. Pure (stdlib).

The schedule, in optimizer steps k of the layout's global batch G (sweeper counts it in samples, the same at one
G): the warm-up's factor min(1, (k + 1) / warmup_steps) times the decay's, 1 until the decay starts (the warm-up's
end; wsd: the budget's last decay_fraction, never inside the warm-up) and then, at progress p = (k - start) /
(total - start), linear 1 - (1 - min) p or cosine min + (1 - min) (1 + cos(pi p)) / 2 (wsd decays linearly).
Each trainer's spelling was read from its source: transformers 5.24 (training_args.py, optimization.py,
trainer_optimizer.py `_get_sgd`), DeepSpeed 0.19.8 (runtime/config.py, lr_schedules.py), torchtitan 0.2.2
(config/job_config.py, components/lr_scheduler.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

SCHEDULES = ("constant", "linear", "cosine", "wsd")
# transformers' TrainingArguments(optim=...) per sweeper optimizer; another (a factory of your own) has none.
HF_OPTIM = {"sgd": "sgd", "adamw": "adamw_torch"}
# DeepSpeed's own optimizer by its config name; SGD is not one: the companion passes torch's to initialize.
DEEPSPEED_OPTIMIZER = {"adamw": "AdamW"}
# torchtitan 0.2's optimizer names (components/optimizer.py builds Adam and AdamW only).
TORCHTITAN_OPTIMIZER = {"adamw": "AdamW"}


def _text(params: Mapping[str, Any], name: str) -> Optional[str]:
    value = params.get(name)
    return None if value in (None, "None", "null", "") else str(value)


def _number(params: Mapping[str, Any], name: str, default: Optional[float]) -> Optional[float]:
    value = _text(params, name)
    return default if value is None else float(value)


def _names(value: Any) -> Tuple[str, ...]:
    """A list recorded as "a,b" (MLflow params are text; a list logged as is reads "['a', 'b']") or given as one."""
    if value in (None, "None", "null", "", "[]"):
        return ()
    parts = value.strip("[]()").split(",") if isinstance(value, str) else [str(v) for v in value]
    return tuple(part for part in (p.strip().strip("'\"") for p in parts) if part)


@dataclass(frozen=True)
class Recipe:
    """What a point trained with besides its layout. `total_steps`: the budget in optimizer steps of the layout's
    global batch (None: unknown; `epochs` then), where linear and cosine reach `min_lr_ratio` and wsd ends.
    `no_decay`: a parameter whose dotted name or whose module's class name holds one (case-insensitive) gets no
    weight decay. Defaults: what a record from before the recipe keys measured (momentum 0.9, Adam's betas and
    eps, no weight decay, every parameter decayed, a constant LR, no clipping)."""

    momentum: float = 0.9
    nesterov: bool = False
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay: Tuple[str, ...] = ()
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    decay_fraction: float = 0.2
    total_steps: Optional[float] = None
    epochs: Optional[int] = None
    grad_clip_norm: Optional[float] = None

    def __post_init__(self) -> None:
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} is invalid. Should be one of {list(SCHEDULES)}.")

    @classmethod
    def from_params(cls, params: Mapping[str, Any], global_batch_size: int) -> "Recipe":
        """From a point's recorded params (text, "None" when unset); `train_samples` (the point's budget) or,
        without it, the metric `optimizer_steps` (the steps it took) gives the schedule's length."""
        samples = _number(params, "train_samples", None)
        steps = _number(params, "optimizer_steps", None)
        clip = _number(params, "grad_clip_norm", None)
        betas = _names(params.get("betas")) or ("0.9", "0.999")
        return cls(
            momentum=float(_number(params, "momentum", 0.9)),
            nesterov=_text(params, "nesterov") in ("True", "true", "1"),
            betas=(float(betas[0]), float(betas[1])), eps=float(_number(params, "eps", 1e-8)),
            weight_decay=float(_number(params, "weight_decay", 0.0)), no_decay=_names(params.get("no_decay")),
            lr_schedule=_text(params, "lr_schedule") or "constant",
            warmup_steps=int(_number(params, "warmup_steps", 0)),
            min_lr_ratio=float(_number(params, "min_lr_ratio", 0.0)),
            decay_fraction=float(_number(params, "decay_fraction", 0.2)),
            total_steps=samples / global_batch_size if samples else steps,
            epochs=None if _number(params, "epochs", None) is None else int(_number(params, "epochs", None)),
            grad_clip_norm=clip if clip else None)

    @property
    def decays(self) -> bool:
        return self.lr_schedule != "constant"

    @property
    def decay_start(self) -> float:
        """The step the decay begins at (see the module's docstring)."""
        if self.lr_schedule == "wsd" and self.total_steps is not None:
            return max(float(self.warmup_steps), self.total_steps * (1.0 - self.decay_fraction))
        return float(self.warmup_steps)

    def summary(self, optimizer: str) -> str:
        """One line: the recipe in words, for each file's header."""
        what = (f"momentum {self.momentum!r}{' nesterov' if self.nesterov else ''}" if optimizer == "sgd" else
                f"betas {self.betas[0]!r},{self.betas[1]!r} eps {self.eps!r}" if optimizer == "adamw" else
                "its own settings")
        spared = ",".join(self.no_decay) or "nothing"
        floor = f" to {self.min_lr_ratio!r}" if self.decays else ""
        return (f"{optimizer} {what}, weight decay {self.weight_decay!r} (spares {spared}), {self.lr_schedule}"
                f"{floor} after {self.warmup_steps} warm-up step(s), clip "
                f"{'none' if self.grad_clip_norm is None else self.grad_clip_norm}")


def _whole_steps(recipe: Recipe) -> Optional[int]:
    return None if recipe.total_steps is None else int(math.floor(recipe.total_steps))


def hf_schedule(recipe: Recipe) -> Tuple[str, Dict[str, Any]]:
    """transformers' nearest lr_scheduler_type and lr_scheduler_kwargs (optimization.py): its warm-up counts
    steps from 0 (step k at k / warmup_steps, the first at LR 0), one step behind sweeper's; wsd's warm-up starts
    at min_lr_ratio. MeasuredTrainer (hf_training_arguments.py) sets the measured schedule itself."""
    low, warm = recipe.min_lr_ratio, recipe.warmup_steps
    if recipe.lr_schedule == "constant":
        return ("constant_with_warmup" if warm else "constant"), {}
    if recipe.lr_schedule == "cosine":
        return ("cosine_with_min_lr", {"min_lr_rate": low}) if low else ("cosine", {})
    if recipe.lr_schedule == "linear" and not low:
        return "linear", {}
    # linear to a floor is a wsd with no stable phase. In whole steps: transformers holds the LR for max_steps -
    # warmup_steps - num_decay_steps (the budget's, hf_arguments sets max_steps).
    total = _whole_steps(recipe) or 0
    return "warmup_stable_decay", {"num_decay_steps": max(1, total - round(recipe.decay_start)),
                                   "decay_type": "linear", "min_lr_ratio": low}


def hf_arguments(recipe: Recipe, optimizer: str) -> List[str]:
    """TrainingArguments keywords (as `name=value` source) for the recipe."""
    kind, kwargs = hf_schedule(recipe)
    lines = [f"lr_scheduler_type={kind!r}"]
    if kwargs:
        lines.append(f"lr_scheduler_kwargs={kwargs!r}")
    lines.append(f"warmup_steps={recipe.warmup_steps}")
    steps = _whole_steps(recipe)
    if recipe.decays and steps:
        lines.append(f"max_steps={steps}  # the measured budget: the decay spans it")
    elif recipe.epochs is not None:
        lines.append(f"num_train_epochs={recipe.epochs}")
    lines.append(f"weight_decay={recipe.weight_decay!r}")
    # transformers clips only when max_grad_norm > 0 (trainer.py); None would fail that comparison.
    clip = 0.0 if recipe.grad_clip_norm is None else recipe.grad_clip_norm
    lines.append(f"max_grad_norm={clip!r}" + ("  # 0: no clipping, as measured" if not clip else ""))
    if optimizer in HF_OPTIM:
        lines.append(f"optim={HF_OPTIM[optimizer]!r}")
    if optimizer == "sgd":
        # transformers' _get_sgd reads momentum and nesterov from optim_args ("key=value,..."); without it, 0.
        lines.append(f"optim_args='momentum={recipe.momentum!r},nesterov={recipe.nesterov}'")
    elif optimizer == "adamw":
        lines += [f"adam_beta1={recipe.betas[0]!r}", f"adam_beta2={recipe.betas[1]!r}",
                  f"adam_epsilon={recipe.eps!r}"]
    return lines


def deepspeed_keys(recipe: Recipe, optimizer: str, lr: float, zero: bool) -> Dict[str, Any]:
    """DeepSpeed config keys: clipping (0.19's default is 1.0: 0.0 turns it off), its AdamW with the recipe's
    betas, eps and weight decay, and under ZeRO a torch optimizer it has not tested (SGD): allowed, as measured."""
    keys: Dict[str, Any] = {"gradient_clipping": 0.0 if recipe.grad_clip_norm is None else recipe.grad_clip_norm}
    if optimizer in DEEPSPEED_OPTIMIZER:
        keys["optimizer"] = {"type": DEEPSPEED_OPTIMIZER[optimizer], "params": {
            "lr": lr, "betas": list(recipe.betas), "eps": recipe.eps, "weight_decay": recipe.weight_decay}}
    elif zero:
        # deepspeed.initialize asserts on a ZeRO optimizer outside its tested list (torch's SGD is outside).
        keys["zero_allow_untested_optimizer"] = True
    return keys


def torchtitan_sections(recipe: Recipe, optimizer: str, lr: float) -> Tuple[List[str], List[str]]:
    """torchtitan 0.2's [optimizer] and [lr_scheduler] lines, and what it cannot set (as comment lines). Its
    schedule (components/lr_scheduler.py) is sweeper's at a whole budget of steps: the warm-up (k + 1) /
    warmup_steps, then (decay_ratio None) a decay from the warm-up's end at progress (k - warmup) / (total -
    warmup), or (decay_ratio f) over the last round(f x total) steps; decay_ratio 0.0 never decays (constant)."""
    cannot: List[str] = []
    section = ["[optimizer]\n"]
    if optimizer in TORCHTITAN_OPTIMIZER:
        section += [f"name = \"{TORCHTITAN_OPTIMIZER[optimizer]}\"\n", f"lr = {lr!r}\n",
                    f"beta1 = {recipe.betas[0]!r}\n", f"beta2 = {recipe.betas[1]!r}\n", f"eps = {recipe.eps!r}\n",
                    f"weight_decay = {recipe.weight_decay!r}\n"]
    else:
        section += ["name = \"AdamW\"  # the nearest torchtitan has\n", f"lr = {lr!r}\n"]
        cannot.append(f"optimizer {optimizer}: torchtitan builds Adam and AdamW only (register your own in its "
                      "TrainSpec's build_optimizers_fn)")
    if recipe.no_decay and recipe.weight_decay:
        cannot.append(f"no_decay {','.join(recipe.no_decay)}: torchtitan decays every parameter")
    section += ["\n[lr_scheduler]\n", f"warmup_steps = {recipe.warmup_steps}\n"]
    if recipe.lr_schedule == "constant":
        section.append("decay_ratio = 0.0  # no decay: the LR stays after the warm-up\n")
    else:
        if recipe.lr_schedule == "wsd" and recipe.total_steps:
            section.append(f"decay_ratio = {recipe.decay_fraction!r}\n")
        section += [f"decay_type = \"{'cosine' if recipe.lr_schedule == 'cosine' else 'linear'}\"\n",
                    f"min_lr_factor = {recipe.min_lr_ratio!r}\n"]
    return section, cannot


def python_module(recipe: Recipe, optimizer: str, lr: float, header: str) -> str:
    """measured_recipe.py: the recipe's values, then the code that builds it (_RECIPE_CODE)."""
    values = [
        f"OPTIMIZER = {optimizer!r}\n", f"LR = {lr!r}\n", f"MOMENTUM = {recipe.momentum!r}\n",
        f"NESTEROV = {recipe.nesterov!r}\n", f"BETAS = {recipe.betas!r}\n", f"EPS = {recipe.eps!r}\n",
        f"WEIGHT_DECAY = {recipe.weight_decay!r}\n",
        "# A parameter whose dotted name or whose module's class name holds one of these (any case): no weight\n"
        "# decay.\n",
        f"NO_DECAY = {recipe.no_decay!r}\n", f"LR_SCHEDULE = {recipe.lr_schedule!r}\n",
        f"WARMUP_STEPS = {recipe.warmup_steps!r}\n",
        "# The budget in optimizer steps of this layout's global batch: where the decay ends (None: not recorded).\n",
        f"TOTAL_STEPS = {recipe.total_steps!r}\n", f"MIN_LR_RATIO = {recipe.min_lr_ratio!r}\n",
        f"DECAY_FRACTION = {recipe.decay_fraction!r}\n", f"GRAD_CLIP_NORM = {recipe.grad_clip_norm!r}  # None: none\n",
    ]
    return header + _RECIPE_DOC + "".join(values) + _RECIPE_CODE


_RECIPE_DOC = '''"""The recipe sweeper measured, in plain PyTorch: build_optimizer(model), build_scheduler(optimizer)
(step it once after every optimizer step) and clip_gradients(parameters) (after the last micro-step's backward,
before the optimizer's step). The trainer files beside it import it."""

import math

import torch

'''

_RECIPE_CODE = '''

def decays(name, module):
    """Whether weight decay falls on parameter `name` (dotted) of `module` (the module that holds it)."""
    where = (name + " " + type(module).__name__).lower()
    return not any(part.lower() in where for part in NO_DECAY)


def param_groups(model):
    """Two groups: decayed, and spared (weight_decay 0). A parameter shared by two modules counts once."""
    seen, groups = set(), ([], [])
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            full = f"{module_name}.{name}" if module_name else name
            groups[0 if decays(full, module) else 1].append(param)
    return [{"params": groups[0], "weight_decay": WEIGHT_DECAY}, {"params": groups[1], "weight_decay": 0.0}]


def decayed_names(model):
    """The dotted names of the decayed parameters (what Hugging Face's get_decay_parameter_names returns)."""
    decayed = {id(p) for p in param_groups(model)[0]["params"]}
    return [name for name, param in model.named_parameters() if id(param) in decayed]


def build_optimizer(model):
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(param_groups(model), lr=LR, momentum=MOMENTUM, nesterov=NESTEROV)
    if OPTIMIZER == "adamw":
        return torch.optim.AdamW(param_groups(model), lr=LR, betas=BETAS, eps=EPS)
    raise NotImplementedError(f"sweeper measured optimizer {OPTIMIZER!r} (your own factory): build it here")


def lr_factor(step):
    """The LR of optimizer step `step` (from 0) as a fraction of LR."""
    warm = 1.0 if WARMUP_STEPS <= 0 else min(1.0, (step + 1) / WARMUP_STEPS)
    if LR_SCHEDULE == "constant":
        return warm
    if TOTAL_STEPS is None:
        raise ValueError("TOTAL_STEPS is None: set it to your budget in optimizer steps (where the decay ends)")
    start = float(WARMUP_STEPS)
    if LR_SCHEDULE == "wsd":
        start = max(start, TOTAL_STEPS * (1.0 - DECAY_FRACTION))
    if TOTAL_STEPS <= start:
        return warm
    progress = min(1.0, max(0.0, (step - start) / (TOTAL_STEPS - start)))
    if LR_SCHEDULE == "cosine":
        return warm * (MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    return warm * (1.0 - (1.0 - MIN_LR_RATIO) * progress)


def build_scheduler(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


def clip_gradients(parameters):
    """The whole gradient's 2-norm clipped to GRAD_CLIP_NORM (on the reduced gradient: after the last
    micro-step's backward; fp16: after unscaling). Nothing when the recipe did not clip."""
    if GRAD_CLIP_NORM is None:
        return None
    return torch.nn.utils.clip_grad_norm_(parameters, GRAD_CLIP_NORM)
'''
