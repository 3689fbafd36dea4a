"""A structural hash of a function: identical layer ranges (the same ops
on the same shapes, whatever their value names and the values of their
constants) are costed once.

:func:`function_fingerprint` hashes a function; :class:`Fingerprint` builds
the same hash op by op, for a function that is not built yet (a layer range
of a step: :meth:`alpa_ir.pipeline.layer_ranges.LayerRanges.fingerprint`),
with the values as they are before the copy."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.ir import Attribute, Block, Operation, SSAValue

from alpa_ir.dialects.lax import ConstantOp
from alpa_ir.dialects.mesh import MESH_ATTR


class Fingerprint:
    """The fingerprint of a function built op by op: :meth:`arguments` for
    its block's arguments, then :meth:`op` for each op of its block in order
    (the return op last), :meth:`same_as` where a value stands for another,
    then :meth:`digest`."""

    def __init__(
        self, function_type: Attribute, printed: dict[Attribute, str] | None = None
    ) -> None:
        self._ids: dict[SSAValue, str] = {}
        # types and attributes recur: each printed once (``printed``: a table
        # shared with other fingerprints, such as those of one step's layers)
        self._printed = {} if printed is None else printed
        self._parts: list[str] = [self._text(function_type)]
        self._count = 0  # ops of the function's block so far

    def _text(self, attr: Attribute) -> str:
        found = self._printed.get(attr)
        if found is None:
            found = self._printed[attr] = str(attr)
        return found

    def arguments(self, values: Sequence[SSAValue], prefix: str = "") -> None:
        """The block's arguments are ``values`` (typed as they are)."""
        for k, value in enumerate(values):
            self._ids[value] = f"{prefix}a{k}"
        self._parts.append(f"block {prefix} {[self._text(v.type) for v in values]}")

    def same_as(self, value: SSAValue, other: SSAValue) -> None:
        """``value`` stands for ``other`` (unless it stands for something already)."""
        if value not in self._ids and other in self._ids:
            self._ids[value] = self._ids[other]

    def op(self, op: Operation, index: int | None = None, prefix: str = "") -> None:
        """The next op of the block (``index``: its position in a region's block)."""
        if index is None:
            index, self._count = self._count, self._count + 1
        ids, text = self._ids, self._text
        for k, res in enumerate(op.results):
            ids[res] = f"{prefix}{index}.{k}"
        operands = [ids.get(v, "?") for v in op.operands]
        # a constant's value (``data``) changes no cost: blocks whose dropout draws
        # from a seed of their own (Hugging Face GPT-2's twelve) are costed once
        props = sorted(
            (k, text(v))
            for k, v in op.properties.items()
            if not (isinstance(op, ConstantOp) and k == "data")
        )
        attrs = sorted(
            (k, text(v))
            for k, v in op.attributes.items()
            if not k.startswith("sharding.") and k != MESH_ATTR
        )
        self._line(op.name, operands, props, attrs, [text(r.type) for r in op.results])
        for r, region in enumerate(op.regions):
            for b, inner in enumerate(region.blocks):
                self.block(inner, f"{prefix}{index}r{r}b{b}/")

    def returned(self, values: Sequence[SSAValue]) -> None:
        """The block ends returning ``values``."""
        self._count += 1
        self._line(func.ReturnOp.name, [self._ids.get(v, "?") for v in values], [], [], [])

    def _line(
        self,
        name: str,
        operands: list[str],
        props: list[tuple[str, str]],
        attrs: list[tuple[str, str]],
        result_types: list[str],
    ) -> None:
        """One op's line: the one place that says how an op reads."""
        self._parts.append(f"{name} {operands} {props} {attrs} {result_types}")

    def block(self, block: Block, prefix: str = "") -> None:
        """A whole block (a region's, or the function's)."""
        self.arguments(block.args, prefix)
        for i, op in enumerate(block.ops):
            self.op(op, i, prefix)

    def digest(self) -> str:
        return hashlib.sha256("\n".join(self._parts).encode()).hexdigest()


def function_fingerprint(function: func.FuncOp) -> str:
    """A hash of the function's structure: argument and result types, and every
    op's name, properties, attributes (but plan annotations ``sharding.*`` and
    ``mesh.mesh``), result types and operand wiring, regions included. Value
    names, constants' values, the function's name and its own attributes do
    not count."""
    fingerprint = Fingerprint(function.function_type)
    fingerprint.block(function.body.block)
    return fingerprint.digest()
