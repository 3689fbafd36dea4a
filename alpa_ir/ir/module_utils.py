"""Small helpers to find things in a module."""

from __future__ import annotations

from collections.abc import Iterator

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Operation

from alpa_ir.errors import AlpaError


def main_function(module: ModuleOp, name: str = "main") -> func.FuncOp:
    """The ``func.func @main`` (or ``@name``) of a module."""
    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == name:
            return op
    raise AlpaError(f"module has no function @{name}")


def num_ops(function: func.FuncOp) -> int:
    """The ops of ``function``'s body (those nested in their regions not counted)."""
    return sum(1 for _ in function.body.block.ops)


def top_level_ops(module: ModuleOp, kind: type[Operation]) -> Iterator[Operation]:
    for op in module.ops:
        if isinstance(op, kind):
            yield op


def symbol_op(module: ModuleOp, name: str, kind: type[Operation] | None = None) -> Operation:
    """The top-level op defining symbol ``@name``."""
    for op in module.ops:
        sym = op.properties.get("sym_name") or op.attributes.get("sym_name")
        if (
            isinstance(sym, StringAttr)
            and sym.data == name
            and (kind is None or isinstance(op, kind))
        ):
            return op
    raise AlpaError(f"module has no symbol @{name}")
