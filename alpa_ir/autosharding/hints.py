"""User sharding hints on the plan's logical mesh (as Shardy keeps user shardings).

A hint (``lax.sharding_constraint`` or ``lax.reshard``, :mod:`alpa_ir.dialects.sharding_hint`)
names JAX mesh axes. They map onto the logical mesh's axes by name when the mesh has every
name the hint uses, else by position when the JAX mesh has as many axes as the logical mesh
(``("data", "model")`` onto a (2, 4) mesh's axes 0 and 1, or onto a pipeline stage's
(1, 4) mesh, where "data" then splits nothing). A logical axis of size 1 splits nothing and
is left out. A dimension the hint leaves free (``P.UNCONSTRAINED``) may take any split.

:func:`hint_specs` gives, for every hint op of a function, the specs the ILP may choose for
its value (the operand must arrive in that spec); anything else is a one-line error naming
the hint's source line: an axis the mesh does not have, a split that does not divide the
dimension, or two hints on one value that no spec satisfies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from alpa_ir.autosharding.graph import spec_options
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.dialects.sharding_hint import FREE, ShardingHint
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.text import location_text

HINT_COST_ATTR = "sharding.hint_cost"
"""On a planned function with hints: what they add to the ILP's objective (the plan
solved without them, in the same problem, costs that much less)."""

HINT_PARAMS = {"sharding_constraint": "sharding", "reshard": "dst_sharding"}
"""The hint primitives and the property that holds their :class:`ShardingHint`."""


def hint_of(op: Operation) -> ShardingHint | None:
    """The hint ``op`` carries, or None for any other op."""
    if not isinstance(op, LaxOp) or op.primitive_name not in HINT_PARAMS:
        return None
    attr = op.properties.get(HINT_PARAMS[op.primitive_name])
    return ShardingHint.from_attr(attr) if attr is not None else None


def _where(op: Operation) -> str:
    return location_text(op) or f"'{op.name}'"


def axis_map(used: set[str], theirs: Sequence[str], names: Sequence[str]) -> dict[str, int] | None:
    """Which axis of a mesh with axis ``names`` each JAX mesh axis stands for (a hint's,
    or a ``NamedSharding``'s mesh, of axes ``theirs``, of which the spec uses ``used``):
    by name when the mesh has every used name, else by position when both meshes have
    as many axes; None when neither."""
    if used <= set(names):
        return {n: list(names).index(n) for n in used}
    if len(theirs) == len(names):
        return {n: k for k, n in enumerate(theirs)}
    return None


def _axis_map(hint: ShardingHint, mesh: LogicalDeviceMesh, op: Operation) -> dict[str, int]:
    names = tuple(mesh.axis_names or ())
    used = {a for d in hint.dims for a in d if a != FREE}
    found = axis_map(used, hint.mesh_axes, names)
    if found is not None:
        return found
    have = ", ".join(f"{n} ({s})" for n, s in zip(names, mesh.shape, strict=True))
    raise AlpaError(
        f"{_where(op)}: sharding hint {hint.text()} names mesh axes "
        f"{', '.join(sorted(used - set(names)))} that the plan's mesh does not have "
        f"(its axes: {have}; the hint's mesh: {hint.mesh_text()})"
    )


def allowed_specs(op: Operation, mesh: LogicalDeviceMesh) -> list[ShardingSpec]:
    """The specs the hint of ``op`` allows for its value on ``mesh``."""
    hint = hint_of(op)
    assert hint is not None
    value = op.results[0]
    shape = shape_of(value.type)
    axis = _axis_map(hint, mesh, op)
    if len(hint.dims) > len(shape):
        raise AlpaError(
            f"{_where(op)}: sharding hint {hint.text()} has {len(hint.dims)} entries for a "
            f"value of rank {len(shape)}"
        )
    dims = list(hint.dims) + [()] * (len(shape) - len(hint.dims))
    fixed: list[tuple[int, ...] | None] = []
    for d, names in enumerate(dims):
        if names == (FREE,):
            fixed.append(None)
            continue
        axes = tuple(axis[n] for n in names if mesh.shape[axis[n]] > 1)
        parts = math.prod(mesh.shape[a] for a in axes)
        if shape[d] % parts:
            raise AlpaError(
                f"{_where(op)}: sharding hint {hint.text()} splits dimension {d} of size "
                f"{shape[d]} into {parts} parts, which does not divide it"
            )
        fixed.append(axes)
    if all(f is not None for f in fixed):
        return [ShardingSpec(tuple(f for f in fixed if f is not None))]
    return [
        s
        for s in spec_options(tuple(shape), mesh.shape)
        if all(f is None or s.dims[d] == f for d, f in enumerate(fixed))
    ]


def hint_specs(
    function: func.FuncOp, mesh: LogicalDeviceMesh
) -> dict[Operation, list[ShardingSpec]]:
    """Every hint op of ``function`` (top level) with the specs it allows (module docstring)."""
    out: dict[Operation, list[ShardingSpec]] = {}
    first: dict[SSAValue, Operation] = {}
    for op in function.body.block.ops:
        if hint_of(op) is None:
            continue
        specs = allowed_specs(op, mesh)
        out[op] = specs
        source = op.operands[0]
        other = first.setdefault(source, op)
        if other is not op and not set(out[other]) & set(specs):
            raise AlpaError(
                f"{_where(op)}: sharding hint {hint_of(op).text()} contradicts the hint "  # type: ignore[union-attr]
                f"{hint_of(other).text()} on the same value at {_where(other)}"  # type: ignore[union-attr]
            )
    return out
