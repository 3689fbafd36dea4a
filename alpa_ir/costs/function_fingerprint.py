"""A structural hash of a function: identical layer ranges (the same ops
on the same shapes, whatever their value names and the values of their
constants) are costed once."""

from __future__ import annotations

import hashlib

from xdsl.dialects import func
from xdsl.ir import Attribute, Block, SSAValue

from alpa_ir.dialects.lax import ConstantOp
from alpa_ir.dialects.mesh import MESH_ATTR


def function_fingerprint(function: func.FuncOp) -> str:
    """A hash of the function's structure: argument and result types, and every
    op's name, properties, attributes (but plan annotations ``sharding.*`` and
    ``mesh.mesh``), result types and operand wiring, regions included. Value
    names, constants' values, the function's name and its own attributes do
    not count."""
    ids: dict[SSAValue, str] = {}
    parts: list[str] = [str(function.function_type)]
    printed: dict[Attribute, str] = {}  # types and attributes recur: printed once

    def text(attr: Attribute) -> str:
        found = printed.get(attr)
        if found is None:
            found = printed[attr] = str(attr)
        return found

    def visit_block(block: Block, prefix: str) -> None:
        for k, arg in enumerate(block.args):
            ids[arg] = f"{prefix}a{k}"
        parts.append(f"block {prefix} {[text(a.type) for a in block.args]}")
        for i, op in enumerate(block.ops):
            for k, res in enumerate(op.results):
                ids[res] = f"{prefix}{i}.{k}"
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
            parts.append(
                f"{op.name} {operands} {props} {attrs} {[text(r.type) for r in op.results]}"
            )
            for r, region in enumerate(op.regions):
                for b, inner in enumerate(region.blocks):
                    visit_block(inner, f"{prefix}{i}r{r}b{b}/")

    visit_block(function.body.block, "")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
