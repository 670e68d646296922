"""How `python -m pytest -n 2` shares the 2 cores (a plugin tests/conftest.py loads): which tests one
xdist worker runs together, and the tests marked `solo` that run while the other worker waits
(docs/testing.md)."""

from __future__ import annotations

import ast
import functools
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


# Files whose tests one xdist worker runs together: each builds a costly module-scoped fixture
# (an MLflow server with a sweep recorded through it, one sweep stopped and resumed three ways, a batch
# of CLI runs in one process, a ResNet measured once) that a second worker would build again. (xdist's
# own xdist_group mark does not group under pytest 9: it rewrites item._nodeid, which pytest 9 no
# longer reads.)
ONE_WORKER_FILES = frozenset({
    "tests/e2e/test_resume.py", "tests/e2e/test_ui.py", "tests/unit/test_bad_input.py", "tests/unit/test_config.py",
    "tests/unit/test_recipe.py", "tests/unit/test_roofline.py",
})


# Tests that time the real clock against real work (a sleep, a busy thread) with tight bounds are marked
# `@pytest.mark.solo` (a figure's arithmetic is tested on a clock only forwards move, tests.helpers):
# under `-n 2` they run first, together on one worker, while the other worker waits (`_Turns`). The
# scheduler runs in xdist's controller, which sees node ids only, so it reads the mark from the test's
# source (`solo_marked`): a renamed test keeps its mark.
SOLO = "solo"


def is_solo(nodeid: str) -> bool:
    path, _, name = nodeid.split("[", 1)[0].partition("::")
    return name.split("::")[-1] in _solo_functions(path)


@functools.lru_cache(maxsize=None)
def _solo_functions(path: str) -> frozenset:
    """The test functions of one file marked `solo` (a decorator `pytest.mark.solo`, or the module's
    `pytestmark`: then every test of the file)."""
    file = REPO / path
    if not file.is_file():
        return frozenset()
    tree = ast.parse(file.read_text(), str(file))

    def marked(decorators) -> bool:
        return any(ast.unparse(d).endswith(f"mark.{SOLO}") for d in decorators)

    module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                        and f"mark.{SOLO}" in ast.unparse(n.value) for n in tree.body)
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name.startswith("test") and (module_marked or marked(n.decorator_list)))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Every test its own unit of work, as xdist's `load`, except ONE_WORKER_FILES (a unit each) and
    the tests marked solo (one unit, sent first)."""
    from xdist.scheduler import LoadScopeScheduling

    class FilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if is_solo(nodeid):
                return SOLO
            path = nodeid.split("::", 1)[0]
            return path if path in ONE_WORKER_FILES else nodeid

        def _assign_work_unit(self, node) -> None:
            if SOLO in self.workqueue:
                self.workqueue.move_to_end(SOLO, last=False)
            super()._assign_work_unit(node)

    return FilesTogether(config, log)


class _Turns:
    """Two locks shared by the run's xdist workers: a solo test holds `main` exclusively (so it waits
    for the other worker's current test, then runs alone), every other test holds it shared. A solo
    test also holds `gate`, which every other test takes on its way in, so the other worker cannot
    slip a test in between two solo tests (flock alone would let a shared request overtake)."""

    def __init__(self, folder: Path):
        self.gate = open(folder / "sweeper-turns.gate", "a")
        self.main = open(folder / "sweeper-turns.main", "a")
        self.solo = False

    def enter(self, solo: bool) -> None:
        import fcntl

        if not (solo and self.solo):  # a solo test right after one holds the locks still
            fcntl.flock(self.gate, fcntl.LOCK_EX)
            fcntl.flock(self.main, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
            if not solo:
                fcntl.flock(self.gate, fcntl.LOCK_UN)
        if solo:
            wait_until_quiet()  # the test before, the other worker's or a solo sweep, may still be exiting
        self.solo = solo

    def leave(self, next_is_solo: bool) -> None:
        import fcntl

        if self.solo and next_is_solo:
            return  # the solo tests run back to back: the other worker stays out until the last
        fcntl.flock(self.main, fcntl.LOCK_UN)
        if self.solo:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.solo = False


def wait_until_quiet(busy_cores: float = 0.4, timeout: float = 60.0) -> None:
    """Until the machine's CPUs are nearly idle for a second (or `timeout` passed): the other worker's
    last test may have ended while its sweep's Ray processes still exit (a trial's teardown, a killed
    group's clean-up), and a solo test's bounds assume the cores are its own (once under -n 2, without
    this wait, a step of known duration read 27 % slow). Two idle session Rays use ~0.2 of a core."""
    import psutil

    deadline = time.time() + timeout
    cores = psutil.cpu_count() or 1
    while time.time() < deadline:
        if psutil.cpu_percent(interval=1.0) / 100 * cores <= busy_cores:
            return
    import warnings

    warnings.warn(f"the CPUs were still busy {timeout:.0f} s after the other worker's test: a solo test times "
                  "under load", stacklevel=2)


_TURNS = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, the solo tests run while the other worker waits; serially there is nothing to do."""
    global _TURNS
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    if _TURNS is None:
        # The run's base temporary folder, which every worker's own (popen-gwN) sits in and pytest
        # removes with old runs: the locks are the run's, and leave nothing behind.
        _TURNS = _Turns(item.config._tmp_path_factory.getbasetemp().parent)
    _TURNS.enter(item.get_closest_marker(SOLO) is not None)
    try:
        yield
    finally:
        _TURNS.leave(nextitem is not None and nextitem.get_closest_marker(SOLO) is not None)
