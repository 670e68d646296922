"""The README's boundary rules, read from the source with `ast` (no import runs): which package may
import Ray, MLflow, torch, and each other, and no import circle. A rule holds because this test fails
when it is broken, not because someone remembered it: each rule is also run on a mutated copy of the
import graph (an import added to a real module's source) and must report the mutation.

Imports inside functions count: they run later, but they still tie the two modules together.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterable, List, Mapping, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sweeper"

# The one package that imports Ray, and the one that imports MLflow (README, "Where things happen"):
# every module inside it may (sweeper.tracking is a package by role).
RAY_HOME = "sweeper.cluster"
MLFLOW_HOME = "sweeper.tracking"

# Every package of sweeper (a top-level module counts as one), by rank: a package imports only packages
# of a lower rank, never one of its own rank or above. The ranks hold the README's older rules: the
# workers (worker/) know torch, the measurements and the workload, never the driver's side, Ray or
# MLflow; what measures and what is measured never reach up to the report or the driver; the Ray layer
# serves the driver and never reaches up to it, the strategies or the report (a wait it must say is a
# callable the driver hands it).
RANKS: Dict[str, int] = {
    # The foundation: the standard library and numpy, no other part of sweeper.
    "sweeper.errors": 0, "sweeper.units": 0, "sweeper.stats": 0, "sweeper.plan": 0,
    "sweeper.schema": 0, "sweeper.lr_schedule": 0, "sweeper.permutation": 0,
    # Below the schema: how a record's figures are declared and flattened (schema names each figure with it).
    "sweeper.record": -1,
    # The typed config: the schema, each built-in model's own fields, the checks before anything runs.
    "sweeper.config": 1,
    # What is trained: the models and data, which read the config; the sample stream.
    "sweeper.workloads": 2, "sweeper.sampler": 2,
    "sweeper.recipe": 3,
    # What a step costs: time, memory, FLOPs.
    "sweeper.measure": 4,
    # In the training workers, and the inference points: beside each other, neither imports the other.
    "sweeper.worker": 5, "sweeper.inference": 5,
    # The outside systems: Ray, and MLflow. And the API your own loop calls (loop.fn), over the workers' session.
    "sweeper.cluster": 6, "sweeper.tracking": 6, "sweeper.loop": 6,
    # How each sweep.strategy decides which points run; pure, called by the driver.
    "sweeper.strategies": 7,
    # A sweep read back: the report, the DataFrame.
    "sweeper.report": 8,
    "sweeper.driver": 9,
    # The entry points, and the package itself (sweeper.results).
    "sweeper.__main__": 10, "sweeper.estimate": 10, "sweeper": 10,
}

# Pure arithmetic, tested without processes: neither they nor anything they import at module level
# loads torch or Ray.
PURE = (
    "sweeper.plan", "sweeper.permutation", "sweeper.schema", "sweeper.record", "sweeper.lr_schedule",
    "sweeper.errors", "sweeper.units", "sweeper.tracking.journal", "sweeper.stats",
    "sweeper.config", "sweeper.config.report", "sweeper.config.model_sections", "sweeper.measure.timing",
    "sweeper.measure.frontier", "sweeper.measure.knee", "sweeper.inference.roofline",
    "sweeper.inference.batching_sim", "sweeper.measure.sharded_memory", "sweeper.measure.node_traffic",
    "sweeper.cluster.environment", "sweeper.cluster.resources", "sweeper.cluster.records", "sweeper.strategies",
    "sweeper.strategies.base",
    "sweeper.strategies.grid", "sweeper.strategies.smart", "sweeper.strategies.branch",
    "sweeper.strategies.branch_reading", "sweeper.report.analysis",
    "sweeper.report.critical_batch", "sweeper.report.snippets", "sweeper.report.folding",
    "sweeper.report.sharded_snippets", "sweeper.report.elastic", "sweeper.report.parallelism",
    "sweeper.measure.layouts", "sweeper.measure.communication",
    "sweeper.report.throughput_model", "sweeper.report.goodput", "sweeper.report.run_cost",
    "sweeper.report.target_cluster", "sweeper.report.projection", "sweeper.report.projection_sections",
    "sweeper.report.recipe_snippets",
)
HEAVY = ("torch", "ray")

Imports = Mapping[str, List[Tuple[str, int, bool]]]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, pathlib.Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _scan(name: str, text: str, is_package: bool = False) -> List[Tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import statement of one module's source, those
    under `if TYPE_CHECKING:` left out (they never run). `from a import b` names `a.b` when that is a module
    of sweeper, else `a`."""
    tree = ast.parse(text, name)
    package = name if is_package else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    top_level |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    type_checking = {n.lineno for node in ast.walk(tree)
                     if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                     for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
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
    return [(m, line, top) for m, line, top in found if line not in type_checking]


IMPORTS: Dict[str, List[Tuple[str, int, bool]]] = {
    name: _scan(name, path.read_text(), path.name == "__init__.py") for name, path in MODULES.items()
}


def _mutated(name: str, extra_source: str) -> Dict[str, List[Tuple[str, int, bool]]]:
    """IMPORTS as they would be with `extra_source` appended to module `name` (a real one, or a new one
    inside a package): the mutation each rule must report."""
    path = MODULES.get(name)
    text = (path.read_text() if path else "") + "\n" + extra_source
    return {**IMPORTS, name: _scan(name, text, bool(path and path.name == "__init__.py"))}


def _within(module: str, prefixes) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _importers_of(outside: str, imports: Imports = IMPORTS) -> Set[str]:
    return {name for name, found in imports.items() if any(_within(m, outside) for m, _, _ in found)}


def _outside_home(outside: str, home: str, imports: Imports = IMPORTS) -> List[str]:
    return sorted(m for m in _importers_of(outside, imports) if not _within(m, home))


def test_only_cluster_imports_ray():
    assert _outside_home("ray", RAY_HOME) == []


def test_only_tracking_imports_mlflow():
    assert _outside_home("mlflow", MLFLOW_HOME) == []


def test_the_homes_rules_fail_on_a_mutation_and_let_the_home_package_in():
    assert _outside_home("mlflow", MLFLOW_HOME, _mutated("sweeper.report.trials", "import mlflow")) == [
        "sweeper.report.trials"]
    assert _outside_home("ray", RAY_HOME, _mutated("sweeper.driver.console", "def f():\n    import ray.tune")) == [
        "sweeper.driver.console"]
    # The tracker split by role: a module inside the package is at home.
    assert _outside_home("mlflow", MLFLOW_HOME, _mutated("sweeper.tracking.store", "import mlflow")) == []


def _package(module: str) -> str:
    """The package a module of sweeper belongs to: sweeper.X for sweeper.X.Y..., a top-level module itself."""
    return ".".join(module.split(".")[:2])


def _package_imports(imports: Imports = IMPORTS) -> Dict[Tuple[str, str], List[str]]:
    """(importer, imported) between two packages of sweeper -> the import statements that make it."""
    edges: Dict[Tuple[str, str], List[str]] = {}
    for name, found in imports.items():
        for m, line, _ in found:
            if _within(m, "sweeper") and _package(m) != _package(name):
                edges.setdefault((_package(name), _package(m)), []).append(f"{name}:{line} imports {m}")
    return edges


def _unranked(modules: Iterable[str]) -> List[str]:
    return sorted({_package(m) for m in modules} - set(RANKS))


def _not_downward(imports: Imports = IMPORTS) -> List[str]:
    """Each import of a package at the importer's rank or above, with the line that makes it."""
    return sorted(
        f"{a} (rank {RANKS.get(a)}) imports {b} (rank {RANKS.get(b)}): {lines[0]}"
        for (a, b), lines in _package_imports(imports).items()
        if not (a in RANKS and b in RANKS and RANKS[a] > RANKS[b])
    )


def test_every_package_has_a_rank():
    assert _unranked(MODULES) == []
    assert sorted(set(RANKS) - {_package(m) for m in MODULES}) == []  # no rank for a package that is gone


def test_a_new_package_without_a_rank_fails():
    assert _unranked([*MODULES, "sweeper.newpackage.module"]) == ["sweeper.newpackage"]


def test_packages_import_only_lower_ranks():
    assert _not_downward() == []


def test_an_upward_import_between_packages_fails():
    # Inside a function, as an import that dodges a circle at load time would be: it still counts.
    upward = _mutated("sweeper.measure.flops", "def _report():\n    from sweeper.report import analysis\n")
    assert [line.split(": ")[0] for line in _not_downward(upward)] == [
        "sweeper.measure (rank 4) imports sweeper.report (rank 8)"]
    assert "sweeper.measure.flops:" in _not_downward(upward)[0]
    # Sideways, between two packages of one rank, fails too.
    sideways = _mutated("sweeper.worker.gns", "from sweeper.inference import roofline\n")
    assert [line.split(": ")[0] for line in _not_downward(sideways)] == [
        "sweeper.worker (rank 5) imports sweeper.inference (rank 5)"]



def _circles(graph: Mapping[str, Iterable[str]]) -> List[List[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def _module_circles(imports: Imports = IMPORTS) -> List[List[str]]:
    """Circles between modules, imports inside functions included."""
    return _circles({name: sorted({m for m, _, _ in found if m in MODULES and m != name})
                     for name, found in imports.items()})


def _package_circles(imports: Imports = IMPORTS) -> List[List[str]]:
    """Circles between packages: two modules need not import each other for their packages to."""
    graph: Dict[str, List[str]] = {}
    for a, b in sorted(set(_package_imports(imports))):
        graph.setdefault(a, []).append(b)
    return _circles(graph)


def test_no_import_circle_between_modules():
    assert _module_circles() == []


def test_no_import_circle_between_packages():
    assert _package_circles() == []


def test_a_circle_between_packages_fails_where_no_module_circle_is():
    # config's rules reaching into workloads, whose models read the config: no two modules import each other.
    mutated = _mutated("sweeper.config.rules", "def _f():\n    from sweeper.workloads import samples\n")
    assert _module_circles(mutated) == []
    assert _package_circles(mutated) == [["sweeper.config", "sweeper.workloads"]]
    assert _circles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def _loaded_at_import(start: str, imports: Imports = IMPORTS) -> Set[str]:
    """Every module that importing `start` runs (module-level imports, followed through sweeper)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        for m, _, top in imports.get(name, []):
            if top and m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _heavy(module: str, imports: Imports = IMPORTS) -> List[str]:
    return sorted(m for m in _loaded_at_import(module, imports) if _within(m, HEAVY))


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_load_no_torch_or_ray(module):
    assert _heavy(module) == []


def test_a_pure_module_that_loads_torch_through_another_fails():
    # plan.py imports nothing heavy itself: importing a module that does is enough.
    mutated = _mutated("sweeper.plan", "from sweeper.workloads import samples\n")
    assert _heavy("sweeper.plan", mutated) == ["torch", "torch.nn.functional"]
    # At call time only: loaded when the function runs, not when the module is imported.
    assert _heavy("sweeper.plan", _mutated("sweeper.plan", "def _f():\n    import torch\n")) == []


def test_the_rules_see_what_they_check():
    """The scan finds the imports it must: a broken rule is a failure, not a silent pass."""
    assert "sweeper.cluster.connect" in _importers_of("ray")
    assert _importers_of("mlflow") and all(_within(m, MLFLOW_HOME) for m in _importers_of("mlflow"))
    assert any(m == "torch" for m, _, _ in IMPORTS["sweeper.worker.step"])
    assert [m for m in PURE if m not in MODULES] == []
    assert ("sweeper.driver", "sweeper.config") in _package_imports()
