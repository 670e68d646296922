"""sweep.resume=true: find the latest sweep of this model and data that did not finish, and check it is
the same sweep (its whole recorded config) before anything is written to it."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from typing import Any, Dict, List, Tuple

import yaml

from sweeper import tracking
from sweeper.cluster import connect
from sweeper.config import SweeperConfig
from sweeper.errors import ConfigError

# Keys that may differ between a sweep and its resume: how to resume it, where Ray runs, and the
# question its report answers (a report with other settings is kept beside the sweep's own).
MAY_DIFFER = ("sweep.resume", "sweep.retry_failed", "cluster.address", "report.")


def flat_config(resolved_yaml: str) -> Dict[str, Any]:
    """The resolved config as {dotted key: value}, without the keys a resume may change."""
    out: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = node

    walk(yaml.safe_load(resolved_yaml) or {}, "")
    return {k: v for k, v in out.items() if not k.startswith(MAY_DIFFER)}


def schema_defaults() -> Dict[str, Any]:
    """Every setting's default, flat (a config group's own defaults are its schema's: model.hf_type's
    is ModelConfig's)."""
    from omegaconf import OmegaConf

    return flat_config(OmegaConf.to_yaml(OmegaConf.structured(SweeperConfig)))


def config_hash(resolved_yaml: str) -> str:
    """What makes two sweeps the same experiment, as one tag (sweeper.config_hash)."""
    text = json.dumps(flat_config(resolved_yaml), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(recorded_yaml: str, resolved_yaml: str) -> List[str]:
    """`key: recorded -> now` for every key that differs (beyond MAY_DIFFER). A key the recorded config
    lacks (a setting added by a later sweeper version) counts as its schema default: a sweep recorded
    before `sweep.context_lengths` existed ran without one."""
    now = flat_config(resolved_yaml)
    added = {k: v for k, v in schema_defaults().items() if k in now}
    before = {**added, **flat_config(recorded_yaml)}
    return [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)]


def sweep_name(kind: str, *parts: str) -> str:
    """A new sweep's name (its MLflow parent run, its Ray Tune experiment and storage folders): the start to
    the second, and a random number so that two sweeps started in one second on one cluster, one
    cluster.ray_dir and one tracking store never share a name (Tune would mix their experiment states)."""
    return "-".join([kind, *parts, time.strftime("%Y%m%d-%H%M%S"), f"{secrets.randbelow(10**6):06d}"])


def _started(name: str, prefix: str) -> bool:
    """Whether `name` is a sweep name made from `prefix` (with or without the random part, which older
    sweeps lack)."""
    return name.startswith(prefix) and name[len(prefix):].replace("-", "").isdigit()


def results_dir(cfg: SweeperConfig) -> str:
    """Where the sweep's Ray Tune experiments are (cluster.connect makes the same folder)."""
    return os.path.join(os.path.abspath(cfg.cluster.ray_dir), "results")


def find_interrupted(cfg: SweeperConfig, tracker: tracking.Tracker, resolved_yaml: str) -> Tuple[str, str]:
    """The latest sweep of this model and dataset that did not finish, with a Ray Tune experiment to
    restore and a parent run in MLflow, checked to be the same sweep: (experiment name, parent run
    id). Reads only, and needs no Ray: a refused resume is one line before Ray starts, and leaves every
    record as it was."""
    prefix = f"sweep-{cfg.model.name}-{cfg.data.name}-"
    folder = results_dir(cfg)
    names = sorted(
        (n for n in (os.listdir(folder) if os.path.isdir(folder) else []) if _started(n, prefix)),
        reverse=True,
    )
    finished, refused = [], []
    for name in names:
        run = tracking.find_sweep(tracker.store, name)
        if run is None:
            continue
        if run.info.status == "FINISHED":
            finished.append(name)
            continue
        try:
            _check_resumable(tracker, folder, name, run, resolved_yaml)
        except ConfigError as exc:
            # Another sweep of this model and data (one that shares the cluster, say): the latest that is
            # this one is resumed; none is, and the latest one's refusal says why.
            refused.append(exc)
            continue
        return name, run.info.run_id
    if refused:
        raise refused[0]
    done = f" (the latest, {finished[0]}, finished)" if finished else ""
    raise ConfigError([
        f"sweep.resume=true: no unfinished sweep of {cfg.model.name} on {cfg.data.name} under {folder} with its "
        f"run in {tracking.redact(tracker.store.uri)}{done}; drop sweep.resume to start one"
    ])


def _check_resumable(tracker: tracking.Tracker, folder: str, name: str, run: Any, resolved_yaml: str) -> None:
    if run.data.tags.get("sweeper.resume_format") != tracking.RESUME_FORMAT:
        raise ConfigError([
            f"sweep.resume=true: {name} was started by an older sweeper whose Ray Tune state this one cannot "
            "restore; its recorded points stay in MLflow: drop sweep.resume to start a new sweep"
        ])
    if not connect.can_resume(folder, name):
        raise ConfigError([
            f"sweep.resume=true: {name} has no Ray Tune state under {folder} to restore "
            "(another cluster.ray_dir?); drop sweep.resume to start a new sweep"
        ])
    if run.data.tags.get("sweeper.config_hash") == config_hash(resolved_yaml):
        return
    recorded = tracking.SweepReader(tracker.store, run.info.run_id).artifact_text("config.yaml")
    changed = differences(recorded, resolved_yaml) if recorded is not None else ["its config.yaml is missing"]
    if not changed:
        return  # recorded before the hash was (or with a hash of another sweeper version): the same config
    raise ConfigError([
        f"sweep.resume=true: {name} was another experiment ({'; '.join(changed[:8])}"
        f"{'; ...' if len(changed) > 8 else ''}): resume it with the same config, or drop sweep.resume"
    ])
