"""The largest communication terms of a planned function: each collective it
runs, the bytes one device sends, and the op whose value it moves, named
with the user's line where the import recorded one (``why_text()``, the plan
pictures)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommTerm:
    """One collective of a planned function and the op whose value it moves."""

    kind: str
    wire_bytes: float
    """Bytes one device sends per call (ring algorithms)."""
    cause: str
    """The op that produces the value (its name, result type and strategy)."""

    def text(self) -> str:
        return f"{self.kind} of {self.wire_bytes:,.0f} B per device: {self.cause}"


def _describe(value: object) -> str:
    from pathlib import Path

    from xdsl.dialects.builtin import FileLineColLoc
    from xdsl.ir import BlockArgument, Operation

    from alpa_ir.dialects.sharding import STRATEGY_ATTR
    from alpa_ir.dialects.types import dtype_of, shape_of

    if isinstance(value, BlockArgument):
        hint = f" %{value.name_hint}" if value.name_hint else ""
        return f"argument {value.index}{hint} of the function, as it arrives"
    op = getattr(value, "owner", None)
    if not isinstance(op, Operation):
        return "a value of the function"
    name = getattr(op, "primitive_name", None) or op.name
    types = ", ".join(f"{dtype_of(r.type).name}{list(shape_of(r.type))}" for r in op.results[:1])
    strategy = op.attributes.get(STRATEGY_ATTR)
    chosen = f" (strategy {strategy.data})" if strategy is not None else ""  # type: ignore[attr-defined]
    where = ""
    location = getattr(op, "location", None)
    if isinstance(location, FileLineColLoc):  # the user's line, from the import
        where = f" at {Path(location.filename.data).name}:{location.line.data}"
    return f"{name} -> {types}{chosen}{where}"


def sharding_terms(function: object, mesh_shape: tuple[int, ...], top: int = 5) -> list[CommTerm]:
    """The ``top`` largest communication terms of a planned function: each
    collective, its bytes and the op whose value it moves (for a reshard or
    an all-gather, the producer of its input; a reduction's partial value is
    made by the op before it)."""
    from xdsl.dialects import func

    from alpa_ir.autosharding.plan_bytes import op_collectives

    assert isinstance(function, func.FuncOp)
    terms = []
    for op in function.body.block.ops:
        for c in op_collectives(op, function, mesh_shape):
            source = op.operands[0] if op.operands else None
            terms.append(CommTerm(c.kind, c.wire_bytes, _describe(source)))
    return sorted(terms, key=lambda t: -t.wire_bytes)[:top]


__all__ = ["CommTerm", "sharding_terms"]
