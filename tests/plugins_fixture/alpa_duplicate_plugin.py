"""A plugin whose pass name clashes with alpa_sample_plugin's ``sample-count-ops``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from alpa_ir.plugins.hookspecs import hookimpl


@dataclass(frozen=True)
class OtherCountOps(ModulePass):
    """Another pass that claims the name ``sample-count-ops``."""

    name: ClassVar[str] = "sample-count-ops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        del ctx, op


@hookimpl
def alpa_ir_passes() -> Sequence[type[ModulePass]]:
    return [OtherCountOps]
