"""FLOPs and memory traffic of ``lax`` ops, globally or per device of a sharded plan.

Counting convention (as the models' analytic ``flops``): 2 FLOPs per
multiply-add of a contraction, 1 per output element of an element-wise op, 1
per input element of a reduction; layout, indexing and marker ops move data
and do no arithmetic. A ``dot_general`` costs ``2·Πbatch·Πlhs_free·Πcontract·Πrhs_free``;
a ``conv_general_dilated`` ``2·out_elements·Πkernel / out_features`` (the
kernel's input features are already divided by the feature groups). Ops with
regions (``while``, ``cond``, ``scan``) count their bodies once, ``scan``
``length`` times.

With ``shapes`` (a function from a value to the shape it has on one device),
the same formulas give the work of one device: the local blocks of a
contraction's operands, the local result of an element-wise op. Replicated
computation therefore counts in full on every device, as it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from xdsl.ir import Operation, SSAValue

from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.lax_primitives import OpKind
from alpa_ir.dialects.types import dtype_of, shape_of

Shapes = Callable[[SSAValue], tuple[int, ...]]


def _global_shape(value: SSAValue) -> tuple[int, ...]:
    return tuple(shape_of(value.type))


def op_flops(op: Operation, shapes: Shapes = _global_shape) -> float:
    """FLOPs of one op (its regions included), see the module docstring."""
    body = sum(_block_flops(r.blocks[0].ops, shapes) for r in op.regions if r.blocks)
    if body and isinstance(op, LaxOp) and op.primitive_name == "scan":
        body *= int(op.param("length"))
    if not isinstance(op, LaxOp):
        return float(body)
    name, kind = op.primitive_name, op.kind
    if name == "dot_general":
        lhs, rhs = shapes(op.operands[0]), shapes(op.operands[1])
        (lc, rc), (lb, rb) = op.param("dimension_numbers")
        lhs_rest = [s for d, s in enumerate(lhs) if d not in lc and d not in lb]
        rhs_rest = [s for d, s in enumerate(rhs) if d not in rc and d not in rb]
        work = (
            math.prod(lhs[d] for d in lb)
            * math.prod(lhs[d] for d in lc)
            * math.prod(lhs_rest)
            * math.prod(rhs_rest)
        )
        return 2.0 * work + body
    if name == "conv_general_dilated":
        rhs, out = shapes(op.operands[1]), shapes(op.results[0])
        out_features = rhs[op.param("dimension_numbers").rhs_spec[0]]
        # an input dilated by d (the input gradient of a strided convolution,
        # a transposed convolution) is mostly inserted zeros: of each window,
        # one position in prod(d) meets an input value, and only those count
        dilated = math.prod(op.param("lhs_dilation") or (1,))
        return 2.0 * math.prod(out) * math.prod(rhs) / max(out_features, 1) / dilated + body
    if kind is OpKind.ELEMENTWISE:
        return float(sum(math.prod(shapes(r)) for r in op.results)) + body
    if kind is OpKind.REDUCTION:
        return float(sum(math.prod(shapes(v)) for v in op.operands)) + body
    return float(body)


def _block_flops(ops: Iterable[Operation], shapes: Shapes) -> float:
    return sum(op_flops(op, shapes) for op in ops)


def function_flops(function: Operation, shapes: Shapes = _global_shape) -> float:
    """FLOPs of a ``func.func`` body (every op, regions included)."""
    return sum(_block_flops(r.blocks[0].ops, shapes) for r in function.regions if r.blocks)


def op_bytes(op: Operation, shapes: Shapes = _global_shape) -> float:
    """Bytes an op reads and writes in device memory: its tensor operands and
    results (no fusion assumed; layout-free markers and constants move nothing)."""
    if isinstance(op, LaxOp) and op.kind is OpKind.MARKER:
        return 0.0
    total = 0.0
    for value in (*op.operands, *op.results):
        try:
            itemsize = dtype_of(value.type).itemsize
        except Exception:  # a non-tensor value (a token) moves nothing
            continue
        total += math.prod(shapes(value)) * itemsize
    return total


__all__ = ["function_flops", "op_bytes", "op_flops"]
