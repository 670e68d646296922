"""A grid point's saves on the way (cluster.checkpoint_every_steps): where they go, which one the same point
continues from when its worker group is started again (a node lost, a worker killed, the driver resumed),
and its record made whole again. The saves are sweeper.worker.state's checkpoints in a folder every node
reads; Ray's own checkpoints (the points a group has done) say nothing about a point half-trained.

No Ray import; worker.state (torch) is imported where a save is read, in the worker.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from typing import List, Optional, Tuple

SAVE_PREFIX = "s"  # a save's folder: s<samples seen>


def point_folder(root: str, key: str) -> str:
    """Where a point's saves on the way go: <root>/resume/<point key> (root: the sweep's checkpoint root)."""
    return os.path.join(root, "resume", key)


def with_saves(spec, root: str, every: int):
    """`spec` saving its training state every `every` optimizer steps into its point's folder, the last
    step excepted (the point ends there)."""
    batch = spec.point.global_batch_size
    folder = point_folder(root, spec.point.key)
    at = {n * batch: os.path.join(folder, f"{SAVE_PREFIX}{n * batch}") for n in range(every, spec.steps, every)}
    return replace(spec, save_states_at=at, saves_for_retry=True)


def saves(spec) -> List[Tuple[int, str]]:
    """The saves of `spec`'s point now on disk and complete (samples seen, folder), latest first. A save's
    meta.json is written last: a folder without it (a node lost mid-write) is not one."""
    found = []
    for at, folder in spec.save_states_at.items():
        if os.path.isfile(os.path.join(folder, "meta.json")):
            found.append((at, folder))
    return sorted(found, reverse=True)


def min_steps(spec) -> int:
    """The fewest steps a run of `spec` times: its warm-up (and profiled steps), then one step per window."""
    return spec.first_timed_step + spec.measure.windows


def resumed(spec) -> Tuple[object, Optional[int]]:
    """`spec` continuing from its point's latest readable save that leaves enough steps to time (with the
    steps after it and only the saves past it), and the optimizer steps before it; `spec` itself and None
    when there is none, or when `spec`'s saves are not for its retry (a branch sweep's trunk checkpoints)."""
    from sweeper.worker import state

    if not spec.saves_for_retry:
        return spec, None
    batch = spec.point.global_batch_size
    for at, folder in saves(spec):
        done = at // batch
        if spec.steps - done < min_steps(spec):
            continue  # too few steps left to time: an earlier save, or step 0
        try:
            state.read_meta(folder)
        except (ValueError, OSError):  # a torn meta.json
            continue
        later = {s: f for s, f in spec.save_states_at.items() if s > at}
        return replace(spec, start_from=folder, steps=spec.steps - done, save_states_at=later), done
    return spec, None


def made_whole(result, done: int, spec) -> None:
    """A point continued from its save after `done` steps, recorded as the whole point: the loss at every
    step (the save's history holds those before it), its optimizer steps and samples counted from step 0.
    Its throughput and memory are the continued run's own windows; `continued_from` and `start_samples`
    say where it went on from."""
    from sweeper.worker import state

    if result.status not in ("ok", "did_not_learn", "diverged") or spec.start_from is None:
        return
    try:
        history = state.read_meta(spec.start_from).get("history") or {}
    except (ValueError, OSError):
        return
    before = list(history.get("losses") or [])[:done]
    result.train_loss = before + list(result.train_loss or [])
    steps, samples, tokens = (result.cost.get(k) for k in ("optimizer_steps", "samples_seen", "tokens_seen"))
    if steps is None or not samples:
        return
    whole = (steps + done) * spec.point.global_batch_size
    result.cost.update(dict(optimizer_steps=steps + done, samples_seen=whole))
    if tokens:
        result.cost.update(dict(tokens_seen=tokens * whole // samples))


def clear(spec) -> None:
    """A point's saves on the way removed once its result is reported: they served only its retry (`spec`
    as with_saves made it, every save named). Saves that are not for its retry (a branch sweep's trunk
    checkpoints, which its branches start from after the trunk is recorded) are left alone."""
    if not spec.saves_for_retry:
        return
    for folder in {os.path.dirname(f) for f in spec.save_states_at.values()}:
        shutil.rmtree(folder, ignore_errors=True)
