"""One layout per value and mesh across a pipeline's stage functions.

Each stage function (forward, backward, apply-grad) is auto-sharded on its
own. Left alone, the ILP of a backward function may choose another spec for
an activation its forward stashed, and an apply-grad function another spec
for a parameter or gradient, than the function that produced or first used
it on the same mesh; the driver would then reshard them inside the mesh on
every micro-batch. Alpa avoids this by sharding a stage's forward and
backward as one computation and letting apply-grad follow the gradients.

Here the functions are sharded in ``@main``'s call order (forward stages,
backward stages, apply-grad: dependency order) and each function's argument
that already has a layout on its mesh — a result of an earlier function on
the same mesh, or an argument of ``@main`` an earlier function on that mesh
took — gets that spec as a given annotation, which auto-sharding keeps
(``sharding.spec`` on the argument). Values arriving from other meshes stay
free: cross-mesh resharding moves them into whatever spec their consumer
chose.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp
from xdsl.ir import Attribute, SSAValue

from alpa_ir.dialects.mesh import mesh_name_of
from alpa_ir.dialects.sharding import SPEC_ATTR, ShardingSpec, ShardingSpecAttr
from alpa_ir.ir.module_utils import main_function, symbol_op


def _specs(attrs: ArrayAttr | None, count: int) -> list[ShardingSpec | None]:
    out: list[ShardingSpec | None] = [None] * count
    if attrs is not None:
        for k, entry in enumerate(attrs.data):
            spec = entry.data.get(SPEC_ATTR)  # type: ignore[attr-defined]
            if isinstance(spec, ShardingSpecAttr):
                out[k] = spec.spec
    return out


def _constrain(function: func.FuncOp, given: dict[int, ShardingSpec]) -> None:
    count = len(function.args)
    old = function.arg_attrs.data if function.arg_attrs is not None else ()
    entries: list[dict[str, Attribute]] = [
        dict(old[k].data) if k < len(old) else {}  # type: ignore[attr-defined]
        for k in range(count)
    ]
    for k, spec in given.items():
        entries[k][SPEC_ATTR] = spec.to_attr()
    function.arg_attrs = ArrayAttr([DictionaryAttr(e) for e in entries])


def shard_in_call_order(module: ModuleOp, shard: Callable[[str], None]) -> None:
    """Call ``shard(name)`` for every function ``@main`` calls, in call order,
    after giving its arguments the layouts they already have on its mesh."""
    main = main_function(module)
    known: dict[tuple[SSAValue, str], ShardingSpec] = {}
    for call in main.body.block.ops:
        if not isinstance(call, func.CallOp):
            continue
        name = call.callee.root_reference.data
        function = symbol_op(module, name, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        mesh = mesh_name_of(function)
        assert mesh is not None, f"@{name} has no mesh"
        given = {k: known[(v, mesh)] for k, v in enumerate(call.operands) if (v, mesh) in known}
        if given:
            _constrain(function, given)
        shard(name)
        planned = symbol_op(module, name, func.FuncOp)  # the sharded copy
        assert isinstance(planned, func.FuncOp)
        for v, spec in zip(
            call.operands, _specs(planned.arg_attrs, len(call.operands)), strict=True
        ):
            if spec is not None:
                known.setdefault((v, mesh), spec)
        for r, spec in zip(call.results, _specs(planned.res_attrs, len(call.results)), strict=True):
            if spec is not None:
                known[(r, mesh)] = spec
