"""The library API: run modules on a backend."""

from __future__ import annotations

from typing import Any

from xdsl.dialects.builtin import ModuleOp

from alpa_ir.plugins.registry import PluginRegistry, default_registry


def compile_module(
    module: ModuleOp, *, backend: str = "xla", registry: PluginRegistry | None = None
) -> Any:
    """Compile ``module`` for ``backend``; the result is called with the user's arguments."""
    registry = registry or default_registry()
    return registry.get("backends", backend)().compile(module)


def execute(
    module: ModuleOp, *args: Any, backend: str = "xla", registry: PluginRegistry | None = None
) -> Any:
    """Run ``module`` on ``args`` (the user's pytrees) and return the user's pytrees."""
    return compile_module(module, backend=backend, registry=registry)(*args)
