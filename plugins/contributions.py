"""What plugins contribute beside plain objects: lazy names and named pipelines.

Imported by the built-in plugin and by the registry (which the built-in
plugin must not import: the registry loads it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from alpa_ir.errors import AlpaError


class PluginLoadError(AlpaError):
    """A plugin could not be imported or raised while contributing."""


@dataclass(frozen=True)
class NamedPipeline:
    """A pipeline registered by name (``alpa_ir_pipelines``): a pipeline string
    may name it like a pass (without options), and it stands for ``text``'s passes."""

    description: str
    text: str


@dataclass(frozen=True)
class Lazy:
    """A contribution named by module and attribute, imported on first use.

    As in xDSL's name-to-factory registries, a plugin may contribute these in
    place of the objects, so that loading the registry imports nothing:
    ``--list-passes`` reads a lazy pass's summary and options from its
    module's source. Calling a lazy factory (a backend, solver, cost model)
    imports and calls it; :meth:`PluginRegistry.get_pass` resolves a lazy pass."""

    module: str
    attribute: str

    def load(self) -> Any:
        try:
            return getattr(importlib.import_module(self.module), self.attribute)
        except (ImportError, AttributeError) as exc:
            raise PluginLoadError(
                f"cannot load {self.module}.{self.attribute}: {type(exc).__name__}: {exc}"
            ) from exc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


def resolved(value: Any) -> Any:
    """``value``, or what it names when it is :class:`Lazy`."""
    return value.load() if isinstance(value, Lazy) else value
