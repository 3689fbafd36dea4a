"""Where a traced step's gradients are computed, found without the user's help.

JAX names every equation it emits while differentiating: the forward pass
of ``jax.grad(f)`` runs under the name stack ``jvp(f)`` and the backward pass,
the transpose of its linear part, under ``transpose(jvp(f))``. The importer
records which top-level ops came from a transpose; this module turns that
into two markers (``pipeline_marker``, identities) that later passes read:

- ``kind = "backward"``, operand-free, just before the first op of each
  contiguous run of backward ops: ops before it (since the previous run) are
  the forward computation, ops after it the backward one;
- ``kind = "grad"`` right after the run, carrying every value the run
  computes that a later op or the return uses: the gradients. It is what
  ``alpa_ir.grad`` places by hand, so gradient accumulation and pipeline
  outlining work the same for ``jax.grad``, ``jax.value_and_grad``,
  ``jax.vjp`` and ``alpa_ir.grad``.

A run already followed by a user's ``grad`` marker (``alpa_ir.grad``) gets
only its ``backward`` marker.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.dialects.lax import PRIMITIVE_OPS, LaxOp

BACKWARD = "backward"
GRAD = "grad"


def is_marker(op: Operation, kind: str) -> bool:
    return (
        isinstance(op, LaxOp)
        and op.primitive_name == "pipeline_marker"
        and op.param("kind") == kind
    )


def make_marker(kind: str, operands: Sequence[SSAValue] = ()) -> Operation:
    """A ``pipeline_marker`` of ``kind`` carrying ``operands`` (results alias them)."""
    return PRIMITIVE_OPS["pipeline_marker"].create(
        operands=list(operands),
        result_types=[v.type for v in operands],
        properties={"kind": StringAttr(kind)},
    )


def _runs(ops: list[Operation], backward: set[Operation]) -> list[tuple[int, int]]:
    """[first, last] index ranges of consecutive backward ops (layer markers
    inside a run, the mirrored ones, and operand-free ops such as constants do
    not break it)."""
    runs: list[tuple[int, int]] = []
    start = -1
    last = -1
    for k, op in enumerate(ops):
        if op in backward:
            if start < 0:
                start = k
            last = k
        elif start >= 0 and not _is_layer_marker(op) and (op.operands or op.regions):
            runs.append((start, last))
            start = -1
    if start >= 0:
        runs.append((start, last))
    return runs


def _is_layer_marker(op: Operation) -> bool:
    return is_marker(op, "layer")


def mark_differentiation(block: Block, backward: set[Operation]) -> None:
    """Insert the ``backward`` and ``grad`` markers around each run of ``backward`` ops."""
    ops = list(block.ops)
    for first, last in reversed(_runs(ops, backward)):
        run = ops[first : last + 1]
        inside = set(run)
        after = ops[last + 1]
        if not is_marker(after, GRAD):
            gradients = [
                r
                for op in run
                for r in op.results
                if any(use.operation not in inside for use in r.uses)
            ]
            if gradients:
                marker = make_marker(GRAD, gradients)
                block.insert_op_after(marker, ops[last])
                for value, marked in zip(gradients, marker.results, strict=True):
                    for use in list(value.uses):
                        if use.operation is not marker and use.operation not in inside:
                            use.operation.operands[use.index] = marked
        block.insert_op_before(make_marker(BACKWARD), ops[first])
