"""The layout the style guide asks for, checked on the source: no import cycle among
creditflow's modules, thin Kedro nodes, and ``.backward()`` only in the two trainers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "creditflow"
MAX_NODE_BODY_LINES = 20
# The GRPO update and the one supervised trainer; every other loop goes through them.
BACKWARD_HOMES = {"training/grpo.py", "training/supervised.py"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """creditflow modules ``path`` imports when it is imported (module level, not under
    ``if TYPE_CHECKING``). ``from pkg import submodule`` depends on the submodule; the package
    counts only when a name is taken from its ``__init__``."""
    found = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("creditflow"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("creditflow")}
    return {m for m in found if m in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_among_creditflow_modules():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_kedro_node_bodies_are_thin():
    long = []
    for path in sorted(PACKAGE.glob("pipelines/*/nodes.py")):
        for function in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(function, ast.FunctionDef) or function.name.startswith("_"):
                continue
            body = function.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            lines = body[-1].end_lineno - body[0].lineno + 1
            if lines > MAX_NODE_BODY_LINES:
                long.append(f"{path.parent.name}.{function.name}: {lines} lines")
    assert long == []


def test_backward_is_called_only_in_the_two_trainers():
    callers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\.backward\(", path.read_text(encoding="utf-8"))
    }
    assert callers == BACKWARD_HOMES
