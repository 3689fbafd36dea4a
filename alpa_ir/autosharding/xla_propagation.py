"""Specs by XLA's sharding propagation alone (Alpa's ``enable_auto_sharding=False``).

With auto-sharding off, Alpa shards each stage by the specs the user gave
and lets XLA's SPMD partitioner propagate them: no ILP runs. Here a stage
function's arguments keep the spec they were given (the user's, one carried
from an earlier function on the same mesh, the intermediate split) and are
replicated otherwise (pjit's convention, as in Alpa's pipelines); XLA then
compiles the function with those input shardings and its results left
unspecified, and the result shardings its propagation chose are written on
the function's results. Its other values stay unannotated (no
``sharding.objective``): the backend compiles it again the same way, and
the pipeline moves its results between meshes by the specs written here.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, UnitAttr
from xdsl.ir import Attribute

from alpa_ir.dialects.attrs import PROPAGATED_ATTR
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.sharding import SPEC_ATTR, ShardingSpec, ShardingSpecAttr
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.jax_export import eval_block


def _partition_spec(spec: ShardingSpec, names: Sequence[str]) -> PartitionSpec:
    """``spec`` as JAX's PartitionSpec over the axis ``names`` (a copy of
    ``runtime.devices.partition_spec``: the runtime sits above the planner's
    libraries, which may not import it)."""
    return PartitionSpec(
        *[None if not d else tuple(names[a] for a in d) if len(d) > 1 else names[d[0]]
          for d in spec.dims]
    )  # fmt: skip


def _arg_specs(function: func.FuncOp) -> list[ShardingSpec]:
    """Each argument's given spec, replicated where none is given."""
    attrs = function.arg_attrs.data if function.arg_attrs is not None else ()
    out = []
    for k, t in enumerate(function.function_type.inputs.data):
        spec = attrs[k].data.get(SPEC_ATTR) if k < len(attrs) else None  # type: ignore[attr-defined]
        if isinstance(spec, ShardingSpecAttr) and not spec.spec.partial:
            out.append(spec.spec)
        else:
            out.append(ShardingSpec.replicated(len(shape_of(t))))
    return out


def spec_of_sharding(
    sharding: Any, ndim: int, mesh: Mesh, names: Sequence[str]
) -> ShardingSpec | None:
    """The spec on ``mesh`` equivalent to ``sharding`` (a compiled program's
    output sharding) for a value of rank ``ndim``; None when no spec of
    whole mesh axes per tensor dimension is (a layout this notation cannot
    write)."""
    axes = [a for a, size in enumerate(mesh.devices.shape) if size > 1]
    for placement in itertools.product(range(-1, ndim), repeat=len(axes)):
        dims: list[list[int]] = [[] for _ in range(ndim)]
        for axis, dim in zip(axes, placement, strict=True):
            if dim >= 0:
                dims[dim].append(axis)
        orders = [list(itertools.permutations(d)) for d in dims]
        for chosen in itertools.product(*orders):
            spec = ShardingSpec(tuple(tuple(d) for d in chosen))
            candidate = NamedSharding(mesh, _partition_spec(spec, names))
            if candidate.is_equivalent_to(sharding, ndim):
                return spec
    return None


def _jax_mesh(mesh_op: LogicalMeshOp, names: Sequence[str]) -> Mesh:
    devices = jax.devices()
    ids = mesh_op.device_ids
    if max(ids, default=0) >= len(devices):
        raise AlpaError(
            f"enable_auto_sharding=False: mesh @{mesh_op.sym_name.data} names device "
            f"{max(ids)} but this process has {len(devices)} devices for XLA's propagation"
        )
    picked = np.array([devices[i] for i in ids], dtype=object).reshape(mesh_op.mesh_shape)
    return Mesh(picked, tuple(names))


def propagate_function(function: func.FuncOp, mesh_op: LogicalMeshOp) -> None:
    """Give ``function``'s arguments their specs (given, else replicated) and
    its results the specs XLA's propagation chooses from them (module
    docstring)."""
    names = tuple(f"m{k}" for k in range(len(mesh_op.mesh_shape)))
    mesh = _jax_mesh(mesh_op, names)
    block = function.body.block
    specs = _arg_specs(function)
    ins = function.function_type.inputs.data
    avals = [
        jax.ShapeDtypeStruct(
            shape_of(t), dtype_of(t), sharding=NamedSharding(mesh, _partition_spec(s, names))
        )
        for t, s in zip(ins, specs, strict=True)
    ]

    def run(*flat: Any) -> tuple[Any, ...]:
        return tuple(eval_block(block, list(flat)))

    compiled = jax.jit(run).lower(*avals).compile()
    outs = function.function_type.outputs.data
    results = [
        spec_of_sharding(s, len(shape_of(t)), mesh, names)
        or ShardingSpec.replicated(len(shape_of(t)))
        for s, t in zip(compiled.output_shardings, outs, strict=True)
    ]
    function.arg_attrs = ArrayAttr(
        [_with_spec(function.arg_attrs, k, s) for k, s in enumerate(specs)]
    )
    function.res_attrs = ArrayAttr(
        [_with_spec(function.res_attrs, k, s) for k, s in enumerate(results)]
    )
    function.attributes[PROPAGATED_ATTR] = UnitAttr()


def _with_spec(attrs: ArrayAttr | None, index: int, spec: ShardingSpec) -> DictionaryAttr:
    old: dict[str, Attribute] = {}
    if attrs is not None and index < len(attrs.data):
        old = dict(attrs.data[index].data)  # type: ignore[attr-defined]
    old[SPEC_ATTR] = spec.to_attr()
    return DictionaryAttr(old)


__all__ = ["propagate_function", "spec_of_sharding"]
