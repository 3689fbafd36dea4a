"""The import graph of the package, function-local imports included.

Dependencies point one way (DESIGN.md): no import cycle, even one hidden in
a function body, and the runtime sits below the backends and the passes.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    dirs = _package_dirs()
    mapped = set(dirs.values())
    modules: dict[str, Path] = {}
    for package, folder in dirs.items():
        for path in folder.rglob("*.py"):
            # a mapped subpackage's folder is scanned under its own name
            if any(p in mapped and p != folder for p in path.parents if folder in p.parents):
                continue
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports anywhere in its text.
    ``from package import name`` goes to ``package.name`` when that is a module
    (importing a submodule), else to ``package``."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in modules]
                if len(targets) < len(subs):
                    targets.append(node.module)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_local_imports() -> None:
    graph = import_graph()
    assert len(graph) > 150
    # imported inside a method only
    assert "alpa_ir.backends.ray_host_pipeline" in graph["alpa_ir.backends.ray"]


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_imports_neither_passes_nor_backends() -> None:
    graph = import_graph()
    upward = sorted(
        (m, t)
        for m, targets in graph.items()
        if m.startswith("alpa_ir.runtime")
        for t in targets
        if t.startswith(("alpa_ir.passes", "alpa_ir.backends"))
    )
    assert upward == []


def test_a_cost_model_never_imports_a_pass() -> None:
    """The stage cost model asks the registry for the planner it needs."""
    graph = import_graph()
    upward = sorted(
        (m, t)
        for m, targets in graph.items()
        if m.startswith("alpa_ir.costs")
        for t in targets
        if t.startswith("alpa_ir.passes")
    )
    assert upward == []
