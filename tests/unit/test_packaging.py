"""conf/ sits at the top of the repository; Hydra must find it from an editable install and from a
regular wheel (where it ships as the package `sweeper.conf`)."""

import os
import subprocess
import sys
import zipfile
from tests.helpers import REPO



def _cfg_job(cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "sweeper", "+experiment=resnet_batch", "--cfg", "job"],
        cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


def test_installed_package_finds_its_configs_from_another_directory(tmp_path):
    result = _cfg_job(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: resnet18" in result.stdout


def test_regular_wheel_ships_the_configs(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), "-q"],
        # The build's tools write to their home (rustup's proxies, probed by the build, make
        # ~/.rustup/settings.toml): the test's folder, so the suite writes nothing to the user's.
        check=True, capture_output=True, timeout=300, env={**os.environ, "HOME": str(tmp_path / "home")},
    )
    wheel = next((tmp_path / "dist").glob("sweeper-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "sweeper/conf/config.yaml" in names
    assert "sweeper/conf/experiment/resnet_batch.yaml" in names
    # Installing a pure wheel is unpacking it onto sys.path; put it ahead of the editable finder.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import sweeper.conf, os; print(os.path.dirname(sweeper.conf.__file__))"],
        cwd=work, capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )
    assert where.stdout.strip() == str(site / "sweeper" / "conf")
    result = _cfg_job(work, env)
    assert result.returncode == 0, result.stderr
    assert "name: resnet18" in result.stdout


def _pyproject():
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


# The torch release sweeper/measure/memory.py's MemTracker subclass was last tested on; pyproject.toml
# holds torch below the next minor (docs/memory.md says how to move both).
MEMTRACKER_TESTED_ON = "2.14"


def test_memtracker_internals_the_memory_breakdown_subclasses_are_there_and_the_torch_pin_holds():
    """Fails naming every private MemTracker internal that is missing or changed, instead of the
    memory figures silently going wrong under a new torch."""
    import inspect

    import torch
    from packaging.requirements import Requirement
    from packaging.version import Version

    problems = []
    try:
        from torch.distributed._tools import mem_tracker as mt
    except ImportError as exc:
        raise AssertionError(f"torch {torch.__version__}: torch.distributed._tools.mem_tracker is gone ({exc})")
    for name in ("MemTracker", "_MemRefType", "_UpdateType", "_WeakRefInfo", "_TOTAL_KEY"):
        if not hasattr(mt, name):
            problems.append(f"mem_tracker.{name} is missing")
    expected = {
        "_update_snap": ["self", "u_type", "winfo", "old_mem_consumed", "old_reftype"],
        "_update_peak_stats": ["self", "peak_state"],
        "__enter__": ["self"],
    }
    for method, params in expected.items():
        found = getattr(getattr(mt, "MemTracker", None), method, None)
        got = list(inspect.signature(found).parameters) if found else None
        if got != params:
            problems.append(f"MemTracker.{method}{tuple(params)} is now {got}")
    members = {"_MemRefType": {"PARAM", "BUFFER", "GRAD", "ACT", "TEMP", "OPT", "OTH"},
               "_UpdateType": {"ADD", "DEL", "REF", "SIZE"}}
    for enum, names in members.items():
        missing = names - set(getattr(getattr(mt, enum, None), "__members__", {}))
        if missing:
            problems.append(f"mem_tracker.{enum} lacks {sorted(missing)}")
    winfo = getattr(mt, "_WeakRefInfo", None)
    if winfo is None or list(inspect.signature(winfo.__init__).parameters) != [
            "self", "size", "element_size", "device", "reftype"]:
        problems.append("_WeakRefInfo(size, element_size, device, reftype) changed (memory.py reads its "
                        ".device, .mem_consumed, .reftype)")
    if not problems:
        tracker = mt.MemTracker()
        problems += [f"MemTracker().{a} is missing" for a in ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_WINFO")
                     if not hasattr(tracker, a)]
    if not hasattr(torch._C, "_current_graph_task_id"):
        problems.append("torch._C._current_graph_task_id is missing")
    if not problems:
        problems += _overrides_not_called()
    assert not problems, (f"torch {torch.__version__}: sweeper/measure/memory.py's MemTracker subclass relies on "
                          f"internals that changed: {'; '.join(problems)}. Fix memory.py, then move the torch pin "
                          "(docs/memory.md, 'The torch pin').")
    # The pin and the version tested agree: the installed torch is inside it, and the bound is the
    # next minor after the one tested.
    (torch_req,) = [Requirement(d) for d in _pyproject()["project"]["dependencies"] if Requirement(d).name == "torch"]
    installed = Version(torch.__version__.split("+")[0])
    assert installed in torch_req.specifier, f"torch {installed} is outside pyproject.toml's pin {torch_req}"
    assert f"{installed.major}.{installed.minor}" == MEMTRACKER_TESTED_ON, (
        f"torch {installed} is not the release the MemTracker subclass was tested on ({MEMTRACKER_TESTED_ON})")
    major, minor = map(int, MEMTRACKER_TESTED_ON.split("."))
    assert f"<{major}.{minor + 1}" in str(torch_req.specifier), torch_req


def _overrides_not_called():
    """Run a tiny step under the subclass: MemTracker must still route every update through the
    overridden _update_snap and _update_peak_stats (a renamed internal call would bypass them)."""
    import torch
    from torch import nn

    from sweeper.measure import memory

    calls = {"_update_snap": 0, "_update_peak_stats": 0}

    class Counting(memory._HindsightMemTracker):
        def _update_snap(self, *args, **kwargs):
            calls["_update_snap"] += 1
            return super()._update_snap(*args, **kwargs)

        def _update_peak_stats(self, *args, **kwargs):
            calls["_update_peak_stats"] += 1
            return super()._update_peak_stats(*args, **kwargs)

    model = nn.Linear(8, 4)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tracker = Counting()
    with tracker:
        tracker.track_external(model, sgd)
        model(torch.randn(2, 8)).sum().backward()
        sgd.step()
    return [f"MemTracker no longer calls {name} (the subclass's override never ran)"
            for name, n in calls.items() if n == 0]


def test_ray_serve_is_an_extra_and_its_benchmark_says_so_when_missing():
    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    (ray_req,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "ray"]
    assert "serve" not in ray_req.extras and {"tune", "train"} <= ray_req.extras
    assert any(Requirement(d).name == "ray" and "serve" in Requirement(d).extras
               for d in project["optional-dependencies"]["serve"])
    # Ray Serve missing, simulated: its module made unimportable before the benchmark runs.
    script = REPO / "scripts" / "bench_batching_sim.py"
    code = ("import runpy, sys; sys.modules['ray.serve'] = None; sys.argv = ['bench', '--quick']; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        result.stderr.strip()] and "pip install -e '.[serve]'" in result.stderr, result.stderr
