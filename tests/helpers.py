"""Factories the test files share, imported by name (`from tests.helpers import problems`): the
repository's root, the experiment files, a config's problems as the CLI would report them, one grid
point's PointSpec for the worker-side tests, one run as the report reads it (`trial`), a clock that only
forwards move (timing tests with exact answers) and a wait on a condition with a deadline (instead of a
fixed sleep).

What loads torch is imported where it is used: the report's tests stay free of it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

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


class ForwardClock:
    """A stand-in for the `time` module whose `perf_counter` moves only when a model runs a forward,
    `seconds` each (in training mode only, with `training_only`): a step's or a batch's duration is
    known exactly, and no load on the machine can change it. Every other clock (time.time,
    time.monotonic) is the real one."""

    def __init__(self, seconds: float, training_only: bool):
        self.now, self.seconds, self.training_only, self.forwards = 0.0, seconds, training_only, 0

    def perf_counter(self) -> float:
        return self.now

    def tick(self, module, args) -> None:
        if module.training or not self.training_only:
            self.now += self.seconds
            self.forwards += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def forwards_take(monkeypatch, seconds: float, *modules, training_only: bool = False) -> ForwardClock:
    """Every model `models.build` makes takes `seconds` per forward, on the clock of the device's marks
    (sweeper.measure.telemetry, on CPU) and of `modules`: those whose `time.perf_counter` times the work
    (sweeper.worker.train's windows, an inference module's minimum timed duration). Pick `seconds` a
    power of two, so sums of them are exact."""
    from sweeper.measure import telemetry
    from sweeper.workloads import models

    clock = ForwardClock(seconds, training_only)
    for module in (telemetry, *modules):
        monkeypatch.setattr(module, "time", clock)
    build = models.build

    def build_on_the_clock(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(clock.tick)
        return model

    monkeypatch.setattr(models, "build", build_on_the_clock)
    return clock


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.05) -> Any:
    """Poll `condition` until it returns something true (returned), or fail naming `what` after `timeout`
    seconds: a wait for the thing awaited, never a fixed sleep that hopes it happened."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)
