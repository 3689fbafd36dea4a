"""A user's manual shardings (Alpa's ``ManualShardingOption``) on a pipeline's stages.

The user names mesh axes, not mesh positions: an argument of the step carries
its ``PartitionSpec`` as axis names per dimension (:data:`USER_AXES_ATTR` on
``@main``'s argument), and each stage's mesh has its own axis names (Alpa's
``submesh_axis_names``). Once the step is outlined, every stage function that
takes such an argument gets it as a given spec on its own mesh, which
auto-sharding keeps; so does every activation a forward function receives
from another mesh's forward function, split as ``pipeline_intermediate_axes``
says. What the user leaves out stays with the ILP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, BlockArgument, SSAValue

from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.pipeline.stage_specs import _constrain, main_calls

USER_AXES_ATTR = "sharding.user_axes"
"""@main argument attribute: the user's spec as mesh axis names, one string per
dimension (``""`` unsplit, ``"a,b"`` split over axes a then b)."""

AxisNames = tuple[tuple[str, ...], ...]
"""Per dimension, the mesh axes that split it."""


def user_axes_attr(axes: AxisNames) -> ArrayAttr[StringAttr]:
    """``axes`` as the value of :data:`USER_AXES_ATTR`."""
    return ArrayAttr([StringAttr(",".join(a)) for a in axes])


def set_user_axes(function: func.FuncOp, axes: Sequence[AxisNames | None]) -> None:
    """Give ``function``'s arguments their user axes (None: none), keeping
    their other attributes."""
    old = function.arg_attrs.data if function.arg_attrs is not None else ()
    entries: list[dict[str, Attribute]] = [
        dict(old[k].data) if k < len(old) else {}  # type: ignore[attr-defined]
        for k in range(len(function.args))
    ]
    for k, a in enumerate(axes):
        if a is not None:
            entries[k][USER_AXES_ATTR] = user_axes_attr(a)
    function.arg_attrs = ArrayAttr([DictionaryAttr(e) for e in entries])


def user_axes_of(function: func.FuncOp, index: int) -> AxisNames | None:
    """The user axes of argument ``index`` of ``function``, if it has any."""
    attrs = function.arg_attrs
    if attrs is None or index >= len(attrs.data):
        return None
    entry = attrs.data[index].data.get(USER_AXES_ATTR)  # type: ignore[attr-defined]
    if not isinstance(entry, ArrayAttr):
        return None
    return tuple(tuple(a for a in s.data.split(",") if a) for s in entry.data)  # type: ignore[attr-defined]


def format_mesh_axis_names(names: Sequence[Sequence[str]]) -> str:
    """Per mesh, its axis names as ``shard-stages``' ``mesh-axis-names`` option
    (meshes separated by ``;``, names by ``,``)."""
    return ";".join(",".join(n) for n in names)


def parse_mesh_axis_names(text: str) -> tuple[tuple[str, ...], ...]:
    """The inverse of :func:`format_mesh_axis_names`."""
    return tuple(tuple(n for n in mesh.split(",") if n) for mesh in text.split(";")) if text else ()


def format_intermediate_axes(axes: Sequence[tuple[str, int]]) -> str:
    """``(mesh axis, dimension)`` pairs as ``shard-stages``' ``intermediate-axes``."""
    return ",".join(f"{name}:{dim}" for name, dim in axes)


def parse_intermediate_axes(text: str) -> tuple[tuple[str, int], ...]:
    """The inverse of :func:`format_intermediate_axes`."""
    out = []
    for part in text.split(",") if text else ():
        name, _, dim = part.rpartition(":")
        if not name or not dim.lstrip("-").isdigit():
            raise AlpaError(f"intermediate-axes: bad entry '{part}' (expected <mesh axis>:<dim>)")
        out.append((name, int(dim)))
    return tuple(out)


