"""Ctrl-C and SIGTERM during a Ray Tune experiment: the handler leaves the stop to the experiment's next step,
in Python code, so Tune does not first stop every trial gracefully (2.6-2.9 s here, against `ray job stop`'s
3 s); outside an experiment it raises at once. The signal for real: tests/e2e/test_faults.py."""

import os
import signal

import pytest

from sweeper.cluster import records
from sweeper.driver.skeleton import Signals
from sweeper.errors import Interrupted


def test_a_stop_outside_a_tune_experiment_is_raised_at_once():
    signals = Signals()
    signals.install()
    try:
        with pytest.raises(Interrupted, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signals.restore()


def test_a_stop_during_a_tune_experiment_is_raised_at_its_next_step(monkeypatch):
    monkeypatch.setattr(records, "_TUNE_LOOPS", [1])
    monkeypatch.setattr(records, "_DEFERRED", [])
    signals = Signals()
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the handler returns: Tune's loop goes on to its step's end
        with pytest.raises(Interrupted, match="SIGINT"):
            records.raise_deferred()  # what the experiment's Relay does as its next step begins
        records.raise_deferred()  # raised once
    finally:
        signals.restore()
