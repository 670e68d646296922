"""The fixtures every test may ask for, and the session's hooks. What tests import by name lives in
tests/harness.py (the CLI runner, the session's Ray, the zygote, the store template); the xdist
scheduling and the solo tests' turns in tests/scheduling.py."""

import os
import tempfile
from pathlib import Path

# The suite writes nothing to $HOME (.ci/run runs it with an empty HOME and fails if anything appears
# there): the caches and settings the libraries under test keep in a user's home (matplotlib's font
# cache, Chromium's profile, ...) go to one folder of this machine's temporary directory instead, kept
# between runs as a user's would be; set before anything imports them. Ray's files have their own keys
# (cluster.ray_dir, the token path).
TEST_CACHES = Path(tempfile.gettempdir()) / f"sweeper-test-caches-{os.getuid()}"
for _variable, _folder in (("MPLCONFIGDIR", "matplotlib"), ("XDG_CACHE_HOME", "cache"),
                           ("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data")):
    os.environ.setdefault(_variable, str(TEST_CACHES / _folder))

import pytest  # noqa: E402 - after the caches' folders are set

from sweeper import config  # noqa: E402
from tests.harness import SESSION_RAY, STORE_TEMPLATE, ZYGOTE, SessionRay, compose_cfg  # noqa: E402
# Hooks are registered by being names of this conftest.
from tests.scheduling import pytest_runtest_protocol, pytest_xdist_make_scheduler  # noqa: F401,E402


def pytest_configure(config):
    """Under `pytest -n 2` each xdist worker owns one of the 2 cores: one torch intra-op thread per worker.
    torch's default is one per core, and a test training in-process with two threads while the other
    worker ran Ray end-to-end tests took 20 times as long (ResNet-18's epoch: 175 s against 9 s alone, in
    a fresh-clone .ci/run); serially, a test keeps torch's default."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture
def cfg_of():
    """Typed, validated config from overrides (raises ConfigError like the CLI would)."""
    return lambda *overrides: config.load(compose_cfg(*overrides))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts with the thread count torch had before it: many tests set their own
    (torch.set_num_threads), which would otherwise hold for every test after them in the process, so
    a test's outcome depended on which ran before it (a timing test passed in the suite, failed alone)."""
    import torch  # imported already: the test modules import it at collection

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def session_ray() -> SessionRay:
    """The session's Ray, started on first use."""
    SESSION_RAY.env()
    return SESSION_RAY


def pytest_sessionfinish(session, exitstatus):
    ZYGOTE.stop()
    SESSION_RAY.stop()
    STORE_TEMPLATE.remove()
