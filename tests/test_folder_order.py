"""Folders point one way (DESIGN.md): each concept folder of the package
imports only folders below it in :data:`ORDER`, function-local imports
included (the module graph of :mod:`test_import_graph`). The plugin registry
(its tables and hook specs) sits at the bottom, the built-in plugin, which
registers everything, at the top."""

from __future__ import annotations

from test_import_graph import cycles, import_graph

ORDER: tuple[tuple[str, ...], ...] = (
    ("errors", "dialects", "solvers", "algorithms", "plugins"),
    ("ir",),
    ("passmanager", "hardware", "frontend"),
    ("autosharding", "models"),
    ("costs", "p2"),
    ("pipeline",),
    ("runtime",),
    ("backends",),
    ("plots", "passes"),
    ("api",),
    ("compat",),
    ("plugins.builtin", "alpa_ir", "tools", "testing", "util", "device_mesh", "model"),
)
"""Ranks, lowest first; a folder may import its own rank and those below."""

PLUGIN_LOADING = {("alpa_ir.plugins.registry", "alpa_ir.plugins.builtin")}
"""The default registry loads the built-in plugin before the installed ones:
the one import that points up by design."""


def folder_of(module: str) -> str:
    """``alpa_ir.<folder>.…``; the built-in plugin is a folder of its own and
    ``alpa_ir`` itself (the facade) and ``alpa_ir.errors`` are their own."""
    if module == "alpa_ir.plugins.builtin":
        return "plugins.builtin"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _rank() -> dict[str, int]:
    return {folder: k for k, folders in enumerate(ORDER) for folder in folders}


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    rank = _rank()
    return {
        (m, t)
        for m, targets in graph.items()
        for t in targets
        if rank[folder_of(t)] > rank[folder_of(m)]
    }


def test_every_folder_has_a_rank() -> None:
    folders = {folder_of(m) for m in import_graph()}
    assert folders - set(_rank()) == set()


def test_folders_point_one_way() -> None:
    graph = import_graph()
    assert upward_imports(graph) == PLUGIN_LOADING


def test_no_folder_cycle() -> None:
    """Apart from loading the built-in plugin, the folders form no cycle."""
    graph = import_graph()
    folders: dict[str, set[str]] = {}
    for m, targets in graph.items():
        for t in targets:
            if (m, t) not in PLUGIN_LOADING and folder_of(m) != folder_of(t):
                folders.setdefault(folder_of(m), set()).add(folder_of(t))
            folders.setdefault(folder_of(t), set())
    assert cycles(folders) == []


def test_an_upward_import_is_found() -> None:
    graph = {"alpa_ir.ir.text": {"alpa_ir.api.parallel"}, "alpa_ir.api.parallel": set()}
    assert upward_imports(graph) == {("alpa_ir.ir.text", "alpa_ir.api.parallel")}
