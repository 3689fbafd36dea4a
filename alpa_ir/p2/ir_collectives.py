"""The explicit collectives of a module, as P² sees them: kind, mesh axes, bytes per device."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects import func

from alpa_ir.dialects.sharding import CollectiveOp, spec_of_value
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.p2.semantics import P2_COLLECTIVES, Collective


@dataclass(frozen=True)
class MeshCollective:
    """A collective over mesh ``axes`` of ``nbytes`` per device (its operand's local block)."""

    kind: Collective
    axes: tuple[int, ...]
    nbytes: float


def local_bytes(op: CollectiveOp, function: func.FuncOp, mesh_shape: tuple[int, ...]) -> float:
    """Bytes of the operand's block on one device."""
    spec = spec_of_value(op.input, function)
    shape = shape_of(op.input.type)
    return float(math.prod(spec.local_shape(shape, mesh_shape)) * dtype_of(op.input.type).itemsize)


def check_axes(op: CollectiveOp, mesh_shape: tuple[int, ...], pass_name: str) -> None:
    bad = [a for a in op.mesh_axes if not 0 <= a < len(mesh_shape)]
    if bad:
        raise AlpaError(
            f"{pass_name}: {op.name} reduces over mesh axes {list(op.mesh_axes)}, out of range "
            f"for the {len(mesh_shape)}-d mesh {list(mesh_shape)}"
        )


def mesh_collectives(
    function: func.FuncOp, mesh_shape: tuple[int, ...], pass_name: str
) -> list[MeshCollective]:
    """The all-reduces, reduce-scatters and all-gathers of ``function`` (other collectives
    do not depend on the placement in P²'s model and are left out)."""
    found = []
    for op in function.body.walk():
        if not isinstance(op, CollectiveOp) or op.KIND not in P2_COLLECTIVES:
            continue
        kind = P2_COLLECTIVES[op.KIND]
        check_axes(op, mesh_shape, pass_name)
        found.append(MeshCollective(kind, op.mesh_axes, local_bytes(op, function, mesh_shape)))
    return found
