"""Put hand-written sharding specs on a module: a logical mesh for ``@main``
and a spec per argument (and optionally per result). The xla backend then
runs the module as one SPMD program on that mesh."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FlatSymbolRefAttr, ModuleOp

from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.dialects.sharding import SPEC_ATTR, ShardingSpec
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function

SpecRule = Callable[[str, tuple[int, ...]], ShardingSpec | None]
"""(value name, global shape) -> spec, or None for replicated."""


def _checked(
    spec: ShardingSpec | None, shape: tuple[int, ...], mesh: LogicalDeviceMesh, what: str
) -> ShardingSpec:
    if spec is None:
        return ShardingSpec.replicated(len(shape))
    try:
        spec.validate(shape, mesh.rank)
    except ValueError as exc:
        raise AlpaError(f"{what}: {exc}") from None
    for dim, size in enumerate(shape):
        if size % spec.num_shards(mesh.shape, dim):
            raise AlpaError(
                f"{what}: dimension {dim} of size {size} is not divisible by the "
                f"{spec.num_shards(mesh.shape, dim)} shards of spec {spec}"
            )
    return spec


def annotate_shardings(
    module: ModuleOp,
    mesh: LogicalDeviceMesh,
    arg_specs: Sequence[ShardingSpec | None] | SpecRule,
    result_specs: Sequence[ShardingSpec | None] | SpecRule | None = None,
    *,
    mesh_name: str = "mesh",
) -> ModuleOp:
    """Annotate ``module`` in place (and return it)."""
    main = main_function(module)
    for op in list(module.ops):
        if isinstance(op, LogicalMeshOp) and op.sym_name.data == mesh_name:
            module.body.block.erase_op(op)
    module.body.block.insert_op_before(mesh.to_op(mesh_name), main)
    main.attributes[MESH_ATTR] = FlatSymbolRefAttr(mesh_name)

    def resolve(specs, values, kind: str) -> list[ShardingSpec]:
        shapes = [shape_of(t) for t in values]
        names = [f"{kind} {k}" for k in range(len(shapes))]
        if kind == "argument":
            names = [a.name_hint or n for a, n in zip(main.args, names, strict=True)]
        if callable(specs):
            chosen = [specs(n, s) for n, s in zip(names, shapes, strict=True)]
        else:
            if len(specs) != len(shapes):
                raise AlpaError(f"{len(specs)} {kind} specs given for {len(shapes)} {kind}s")
            chosen = list(specs)
        return [
            _checked(c, s, mesh, f"{kind} '{n}'")
            for c, s, n in zip(chosen, shapes, names, strict=True)
        ]

    ins = resolve(arg_specs, main.function_type.inputs.data, "argument")
    main.arg_attrs = ArrayAttr([DictionaryAttr({SPEC_ATTR: s.to_attr()}) for s in ins])
    if result_specs is not None:
        outs = resolve(result_specs, main.function_type.outputs.data, "result")
        main.res_attrs = ArrayAttr([DictionaryAttr({SPEC_ATTR: s.to_attr()}) for s in outs])
    return module
