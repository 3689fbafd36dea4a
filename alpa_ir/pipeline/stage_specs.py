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

from collections.abc import Callable, Iterator

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


def main_calls(module: ModuleOp) -> Iterator[tuple[func.CallOp, str, func.FuncOp, str]]:
    """Each call of ``@main``, in order, with its callee's name, function and
    mesh (every stage function of an outlined module has one)."""
    for call in main_function(module).body.block.ops:
        if not isinstance(call, func.CallOp):
            continue
        name = call.callee.root_reference.data
        function = symbol_op(module, name, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        mesh = mesh_name_of(function)
        assert mesh is not None, f"@{name} has no mesh"
        yield call, name, function, mesh


def shard_in_call_order(module: ModuleOp, shard: Callable[[str], None]) -> None:
    """Call ``shard(name)`` for every function ``@main`` calls, in call order,
    after giving its arguments the layouts they already have on its mesh."""
    known: dict[tuple[SSAValue, str], ShardingSpec] = {}
    for call, name, function, mesh in main_calls(module):
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


INPUT_PHASES = ("forward", "apply_grad")
"""The functions whose arguments are a stage's inputs (Alpa's
``stage_input_shard_specs``): its forward (parameters, the batch, activations
from the previous stage) and its apply-grad (optimizer state); the backward's
other arguments are the forward's results or gradients from the next stage."""


def stage_input_functions(module: ModuleOp) -> list[list[func.FuncOp]]:
    """Per stage of the outlined ``module``, its functions of :data:`INPUT_PHASES`
    in that order (each apply-grad round after the first apply-grad)."""
    from alpa_ir.dialects.pipeline import plan_stages

    out: list[list[func.FuncOp]] = []
    for stage in plan_stages(module):
        functions = []
        for phase, name in stage.phase_functions():
            if phase in INPUT_PHASES:
                function = symbol_op(module, name, func.FuncOp)
                assert isinstance(function, func.FuncOp)
                functions.append(function)
        out.append(functions)
    return out


def stage_input_specs(module: ModuleOp) -> tuple[tuple[ShardingSpec | None, ...], ...]:
    """Per stage, the spec of every input (:func:`stage_input_functions`'
    arguments in order; None where a function gives none)."""
    return tuple(
        tuple(s for f in functions for s in _specs(f.arg_attrs, len(f.args)))
        for functions in stage_input_functions(module)
    )


def _spec_code(spec: ShardingSpec | None) -> str:
    if spec is None:
        return "*"
    if not spec.dims:
        return "()"
    return ".".join("S" + "".join(map(str, d)) if d else "R" for d in spec.dims)


def _spec_of_code(code: str, where: str) -> ShardingSpec | None:
    from alpa_ir.errors import AlpaError

    if code == "*":
        return None
    if code == "()":
        return ShardingSpec(())
    dims: list[tuple[int, ...]] = []
    for part in code.split("."):
        if part == "R":
            dims.append(())
        elif part.startswith("S") and part[1:].isdigit():
            dims.append(tuple(int(c) for c in part[1:]))
        else:
            raise AlpaError(f"{where}: bad spec '{code}' (expected R or S<mesh axes> per dim)")
    return ShardingSpec(tuple(dims))


def format_stage_specs(specs: tuple[tuple[ShardingSpec | None, ...], ...]) -> str:
    """``specs`` as ``shard-stages``' ``input-specs`` option: stages separated
    by ``;``, inputs by ``,``, a spec's dims by ``.`` (``R``, ``S0``, ``S01``;
    ``()`` a scalar's, ``*`` none given)."""
    return ";".join(",".join(_spec_code(s) for s in stage) for stage in specs)


def parse_stage_specs(text: str) -> tuple[tuple[ShardingSpec | None, ...], ...]:
    """The inverse of :func:`format_stage_specs`."""
    return tuple(
        tuple(_spec_of_code(c, f"input-specs of stage {k}") for c in stage.split(",") if c)
        for k, stage in enumerate(text.split(";"))
    )


def force_stage_input_specs(
    module: ModuleOp, specs: tuple[tuple[ShardingSpec | None, ...], ...]
) -> None:
    """Give every stage's inputs (:func:`stage_input_functions`) the specs of
    ``specs`` (Alpa's ``stage_input_shardings``), as annotations auto-sharding
    keeps; a None leaves that input free."""
    from alpa_ir.dialects.mesh import LogicalMeshOp
    from alpa_ir.dialects.types import shape_of
    from alpa_ir.errors import AlpaError

    stages = stage_input_functions(module)
    if len(specs) != len(stages):
        raise AlpaError(
            f"stage_input_shardings gives {len(specs)} stages, the pipeline has {len(stages)}"
        )
    for k, (functions, given) in enumerate(zip(stages, specs, strict=True)):
        count = sum(len(f.args) for f in functions)
        if len(given) != count:
            raise AlpaError(
                f"stage_input_shardings: stage {k} has {count} inputs, {len(given)} specs given"
            )
        position = 0
        for function in functions:
            mesh = symbol_op(module, mesh_name_of(function) or "", LogicalMeshOp)
            rank = len(mesh.mesh_shape) if isinstance(mesh, LogicalMeshOp) else None
            chosen: dict[int, ShardingSpec] = {}
            for j, arg in enumerate(function.args):
                spec = given[position + j]
                if spec is None:
                    continue
                try:
                    spec.validate(shape_of(arg.type), rank)
                except ValueError as e:
                    raise AlpaError(
                        f"stage_input_shardings: stage {k} input {position + j}: {e}"
                    ) from None
                chosen[j] = spec
            position += len(function.args)
            if chosen:
                _constrain(function, chosen)
