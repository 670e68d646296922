"""The one way sweeper starts Ray Tune trials, and the one callback that relays what they report.

Imports Ray at module level: import it only after cluster.connect.connect() has started or joined
Ray (the sweep's run functions in cluster.runs do so inside their bodies).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Union

from ray import tune
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY
from ray.tune.result import AUTO_RESULT_KEYS

from sweeper.cluster import records
from sweeper.cluster.records import Sink
from sweeper.errors import last_line

# What each running Tune experiment's Relay hands results to, by experiment name. Tune pickles its
# callbacks into the experiment's state; the sinks (an MLflow client, a progress bar) must stay out
# of it, and a restored experiment's Relay finds the sinks of the process that resumed it here.
_SINKS: Dict[str, Sink] = {}

# Fields Tune adds to every reported result, and Ray Train's relay the path of the worker group's
# checkpoint: not the trial's own measurements.
TUNE_FIELDS = frozenset(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "should_checkpoint",
                                              CHECKPOINT_PATH_KEY}


# How long an experiment's trials wait to be placed before the driver says the cluster is held.
WAIT_NOTE_SECONDS = 10.0


class Relay(tune.Callback):
    """Hands a Tune experiment's trial events to its driver-side Sink; Tune calls these in the driver.

    Its pickled state is the experiment's name only; the sink is looked up in the running driver.
    """

    def __init__(self, key: str):
        self.key = key

    def __getstate__(self):
        return {"key": self.key}

    @property
    def sink(self) -> Sink:
        return _SINKS[self.key]

    def on_step_begin(self, iteration, trials, **info):
        records.raise_deferred()  # Ctrl-C or SIGTERM, past Tune's graceful stop of every trial

    def on_step_end(self, iteration, trials, **info):
        """Says once when the experiment's trials have all waited WAIT_NOTE_SECONDS to be placed (none running):
        another sweep or job holds the cluster."""
        statuses = {t.status for t in trials}
        waiting = "PENDING" in statuses and "RUNNING" not in statuses
        now = time.monotonic()
        since = getattr(self, "_pending_since", None)
        if not waiting:
            self._pending_since = None
        elif since is None:
            self._pending_since = now
        elif now - since >= WAIT_NOTE_SECONDS * (1 + getattr(self, "_asked", 0)) and not getattr(self, "_said", False):
            self._asked = getattr(self, "_asked", 0) + 1
            self._said = self.sink.waiting(now - since)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.sink.started(trial.trial_id, trial.config)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.sink.result(trial.trial_id, trial.config, {k: v for k, v in result.items() if k not in TUNE_FIELDS})

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.sink.ended(trial.trial_id, trial.config, None)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = trial.get_error()
        self.sink.ended(trial.trial_id, trial.config, last_line(str(error)) if error else "no error recorded")


def launch(
    experiment: str,
    trainable: Callable[..., None],
    parameters: Dict[str, Any],
    resources: Union[Dict[str, float], Callable[[Dict[str, Any]], Dict[str, float]]],
    param_space: Dict[str, Any],
    storage_path: str,
    sink: Sink,
    max_concurrent_trials: int = 1,
    restore: bool = False,
    max_failures: int = 0,
) -> None:
    """Run `trainable` as one Tune trial per value of `param_space`'s grid (or restore the experiment
    of that name and run its unfinished and errored trials), each reserving `resources` (or
    `resources(config)` of its entry of the param space); every trial event reaches `sink` in this
    process. Actors are reused between trials that ask for the same resources: reuse saves a process
    start and its imports (torch) for every such trial after the first."""
    wrapped = tune.with_resources(tune.with_parameters(trainable, **parameters), resources)
    _SINKS[experiment] = sink
    try:
        if restore:
            tuner = tune.Tuner.restore(
                os.path.join(storage_path, experiment), wrapped, resume_unfinished=True, resume_errored=True
            )
        else:
            tuner = tune.Tuner(
                wrapped,
                param_space=param_space,
                tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent_trials, reuse_actors=True),
                run_config=tune.RunConfig(
                    name=experiment, storage_path=storage_path, callbacks=[Relay(experiment)], verbose=0,
                    failure_config=tune.FailureConfig(max_failures=max_failures),
                ),
            )
        records._TUNE_LOOPS.append(1)
        try:
            tuner.fit()
        finally:
            records._TUNE_LOOPS.pop()
        records.raise_deferred()  # a stop that came as the last step ended
    finally:
        _SINKS.pop(experiment, None)


def can_restore(storage_path: str, experiment: str) -> bool:
    return tune.Tuner.can_restore(os.path.join(storage_path, experiment))
