"""Factories the test files share, imported by name (`from tests.helpers import problems`): the
repository's root, the experiment files, a config's problems as the CLI would report them, and one
grid point's PointSpec for the worker-side tests."""

from pathlib import Path
from typing import Any, Optional

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig, validate
from sweeper.driver.preflight import preflight
from sweeper.errors import ConfigError
from sweeper.plan import GridPoint
from sweeper.worker.spec import PointSpec
from tests.harness import typed_cfg

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def problems(*overrides):
    """The problems `python -m sweeper` would report for these overrides: the config's checks, then
    preflight's (which loads the data and builds the model), without starting Ray."""
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
    return PointSpec(model=model, data=data, train=train or TrainConfig(seed=seed), measure=measure or MeasureConfig(),
                     point=point, lr=lr, steps=steps, **extra)