def _spec(
    axes: AxisNames,
    shape: Sequence[int],
    names: Sequence[str],
    mesh_shape: Sequence[int],
    where: str,
) -> ShardingSpec:
    """``axes`` as a spec on a mesh with axis ``names`` (axes of size 1 dropped)."""
    if len(axes) > len(shape):
        raise AlpaError(f"{where}: a spec of {len(axes)} dimensions for a rank-{len(shape)} array")
    dims: list[tuple[int, ...]] = []
    for d, dim_axes in enumerate(tuple(axes) + ((),) * (len(shape) - len(axes))):
        missing = [a for a in dim_axes if a not in names]
        if missing:
            raise AlpaError(
                f"{where}: mesh axis '{missing[0]}' is not an axis of its stage's mesh "
                f"(axes: {', '.join(names)})"
            )
        picked = tuple(names.index(a) for a in dim_axes if mesh_shape[names.index(a)] > 1)
        ways = math.prod(mesh_shape[a] for a in picked)
        if shape[d] % ways:
            raise AlpaError(f"{where}: splits dimension {d} of size {shape[d]} {ways} ways")
        dims.append(picked)
    return ShardingSpec(tuple(dims))


def constrain_user_axes(
    module: ModuleOp,
    mesh_axis_names: Sequence[Sequence[str]],
    intermediate_axes: Sequence[tuple[str, int]] = (),
) -> None:
    """Give every stage function of the outlined ``module`` the specs its user
    named (module docstring): each argument of ``@main`` with user axes, on
    the function's mesh, and each forward activation from another mesh's
    forward of rank 2 or more, split as ``intermediate_axes`` say.
    ``mesh_axis_names`` has the names of each mesh in the stages' order, or
    one entry for all."""
    from alpa_ir.dialects.pipeline import plan_stages

    main = main_function(module)
    stages = plan_stages(module)
    meshes: list[str] = []
    phase_of: dict[str, str] = {}
    for stage in stages:
        mesh = stage.mesh.root_reference.data
        if mesh not in meshes:
            meshes.append(mesh)
        phase_of.update((name, phase) for phase, name in stage.phase_functions())
    if len(mesh_axis_names) == 1:
        mesh_axis_names = list(mesh_axis_names) * len(meshes)
    if len(mesh_axis_names) != len(meshes):
        raise AlpaError(
            f"submesh_axis_names names {len(mesh_axis_names)} meshes, the pipeline has "
            f"{len(meshes)}"
        )
    names_of = dict(zip(meshes, (tuple(n) for n in mesh_axis_names), strict=True))
    forward_mesh: dict[SSAValue, str] = {}
    for call, name, function, mesh in main_calls(module):
        mesh_op = symbol_op(module, mesh, LogicalMeshOp)
        assert isinstance(mesh_op, LogicalMeshOp)
        names, mesh_shape = names_of.get(mesh, ()), tuple(mesh_op.mesh_shape)
        if len(names) != len(mesh_shape):
            raise AlpaError(
                f"the axis names ({', '.join(names)}) of the mesh of @{name} are "
                f"{len(names)}, its shape {list(mesh_shape)} has {len(mesh_shape)} axes"
            )
        chosen: dict[int, ShardingSpec] = {}
        for k, v in enumerate(call.operands):
            shape = tuple(v.type.get_shape())  # type: ignore[attr-defined]
            axes: AxisNames | None = None
            if isinstance(v, BlockArgument) and v.owner is main.body.block:
                axes = user_axes_of(main, v.index)
                where = f"in_axis_resources of step input {v.index} (in @{name})"
            elif forward_mesh.get(v, mesh) != mesh and len(shape) >= 2 and intermediate_axes:
                per_dim: list[tuple[str, ...]] = [()] * len(shape)
                for axis, dim in intermediate_axes:
                    if not 0 <= dim < len(shape):
                        raise AlpaError(
                            f"pipeline_intermediate_axes: dimension {dim} of a rank-{len(shape)} "
                            f"activation (argument {k} of @{name})"
                        )
                    per_dim[dim] = (*per_dim[dim], axis)
                axes = tuple(per_dim)
                where = f"pipeline_intermediate_axes (argument {k} of @{name})"
            if axes is not None:
                chosen[k] = _spec(axes, shape, names, mesh_shape, where)
        if chosen:
            _constrain(function, chosen)
        if phase_of.get(name) == "forward":
            forward_mesh.update((r, mesh) for r in call.results)
