"""A point's training state at a step boundary, saved and continued at any layout (issue 28).

What a fresh process cannot recompute: the weights (canonical keys: no DDP `module.` prefix, no
activation checkpointing's `.block.`, so a checkpoint is layout- and recipe-free), the optimizer's state
(DDP replicates it whole on every rank, so rank 0's does not depend on the worker count), fp16's loss
scale, torch's random state, and the position: samples seen (the stream is a function of it, so a run
continued at another global batch sees no sample twice and skips none), optimizer steps, the LR warmup
counted in samples, the training time (the time to a target goes on), and the history a continued run's
checks and record need: the global batch's loss at every step before (the divergence check's untrained
loss and running mean), the noise scale's per-step estimates (its moving averages go on), and the
evaluation curve with the target's figures (History). Written as plain
tensors (`torch.load(weights_only=True)` reads them: a shared store should not unpickle code) and a JSON
file. Knows torch only.

A run continued from it that evaluates records the evaluations before it first (worker.train); the per-step
series (loss, noise scale, gradient norm) stay each run's own, stitched by whoever holds the runs before
(driver/smart.carried, a schedule's spans).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from sweeper.recipe import canonical_key

FORMAT = 1
META, WEIGHTS, OPTIMIZER, EXTRA = "meta.json", "weights.pt", "optimizer.pt", "extra.pt"


@dataclass
class Position:
    """Where the training stands: after `optimizer_steps` steps that saw `samples_seen` samples."""

    samples_seen: int
    optimizer_steps: int
    lr: float  # the LR the next step would take (its global batch's, warmup applied)
    global_batch_size: int
    warmup_samples: int  # train.warmup_steps x the first run's global batch: the warmup in samples
    layout: str  # the point key that saved it
    train_seconds: float = 0.0  # training wall time until then: the time to a target goes on from it
    # train.lr_schedule and the samples it spans (the point's budget; 0 in a checkpoint from before schedules):
    # a continued run goes on from where the schedule stood
    lr_schedule: str = "constant"
    schedule_samples: int = 0


@dataclass
class History:
    """The steps before a continued run: the global batch's loss at each step (worker.divergence: the
    untrained loss is the first, the running mean spans the checkpoint), the gradient noise scale's
    per-step estimates (tr Sigma, |G|^2) of the steps that measured it (worker.gns: the moving averages
    go on; the estimates are unbiased at any layout), and the evaluations (samples seen, accuracy, loss),
    the seconds they took and the target's figures if it was reached (steps_to_target, samples_to_target,
    time_to_target_seconds, eval_seconds_to_target): a continued run's curve and time to target are the
    point's."""

    losses: List[float] = field(default_factory=list)
    noise: List[Tuple[float, float]] = field(default_factory=list)
    evaluations: List[Tuple[int, float, float]] = field(default_factory=list)
    eval_seconds: float = 0.0
    target: Optional[Dict[str, float]] = None
    target_of: Optional[List[Optional[float]]] = None  # the target (accuracy, loss) those figures are for


@dataclass
class Snapshot:
    identity: Dict[str, Any]  # what must match to continue: model, data, optimizer, seed
    position: Position
    weights: Dict[str, torch.Tensor]
    optimizer: Dict[str, Any]
    scaler: Optional[Dict[str, Any]] = None
    rng: Optional[torch.Tensor] = None
    cuda_rng: Optional[torch.Tensor] = None  # the training device's generator, on a GPU (dropout draws from it)
    write_seconds: Optional[float] = None
    bytes: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    history: History = field(default_factory=History)


def canonical_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The model's state dict as the bare model names it: DDP's `module.` and each activation
    checkpointing wrapper's `block.` segment removed."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    canonical = canonical_key(inner)
    # Host memory: the device's peak is the training's.
    return {canonical(key): value.detach().to("cpu", copy=True) for key, value in inner.state_dict().items()}


def to_cpu(value: Any) -> Any:
    """A copy of a (nested) state dict with every tensor on the host."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def identity(spec: Any) -> Dict[str, Any]:
    """What a checkpoint must share with a point that continues it: the model, the data, the optimizer
    family and the replicate's seed (the sample order). Not the layout, LR or precision."""
    # A language model's input_shape is its context: a position in samples means sequences of it.
    model = {k: v for k, v in asdict(spec.model).items() if k != "checkpoint_modules"}  # a recipe setting
    data = {k: v for k, v in asdict(spec.data).items()
            if k not in ("loader_workers", "root", "download", "verify_checksums")}
    optimizer = spec.optim.name if not spec.optim._target_ else f"{spec.optim.name} ({spec.optim._target_})"
    return {"model": model, "data": data, "optimizer": optimizer, "seed": spec.seed}


