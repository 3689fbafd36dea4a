"""The communication a planned module predicts: its explicit collectives.

After ``auto-sharding`` (and ``reduce-scatter-rewrite``) every communication of
@main is a ``sharding`` collective op. :func:`predicted_collectives` lists
them with the per-device bytes of the full tensor (the all-reduce's operand,
the all-gather's result, the reduce-scatter's and all-to-all's operand) and
the bytes one device sends in a ring, the measure compared with the
collectives XLA compiled (``alpa_ir.hlo_collectives``). Ops that run once per
micro-batch count ``num_micro_batches`` times.

A synthesized all-reduce (``sharding.all_reduce_program``, from ``synthesize-reductions``)
counts step by step, as the SPMD executor runs it: its buffer is the operand's local block
padded to a multiple of the reduction group size; an AllReduce step is an all-reduce of the
buffer over the step's group size, a ReduceScatter a reduce-scatter (the buffer shrinks by
the group size), an AllGather an all-gather (it grows back), and a Reduce or Broadcast an
all-reduce of the buffer over its groups (``backends/program_collectives.py``). A program
whose steps leave devices at different buffer sizes runs on full-size buffers: every step
is an all-reduce of the whole padded buffer over its groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import func

from alpa_ir.autosharding.cost_model import collective_bytes_on_wire
from alpa_ir.autosharding.graph import value_local_bytes
from alpa_ir.dialects.sharding import (
    AllReduceProgramOp,
    CollectiveKind,
    CollectiveOp,
    spec_of_value,
)
from alpa_ir.dialects.types import dtype_of


@dataclass(frozen=True)
class PredictedCollective:
    kind: str
    bytes: int
    """Per device, the full tensor."""
    group_size: int
    count: int
    """How many times it runs per step (micro-batches)."""

    @property
    def wire_bytes(self) -> float:
        return self.count * collective_bytes_on_wire(self.kind, self.bytes, self.group_size)


def predicted_collectives(
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    repeated: frozenset[object] = frozenset(),
    num_micro_batches: int = 1,
) -> list[PredictedCollective]:
    """The collectives of a planned ``function``; ops in ``repeated`` (the
    per-micro-batch part of the step) count ``num_micro_batches`` times."""
    out = []
    for op in function.body.block.ops:
        out += op_collectives(op, function, mesh_shape, num_micro_batches if op in repeated else 1)
    return out


def op_collectives(
    op: object, function: func.FuncOp, mesh_shape: Sequence[int], count: int = 1
) -> list[PredictedCollective]:
    """The collectives one op of a planned ``function`` runs ``count`` times
    (none for ops that are no collective or span one device)."""
    if isinstance(op, AllReduceProgramOp):
        return program_collectives(op, function, mesh_shape, count)
    if not isinstance(op, CollectiveOp) or op.KIND is None:
        return []
    n = math.prod(mesh_shape[a] for a in op.mesh_axes)
    if n <= 1:
        return []
    value = op.output if op.KIND is CollectiveKind.ALL_GATHER else op.input
    nbytes = value_local_bytes(value, spec_of_value(value, function), mesh_shape)
    return [PredictedCollective(op.KIND.hlo, nbytes, n, count)]


_STEP_KINDS = {
    "AllReduce": "all-reduce",
    "Reduce": "all-reduce",
    "Broadcast": "all-reduce",
    "ReduceScatter": "reduce-scatter",
    "AllGather": "all-gather",
}


def program_collectives(
    op: AllReduceProgramOp, function: func.FuncOp, mesh_shape: Sequence[int], count: int
) -> list[PredictedCollective]:
    """The collectives the steps of a synthesized all-reduce run (see the module doc)."""
    k = math.prod(mesh_shape[a] for a in op.mesh_axes)
    local = value_local_bytes(op.input, spec_of_value(op.input, function), mesh_shape)
    itemsize = dtype_of(op.input.type).itemsize
    elements = -(-local // itemsize)
    buffer = -(-elements // k) * k * itemsize  # padded to a multiple of the group size
    out = []
    full_size = not op.keeps_one_size(math.prod(mesh_shape))
    for name, groups in op.step_list:
        m = max(len(g) for g in groups)
        if full_size:
            if m > 1:
                out.append(PredictedCollective("all-reduce", buffer, m, count))
            continue
        if name == "AllGather":
            buffer *= m
        if m > 1:
            out.append(PredictedCollective(_STEP_KINDS[name], buffer, m, count))
        if name == "ReduceScatter":
            buffer //= m
    return out
