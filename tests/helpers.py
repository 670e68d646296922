"""Factories the test files share, imported by name (`from tests.helpers import problems`): the
repository's root, the experiment files, a config's problems as the CLI would report them, one grid
point's PointSpec for the worker-side tests, and one run as the report reads it (`trial`).

What loads torch is imported where it is used: the report's tests stay free of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig, validate
from sweeper.errors import ConfigError
from sweeper.plan import GridPoint
from sweeper.report.trials import Trial
from tests.harness import typed_cfg

if TYPE_CHECKING:
    from sweeper.worker.spec import PointSpec

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def problems(*overrides):
    """The problems `python -m sweeper` would report for these overrides: the config's checks, then
    preflight's (which loads the data and builds the model), without starting Ray."""
    from sweeper.driver.preflight import preflight

    cfg = typed_cfg(*overrides)
    found = validate(cfg)
    if not found:
        try:
            preflight(cfg)
        except ConfigError as exc:
            found = exc.problems
    return found


def point_spec(point: GridPoint, model: ModelConfig, data: DataConfig, *, lr: float, steps: int, seed: int = 0,
               train: Optional[TrainConfig] = None, measure: Optional[MeasureConfig] = None, **extra: Any) -> PointSpec:
    """One grid point's PointSpec for a test that trains it in-process: `train` (else TrainConfig(seed=seed)),
    `measure` (else the defaults), and any other PointSpec field in `extra` (optim, gns, save_state_to, ...).
    A test file binds its own model, data and figures once (functools.partial)."""
    from sweeper.worker.spec import PointSpec

    return PointSpec(model=model, data=data, train=train or TrainConfig(seed=seed), measure=measure or MeasureConfig(),
                     point=point, lr=lr, steps=steps, **extra)


def trial(mb: int, acc: int = 1, w: int = 1, status: str = "ok", *, suffix: str = "", seed: Optional[int] = None,
          **fields: Any) -> Trial:
    """One run as the report reads it: micro-batch `mb`, `acc` accumulation steps, `w` workers and the
    global batch they make, keyed as the sweeper keys it (`mb16-acc2-w1`, then `suffix`, e.g. `-zero3`;
    with `seed`, a replicate `-s<seed>` of the point keyed without it); any other Trial field in `fields`.
    A test file binds its own figures once (functools.partial)."""
    point = f"mb{mb}-acc{acc}-w{w}{suffix}"
    replicate = {} if seed is None else {"key": f"{point}-s{seed}", "point_key": point, "seed": seed}
    return Trial(**{"key": point, "micro_batch_size": mb, "accumulation_steps": acc, "num_workers": w,
                    "global_batch_size": mb * acc * w, "status": status, **replicate, **fields})
