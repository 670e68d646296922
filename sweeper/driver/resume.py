"""sweep.resume=true: find the latest interrupted sweep of this model and data, and check it is the
same sweep before anything records into it."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Tuple

from sweeper.cluster import connect
from sweeper.config import SweeperConfig
from sweeper.driver.skeleton import Session
from sweeper.errors import ConfigError

# A resumed sweep must be the same sweep: these parent params must match the config.
RESUME_KEYS = ("model", "dataset", "micro_batch_sizes", "accumulation_steps", "num_workers", "global_batch_sizes")


def find_interrupted(cfg: SweeperConfig, session: Session, wanted: Callable[[], Dict[str, Any]]) -> Tuple[str, str]:
    """The latest sweep of this model and dataset with a Ray Tune experiment to restore and a parent
    run in MLflow, checked against `wanted()` (the parent params this config would record);
    (experiment name, parent run id)."""
    prefix = f"sweep-{cfg.model.name}-{cfg.data.name}-"
    folder = session.cluster.results_dir
    names = sorted(
        (n for n in os.listdir(folder) if n.startswith(prefix) and n[len(prefix):].replace("-", "").isdigit()),
        reverse=True,
    )
    for name in names:
        if not connect.can_resume(session.cluster, name):
            continue
        parent = session.tracker.find_sweep(name)
        if parent is None:
            continue
        params = session.tracker.resume_sweep(parent)
        expected = wanted()
        changed = [k for k in RESUME_KEYS if params.get(k) != str(expected[k])]
        if changed:
            raise ConfigError([
                f"sweep.resume=true: the latest sweep {name} had other {', '.join(changed)} "
                f"({', '.join(f'{k}={params.get(k)}' for k in changed)}): resume it with the same config, "
                "or drop sweep.resume to start a new sweep"
            ])
        return name, parent
    raise ConfigError([
        f"sweep.resume=true: no interrupted sweep of {cfg.model.name} on {cfg.data.name} under {folder} "
        f"with its run in {session.tracker.uri}; drop sweep.resume to start one"
    ])
