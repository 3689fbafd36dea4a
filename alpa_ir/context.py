"""The xDSL context with every dialect the loaded plugins contribute."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func

from alpa_ir.plugins.registry import PluginRegistry, default_registry


def make_context(registry: PluginRegistry | None = None) -> Context:
    """A fresh context with builtin, func and all plugin dialects loaded.

    Unregistered ops and attributes are rejected, so a typo in IR text is an
    error that names the unknown op or dialect.
    """
    registry = registry or default_registry()
    ctx = Context(allow_unregistered=False)
    ctx.load_dialect(Builtin)
    ctx.load_dialect(Func)
    for dialect in registry.dialects.values():
        ctx.load_dialect(dialect)
    return ctx
