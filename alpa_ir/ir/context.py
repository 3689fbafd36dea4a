"""The xDSL context with every dialect the loaded plugins contribute, and the
plugin registry those dialects came from (passes look up solvers, cost
models and rules in it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func

from alpa_ir.plugins.contributions import Lazy
from alpa_ir.plugins.registry import PluginRegistry, default_registry


@dataclass
class AlpaContext(Context):
    """An xDSL context that also carries the plugin registry."""

    registry: PluginRegistry | None = field(default=None)
    statistics: list[Any] | None = field(default=None)
    """While a pass manager runs: the pass statistics recorded so far."""
    costing_workers: Any = field(default=None)
    """Worker processes its owner started ahead for ``construct-stages``' cost
    table, an ``alpa_ir.costs.costing_workers.StartedWorkers`` (not named here:
    the costs layer imports the IR, not the other way); the owner ends those
    not taken."""

    def clone(self) -> AlpaContext:
        base = super().clone()
        return AlpaContext(
            base.allow_unregistered,
            base._loaded_dialects,
            base._loaded_ops,
            base._loaded_attrs,
            base._loaded_types,
            base._registered_dialects,
            registry=self.registry,
            costing_workers=self.costing_workers,
        )


def make_context(registry: PluginRegistry | None = None) -> AlpaContext:
    """A fresh context with builtin, func and all plugin dialects loaded.

    Unregistered ops and attributes are rejected, so a typo in IR text is an
    error that names the unknown op or dialect.
    """
    registry = registry or default_registry()
    ctx = AlpaContext(allow_unregistered=False, registry=registry)
    ctx.load_dialect(Builtin)
    ctx.load_dialect(Func)
    for name, dialect in registry.dialects.items():
        if isinstance(dialect, Lazy):  # loaded when the parser first meets it
            ctx.register_dialect(name, dialect.load)
        else:
            ctx.load_dialect(dialect)
    return ctx
