"""Floating-point operations of one IR op, for layer clustering and stage costs.

Counts follow the usual convention (a multiply-add is 2 FLOPs):

- ``dot_general``: 2 · batch · lhs-free · rhs-free · contracted sizes;
- ``conv_general_dilated``: 2 · output elements · kernel window · input
  features per group;
- element-wise ops and reductions: one FLOP per element of the larger of
  the operands and results;
- data movement (reshape, transpose, broadcast, slice, gather, ...), markers,
  constants and collectives: 0.

Ops with regions (``while``, ``scan``, ``cond``) count their bodies once
(trip counts are not known statically).
"""

from __future__ import annotations

import math

from xdsl.ir import Operation

from alpa_ir.dialects.lax import LaxOp
from alpa_ir.ir_types import shape_of

MOVEMENT_PRIMITIVES = frozenset(
    {
        "broadcast_in_dim",
        "reshape",
        "transpose",
        "squeeze",
        "expand_dims",
        "slice",
        "dynamic_slice",
        "dynamic_update_slice",
        "gather",
        "concatenate",
        "pad",
        "rev",
        "iota",
        "copy",
        "copy_p",
        "convert_element_type",
        "pipeline_marker",
        "stop_gradient",
        "select_n",
    }
)


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _dot_flops(op: LaxOp) -> float:
    (lhs_contract, _), (lhs_batch, _) = op.param("dimension_numbers")
    del lhs_batch  # batch dimensions are part of the output already
    lhs = shape_of(op.operands[0].type)
    out = shape_of(op.results[0].type)
    contracted = math.prod(lhs[d] for d in lhs_contract)
    return 2.0 * _elements(out) * contracted


def _conv_flops(op: LaxOp) -> float:
    numbers = op.param("dimension_numbers")
    rhs = shape_of(op.operands[1].type)
    out = shape_of(op.results[0].type)
    rhs_spec = numbers.rhs_spec
    # rhs_spec = (out feature dim, in feature dim, spatial dims...)
    in_features = rhs[rhs_spec[1]]
    window = math.prod(rhs[d] for d in rhs_spec[2:])
    return 2.0 * _elements(out) * in_features * window


def op_flops(op: Operation) -> float:
    """FLOPs of ``op`` (one execution, regions counted once)."""
    nested = sum(
        op_flops(inner) for region in op.regions for block in region.blocks for inner in block.ops
    )
    if not isinstance(op, LaxOp):
        return float(nested)
    name = op.primitive_name
    if name == "dot_general":
        return _dot_flops(op) + nested
    if name == "conv_general_dilated":
        return _conv_flops(op) + nested
    if name in MOVEMENT_PRIMITIVES or op.regions:
        return float(nested)
    sizes = [
        _elements(shape_of(v.type))
        for v in (*op.operands, *op.results)
        if hasattr(v.type, "get_shape")
    ]
    return float(max(sizes, default=0))
