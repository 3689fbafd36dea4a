"""Context parallelism as Llama 3 ran it, forced on a layer function by hints.

Context parallelism (Dubey et al. 2024, §3.3.2) splits the sequence of every
activation over a context-parallel group; in attention each device keeps its
queries' rows of the scores and gathers the keys and values (all-gather over
the context axis), so a device holds ``1 / context`` of the ``[.., S, S]``
scores. :func:`batch_specs <alpa_ir.autosharding.megatron_specs.batch_specs>`
splits the layer's activation arguments so; inside the layer the ILP chooses,
and at sequence 131,072 on an ``(8, 16, 8)`` stage mesh it may stop at its time
limit with the scores whole (a plan thousands of GiB over a device).

:func:`with_context_hints` makes the published plan's choice explicit, as
:func:`~alpa_ir.autosharding.megatron_specs.megatron_specs` fixes the tensor
axis: every value whose last two dimensions are both the sequence (the
scores, the mask, the probabilities and their gradients) gets a sharding
hint (``lax.sharding_constraint``, kept by the ILP as a user's hint): its
next-to-last dimension (the queries) over the context axis, and on a rank-4
``[batch, heads, S, S]`` value the batch over the data axis and the heads
over the tensor axis, each where the axis size divides the dimension; the
last dimension (the keys) whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func

from alpa_ir.dialects.lax import PRIMITIVE_OPS, LaxOp
from alpa_ir.dialects.sharding_hint import ShardingHint
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError

AXIS_NAMES = ("data", "context", "tensor")
"""The hints' mesh axes (matched to the stage mesh's axes by position)."""


def context_hint(
    shape: Sequence[int], mesh_shape: Sequence[int], seq_len: int
) -> ShardingHint | None:
    """The hint of a value of ``shape`` on a ``(data, context, tensor)`` mesh
    (module docstring), None if its last two dimensions are not the sequence."""
    if len(shape) < 2 or shape[-1] != seq_len or shape[-2] != seq_len:
        return None
    data, context, tensor = (int(n) for n in mesh_shape)
    dims: list[tuple[str, ...]] = [() for _ in shape]
    if context > 1 and seq_len % context == 0:
        dims[-2] = ("context",)
    if len(shape) == 4:
        if data > 1 and shape[0] % data == 0:
            dims[0] = ("data",)
        if tensor > 1 and shape[1] % tensor == 0:
            dims[1] = ("tensor",)
    return ShardingHint(AXIS_NAMES, (data, context, tensor), tuple(dims))


def with_context_hints(
    function: func.FuncOp, mesh_shape: Sequence[int], seq_len: int
) -> tuple[func.FuncOp, int]:
    """A copy of ``function`` with a context-parallel hint after every op
    result of its top-level block whose last two dimensions are the sequence
    ``seq_len`` (module docstring), on a ``(data, context, tensor)`` stage mesh
    ``mesh_shape``; and the number of hints."""
    if len(mesh_shape) != 3:
        raise AlpaError(
            f"context hints: the stage mesh must be (data, context, tensor), got {list(mesh_shape)}"
        )
    if seq_len < 1:
        raise AlpaError(f"context hints: the sequence length must be positive, got {seq_len}")
    clone = function.clone()
    block = clone.body.block
    constraint = PRIMITIVE_OPS["sharding_constraint"]
    count = 0
    for op in list(block.ops):
        if isinstance(op, LaxOp) and op.primitive_name == "sharding_constraint":
            continue
        for result in op.results:
            hint = context_hint(shape_of(result.type), mesh_shape, seq_len)
            if hint is None or not result.uses:
                continue
            hinted = constraint.create(
                operands=[result],
                result_types=[result.type],
                properties={"sharding": hint.to_attr()},
            )
            hinted.location = op.location
            block.insert_op_after(hinted, op)
            result.replace_uses_with_if(
                hinted.results[0], lambda use, new=hinted: use.operation is not new
            )
            count += 1
    return clone, count


__all__ = ["AXIS_NAMES", "context_hint", "with_context_hints"]
