"""Shared fixtures: a shrunk config compose, a working directory per test, the CLI runner."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from sweeper import config

config.register()


def compose_cfg(*overrides: str):
    with initialize_config_module(config_module="sweeper.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def cfg_of():
    """Typed, validated config from overrides (raises ConfigError like the CLI would)."""
    return lambda *overrides: config.load(compose_cfg(*overrides))


def run_cli(*args: str, cwd: Path, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    merged = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "sweeper", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=merged,
    )


def free_port() -> int:
    """A TCP port nothing listens on now (for a gloo rendezvous, a server, a dashboard)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
