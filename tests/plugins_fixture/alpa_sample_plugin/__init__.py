"""A sample third-party alpa_ir plugin: one pass, ``sample-count-ops``.

Registered through the ``alpa_ir`` entry-point group (see ../pyproject.toml)
or loaded with ``alpa-opt --load-plugin=alpa_sample_plugin``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.plugins.hookspecs import hookimpl


@dataclass(frozen=True)
class SampleCountOps(ModulePass):
    """Count the ops nested in the module into the module attribute ``<prefix>.op_count``."""

    name: ClassVar[str] = "sample-count-ops"

    prefix: str = field(default="sample", metadata={"help": "prefix of the attribute name"})

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        count = sum(1 for nested in op.walk() if nested is not op)
        op.attributes[f"{self.prefix}.op_count"] = IntegerAttr(count, 64)


@hookimpl
def alpa_ir_passes() -> Sequence[type[ModulePass]]:
    return [SampleCountOps]
