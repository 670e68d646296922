"""The size rules of the layout (issue 45), read from the source with `ast` (no import runs): no module
of sweeper/ over 700 lines, no function or method over 60 (from its `def` line to its last line,
decorators left out). A long function is split into named helpers, not allowed here."""

from __future__ import annotations

import ast
import pathlib
from typing import List, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sweeper"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 60


def _sources() -> List[pathlib.Path]:
    return sorted(ROOT.rglob("*.py"))


def _long_functions(path: pathlib.Path) -> List[Tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_module_is_over_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


def test_no_function_is_over_60_lines():
    long = {f"{p.relative_to(ROOT).as_posix()}:{name}": n for p in _sources() for name, n in _long_functions(p)}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named helpers): {long}"


def test_the_scan_sees_a_long_function_and_a_long_module(tmp_path):
    """The rules can fail: a 61-line function is found, a 60-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n    return 0\n\n\ndef short():\n{body}\n")
    assert _long_functions(tmp_path / "long.py") == [("long", 61)]
