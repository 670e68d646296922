"""The README's boundary rules, read from the source with `ast` (no import runs): which package may
import Ray, MLflow, torch, and each other, and no import circle. A rule holds because this test fails
when it is broken, not because someone remembered it.

Imports inside functions count: they run later, but they still tie the two modules together.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sweeper"

# The one package that imports Ray, the one module that imports MLflow (README, "Where things happen").
RAY_HOME = "sweeper.cluster"
MLFLOW_HOME = "sweeper.tracking"
# What runs in the training workers knows torch, the measurements and the workload; never the driver's
# side, the Ray layer or the report.
WORKER = "sweeper.worker"
WORKER_NEVER = ("sweeper.driver", "sweeper.cluster", "sweeper.report", "sweeper.tracking")
# Below the driver: what measures and what is measured never reach up to the report or the driver.
LOWER = ("sweeper.measure", "sweeper.inference", "sweeper.config", "sweeper.plan", "sweeper.schema", "sweeper.record",
         "sweeper.workloads")
LOWER_NEVER = ("sweeper.driver", "sweeper.report", "sweeper.cluster", "sweeper.tracking", "sweeper.worker")
# The Ray layer serves the driver; it never reaches up to it or to the report (a wait it must say is a
# callable the driver hands it).
CLUSTER = "sweeper.cluster"
CLUSTER_NEVER = ("sweeper.driver", "sweeper.report", "sweeper.strategies")
# Pure arithmetic, tested without processes: neither they nor anything they import at module level
# loads torch or Ray.
PURE = (
    "sweeper.plan", "sweeper.schema", "sweeper.record", "sweeper.errors", "sweeper.units", "sweeper.journal",
    "sweeper.stats",
    "sweeper.config", "sweeper.config.report", "sweeper.measure.timing", "sweeper.measure.frontier",
    "sweeper.measure.knee", "sweeper.inference.roofline", "sweeper.inference.batching_sim",
    "sweeper.measure.sharded_memory", "sweeper.cluster.environment", "sweeper.cluster.resources",
    "sweeper.cluster.records", "sweeper.strategies",
    "sweeper.strategies.smart", "sweeper.strategies.branch", "sweeper.report.analysis",
    "sweeper.report.critical_batch", "sweeper.report.snippets", "sweeper.report.folding",
    "sweeper.workloads.mlp_config", "sweeper.workloads.gpt_config", "sweeper.workloads.hf_config",
    "sweeper.report.sharded_snippets", "sweeper.report.elastic", "sweeper.report.parallelism",
)
HEAVY = ("torch", "ray")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, pathlib.Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path) -> List[Tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import statement of one module. `from a
    import b` names `a.b` when that is a module of sweeper, else `a`."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    top_level |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
            targets = submodules if len(submodules) == len(node.names) else [module] + submodules
            found += [(target, node.lineno, id(node) in top_level) for target in targets]
    return found


def _type_checking_only(path: pathlib.Path) -> Set[int]:
    """Lines of imports under `if TYPE_CHECKING:`: they never run."""
    tree = ast.parse(path.read_text(), str(path))
    lines: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return lines


IMPORTS: Dict[str, List[Tuple[str, int, bool]]] = {}
for _name, _path in MODULES.items():
    _skip = _type_checking_only(_path)
    IMPORTS[_name] = [(m, line, top) for m, line, top in _imports(_name, _path) if line not in _skip]


def _within(module: str, prefixes) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _importers_of(outside: str) -> Set[str]:
    return {name for name, found in IMPORTS.items() if any(_within(m, outside) for m, _, _ in found)}


def test_only_cluster_imports_ray():
    assert {m for m in _importers_of("ray") if not _within(m, RAY_HOME)} == set()


def test_only_tracking_imports_mlflow():
    assert _importers_of("mlflow") - {MLFLOW_HOME} == set()


def _leaks(layer, never) -> List[str]:
    return sorted(f"{name}:{line} imports {m}" for name, found in IMPORTS.items() if _within(name, layer)
                  for m, line, _ in found if _within(m, never))


def test_worker_never_imports_driver_cluster_or_report():
    assert _leaks(WORKER, WORKER_NEVER) == []


def test_lower_layers_never_import_upward():
    assert _leaks(LOWER, LOWER_NEVER) == []


def test_cluster_never_imports_driver_or_report():
    assert _leaks(CLUSTER, CLUSTER_NEVER) == []


def _loaded_at_import(start: str) -> Set[str]:
    """Every module that importing `start` runs (module-level imports, followed through sweeper)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        for m, _, top in IMPORTS.get(name, []):
            if top and m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_load_no_torch_or_ray(module):
    assert sorted(m for m in _loaded_at_import(module) if _within(m, HEAVY)) == []


def _circles() -> List[List[str]]:
    """Strongly connected groups of more than one module (Tarjan), imports inside functions included."""
    graph = {name: sorted({m for m, _, _ in found if m in MODULES and m != name}) for name, found in IMPORTS.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_no_import_circle():
    assert _circles() == []


def test_the_rules_see_what_they_check():
    """The scan finds the imports it must: a broken rule is a failure, not a silent pass."""
    assert "sweeper.cluster.connect" in _importers_of("ray")
    assert _importers_of("mlflow") == {MLFLOW_HOME}
    assert any(m == "torch" for m, _, _ in IMPORTS["sweeper.worker.step"])
    assert [m for m in PURE if m not in MODULES] == []