def mismatch(saved: Dict[str, Any], wanted: Dict[str, Any]) -> Optional[str]:
    """The first way a checkpoint's identity differs from the point's, in words (None: it matches):
    "model.width 64 (this point: 128)"."""
    for part in ("model", "data", "optimizer", "seed"):
        mine, theirs = saved.get(part), wanted.get(part)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            keys = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
            shown = "; ".join(f"{part}.{k} {mine.get(k)!r} (this point: {theirs.get(k)!r})" for k in keys[:3])
            return shown
        return f"{part} {mine!r} (this point: {theirs!r})"
    return None


def write(snapshot: Snapshot, folder: str) -> Snapshot:
    """The snapshot as files in `folder` (created); returns it with the seconds and bytes it took."""
    began = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    torch.save(snapshot.weights, os.path.join(folder, WEIGHTS))
    torch.save(snapshot.optimizer, os.path.join(folder, OPTIMIZER))
    torch.save({"scaler": snapshot.scaler, "rng": snapshot.rng, "cuda_rng": snapshot.cuda_rng},
               os.path.join(folder, EXTRA))
    meta = {"format": FORMAT, "identity": snapshot.identity, "position": asdict(snapshot.position),
            "extra": snapshot.extra, "history": asdict(snapshot.history)}
    with open(os.path.join(folder, META), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    seconds = time.perf_counter() - began
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in (WEIGHTS, OPTIMIZER, EXTRA, META))
    return Snapshot(**{**snapshot.__dict__, "write_seconds": seconds, "bytes": size})


def write_history(history: History, folder: str) -> None:
    """A written snapshot's history replaced (its evaluations grew after the state was taken)."""
    path = os.path.join(folder, META)
    with open(path) as f:
        meta = json.load(f)
    meta["history"] = asdict(history)
    with open(path, "w") as f:
        json.dump(meta, f, indent=1, default=str)


def read_meta(folder: str) -> Dict[str, Any]:
    """A checkpoint's identity and position (meta.json) without its tensors; ValueError naming the folder
    when it is not one."""
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        raise ValueError(f"{folder} is not a sweeper training-state checkpoint (no {META})")
    with open(path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder} is a checkpoint of format {meta.get('format')}, this sweeper reads {FORMAT}")
    return meta


def read(folder: str) -> Snapshot:
    """A snapshot written by `write`; ValueError naming the folder when it is not one."""
    meta = read_meta(folder)
    def load(name: str) -> Any:  # to the host: a checkpoint saved on a GPU reads on any machine
        return torch.load(os.path.join(folder, name), weights_only=True, map_location="cpu")
    extra = load(EXTRA)
    history = meta.get("history") or {}
    return Snapshot(meta["identity"], Position(**meta["position"]), load(WEIGHTS), load(OPTIMIZER),
                    extra.get("scaler"), extra.get("rng"), extra.get("cuda_rng"), extra=meta.get("extra", {}),
                    history=History(list(history.get("losses", [])), [tuple(e) for e in history.get("noise", [])],
                                    [tuple(e) for e in history.get("evaluations", [])],
                                    history.get("eval_seconds", 0.0), history.get("target"),
                                    history.get("target_of")))


def load_optimizer(optimizer: torch.optim.Optimizer, state: Dict[str, Any], load=None) -> None:
    """The saved optimizer state (momentum, Adam's moments and step counts) under the *fresh*
    hyperparameters: torch's load_state_dict restores the saved LR, weight decay and betas, and the old
    global batch's LR would silently win. `load(state)` loads it (optimizer.load_state_dict by default;
    a sharded model's goes through torch's distributed state-dict API, worker.sharding)."""
    fresh = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    saved_groups = len(state.get("param_groups", []))
    if saved_groups != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {saved_groups} parameter group(s), this point's "
                         f"{len(optimizer.param_groups)}: optim.weight_decay or optim.no_decay differ from the run "
                         "that saved it; continue with the same ones")
    (load or optimizer.load_state_dict)(state)
    for group, values in zip(optimizer.param_groups, fresh):
        group.update(values)
