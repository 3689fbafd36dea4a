"""Predicted communication time of a planned module on its placed mesh, by the ``p2`` model.

Every explicit collective of @main (all-reduce, all-gather, reduce-scatter, all-to-all over
mesh axes) is priced by :class:`P2CostModel` on the mesh's device order, with the bytes the
cost model's protocol uses (the per-device full tensor: the all-gather's result, the other
collectives' operand). A synthesized all-reduce (``sharding.all_reduce_program``) is priced
as the all-reduce it implements, by its best program.
"""

from __future__ import annotations

from xdsl.dialects import func

from alpa_ir.autosharding.graph import value_local_bytes
from alpa_ir.dialects.sharding import CollectiveKind, CollectiveOp, spec_of_value
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.p2.cost_model import P2CostModel


def plan_comm_seconds(
    function: func.FuncOp, mesh: LogicalDeviceMesh, model: P2CostModel
) -> dict[str, float]:
    """Predicted seconds per iteration of the collectives of ``function``, by kind."""
    totals = dict.fromkeys(sorted(k.value for k in CollectiveKind), 0.0)
    for op in function.body.walk():
        if not isinstance(op, CollectiveOp) or op.KIND is None:
            continue
        kind = op.KIND.value
        value = op.output if op.KIND is CollectiveKind.ALL_GATHER else op.input
        nbytes = value_local_bytes(value, spec_of_value(value, function), mesh.shape)
        totals[kind] += model.seconds(kind, mesh, nbytes, op.mesh_axes)
    return totals
