"""Checks of sharding annotations against what they annotate.

A sharding spec is valid only with respect to its function's logical mesh
and the tensor it annotates: every mesh axis it names must exist (``S7`` on
a 2-d mesh does not), its rank must be the tensor's, and the shards of each
dimension must divide it. Explicit collectives must name existing mesh axes
and tensor dimensions. These checks need the module (the mesh of each
function), so they run after every op's own verifier (``verify_module``):
each failure names the op and why in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.ir import Attribute, Operation

from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    SPECS_ATTR,
    CollectiveOp,
    ShardingSpec,
    ShardingSpecAttr,
)


class ShardingCheckError(Exception):
    """A sharding annotation that does not fit; ``op`` is where it is."""

    def __init__(self, op: Operation, message: str) -> None:
        super().__init__(message)
        self.op = op


def _meshes(module: ModuleOp) -> dict[str, tuple[int, ...]]:
    return {
        op.sym_name.data: tuple(op.mesh_shape) for op in module.ops if isinstance(op, LogicalMeshOp)
    }


def _function_mesh(function: func.FuncOp, meshes: dict[str, tuple[int, ...]]) -> Any:
    ref = function.attributes.get(MESH_ATTR)
    if ref is None:
        return None
    name = (
        ref.root_reference.data
        if isinstance(ref, SymbolRefAttr)
        else (ref.data if isinstance(ref, StringAttr) else None)
    )
    if name not in meshes:
        raise ShardingCheckError(function, f"{MESH_ATTR} names no mesh.logical_mesh @{name}")
    return meshes[name]


def check_spec(spec: ShardingSpec, shape: tuple[int, ...], mesh: tuple[int, ...]) -> str | None:
    """Why ``spec`` cannot annotate a tensor of ``shape`` on ``mesh`` (None when it can)."""
    axes = spec.used_axes()
    bad = [a for a in axes if not 0 <= a < len(mesh)]
    if bad:
        return f"spec {spec} names mesh axis {bad[0]}, the mesh {list(mesh)} has {len(mesh)} axes"
    if len(set(axes)) != len(axes):
        return f"spec {spec} uses a mesh axis twice"
    if spec.rank != len(shape):
        return f"spec {spec} has rank {spec.rank}, the tensor {list(shape)} has rank {len(shape)}"
    for d, size in enumerate(shape):
        ways = spec.num_shards(mesh, d)
        if size % ways:
            return (
                f"spec {spec} splits dimension {d} of size {size} into {ways} shards, "
                "which does not divide it"
            )
    return None


def _shape(ty: Attribute) -> tuple[int, ...] | None:
    get = getattr(ty, "get_shape", None)
    return tuple(int(d) for d in get()) if get is not None else None


def _annotations(function: func.FuncOp) -> Iterator[tuple[Operation, ShardingSpec, Any]]:
    """(op to blame, spec, annotated type) of every spec in ``function``."""
    for attrs, types in (
        (function.arg_attrs, function.function_type.inputs.data),
        (function.res_attrs, function.function_type.outputs.data),
    ):
        if attrs is None:
            continue
        for entry, ty in zip(attrs.data, types, strict=False):
            spec = entry.data.get(SPEC_ATTR)  # type: ignore[attr-defined]
            if isinstance(spec, ShardingSpecAttr):
                yield function, spec.spec, ty
    for op in function.body.walk():
        specs = op.attributes.get(SPECS_ATTR)
        if specs is None:
            continue
        values = list(specs.data)  # type: ignore[attr-defined]
        if len(values) != len(op.results):
            raise ShardingCheckError(
                op, f"{SPECS_ATTR} holds {len(values)} specs for {len(op.results)} results"
            )
        for spec, result in zip(values, op.results, strict=True):
            if isinstance(spec, ShardingSpecAttr):
                yield op, spec.spec, result.type


def check_shardings(module: ModuleOp) -> None:
    """Raise :class:`ShardingCheckError` at the first annotation that does not fit."""
    meshes = _meshes(module)
    for function in module.ops:
        if not isinstance(function, func.FuncOp):
            continue
        mesh = _function_mesh(function, meshes)
        if mesh is None:
            continue
        for op, spec, ty in _annotations(function):
            shape = _shape(ty)
            if shape is None:
                continue
            reason = check_spec(spec, shape, mesh)
            if reason is not None:
                raise ShardingCheckError(op, reason)
        for op in function.body.walk():
            if isinstance(op, CollectiveOp):
                _check_collective(op, mesh)


def _check_collective(op: CollectiveOp, mesh: tuple[int, ...]) -> None:
    if op.properties.get("axes") is None:  # a reshard: specs only, checked above
        return
    bad = [a for a in op.mesh_axes if not 0 <= a < len(mesh)]
    if bad:
        raise ShardingCheckError(
            op, f"mesh axis {bad[0]} does not exist on the {len(mesh)}-d mesh {list(mesh)}"
        )
    shape = _shape(op.input.type) or ()
    for name in ("dim", "src_dim", "dst_dim"):
        if name in op.properties:
            d = op.int_prop(name)
            if not 0 <= d < len(shape):
                raise ShardingCheckError(
                    op, f"{name} {d} is out of range for the rank-{len(shape)} operand"
                )
