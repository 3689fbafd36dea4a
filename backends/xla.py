"""The ``xla`` backend (embedded default): runs a module on the local JAX devices.

An unannotated module runs as one jitted program on one device. A module
whose ``@main`` names a logical mesh (``mesh.mesh = @m``) runs as one SPMD
program on that mesh of local devices: argument and result specs become the
program's input and output shardings, and specs annotated on intermediate
values become sharding constraints (GSPMD propagates the rest). A module
with an explicit per-device plan (``auto-sharding`` wrote its objective on
``@main``) runs as the per-device program of :mod:`alpa_ir.backends.spmd`,
the program ``parallelize`` runs for the same plan: the collectives XLA
compiles are the plan's, not GSPMD's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.ir import Operation

from alpa_ir.autosharding.planner import OBJECTIVE_ATTR
from alpa_ir.backends.grad_accumulation import (
    AccumulatingStep,
    averaged,
    micro_batch_program,
    split_step,
)
from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.dialects.sharding import (
    CollectiveOp,
    annotated_spec,
    result_specs,
    signature_spec,
)
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import abstract_leaf
from alpa_ir.frontend.jax_export import OpHandler, eval_block, eval_ops
from alpa_ir.frontend.module_trees import tree_texts
from alpa_ir.frontend.pytree_codec import TreeTexts
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.runtime.devices import jax_mesh, mesh_axis_names, partition_spec


def function_mesh(module: ModuleOp, function: func.FuncOp) -> LogicalMeshOp | None:
    ref = function.attributes.get(MESH_ATTR)
    if ref is None:
        return None
    if isinstance(ref, SymbolRefAttr):
        name = ref.root_reference.data
    elif isinstance(ref, StringAttr):
        name = ref.data
    else:
        raise AlpaError(f"@{function.sym_name.data}: {MESH_ATTR} must be a symbol reference")
    mesh_op = symbol_op(module, name, LogicalMeshOp)
    assert isinstance(mesh_op, LogicalMeshOp)
    return mesh_op


def check_arguments(function: func.FuncOp, flat_args: Sequence[Any]) -> None:
    """Raise a clear error when the arguments do not match @main's inputs."""
    types = function.function_type.inputs.data
    if len(flat_args) != len(types):
        raise AlpaError(f"the module takes {len(types)} array arguments, got {len(flat_args)}")
    for k, (arg, ty, block_arg) in enumerate(zip(flat_args, types, function.args, strict=True)):
        want_shape, want_dtype = shape_of(ty), dtype_of(ty)
        name = block_arg.name_hint or f"#{k}"
        aval = abstract_leaf(arg, name)
        shape, dtype = tuple(aval.shape), aval.dtype
        if shape != want_shape or str(dtype) != str(want_dtype):
            raise AlpaError(
                f"argument {k} ({name}) is {dtype}{list(shape)}, the module expects "
                f"{want_dtype}{list(want_shape)}"
            )


@dataclass
class XlaExecutable:
    """A module compiled for the local devices; call it with the user's arguments."""

    module: ModuleOp
    function: func.FuncOp
    jitted: Callable[..., Any]
    trees: TreeTexts
    mesh: Mesh | None = None
    in_shardings: tuple[Any, ...] | None = None

    def __call__(self, *args: Any) -> Any:
        flat, _, _ = self.trees.flatten(args)
        check_arguments(self.function, flat)
        if self.in_shardings is not None:
            # Place inputs as the program expects, so that the first call (host
            # arrays) and later calls (sharded results) hit the same executable.
            flat = jax.device_put(flat, list(self.in_shardings))
        return self.trees.outputs(args, list(self.jitted(*flat)))

    def hlo_text(self, *args: Any) -> str:
        """The compiled HLO text for these arguments (after XLA's SPMD partitioner)."""
        flat = jax.tree.leaves(args)
        return self.jitted.lower(*flat).compile().as_text()  # type: ignore[attr-defined]


def _identity_handlers() -> dict[type, OpHandler]:
    """Collectives are the identity on global values; GSPMD inserts the real ones."""

    def identity(op: Operation, operands: list[Any]) -> list[Any]:
        return operands

    return {cls: identity for cls in _collective_classes()}


def _collective_classes() -> list[type]:
    from alpa_ir.dialects import sharding

    return [
        c
        for c in vars(sharding).values()
        if isinstance(c, type) and issubclass(c, CollectiveOp) and c is not CollectiveOp
    ]


def _constrainer(mesh: Mesh, names: Sequence[str]) -> Callable[[Operation, list[Any]], list[Any]]:
    """The hook that constrains an op's results to the specs annotated on it."""

    def constrain(op: Operation, results: list[Any]) -> list[Any]:
        specs = result_specs(op)
        if specs is None:
            return results
        out = []
        for value, spec in zip(results, specs, strict=True):
            if spec.partial:
                out.append(value)
            else:
                sharding = NamedSharding(mesh, partition_spec(spec, names))
                out.append(jax.lax.with_sharding_constraint(value, sharding))
        return out

    return constrain


def _annotated_eval(function: func.FuncOp, mesh: Mesh, names: Sequence[str]) -> Callable[..., Any]:
    """Evaluate @main, constraining every value whose op carries specs."""
    handlers = _identity_handlers()
    block = function.body.block
    constrain = _constrainer(mesh, names)

    def run(*flat: Any) -> Any:
        return tuple(eval_block(block, list(flat), handlers, on_result=constrain))

    return run


def _accumulating_annotated(
    function: func.FuncOp,
    mesh: Mesh,
    names: Sequence[str],
    steps: int,
    batch_args: Sequence[int],
    in_specs: Sequence[Any],
    out_shardings: Sequence[Any],
) -> AccumulatingStep:
    """Gradient accumulation with the given specs propagated by XLA: the
    accumulate, accumulate-last and apply programs
    (:mod:`alpa_ir.backends.grad_accumulation`); XLA chooses the accumulators'
    layout (that of the first micro-batch's values), and reduces each
    micro-batch's gradients where its propagation puts the reductions."""
    from jax.sharding import PartitionSpec

    from alpa_ir.pipeline.step_partition import partition_step

    handlers = _identity_handlers()
    block = function.body.block
    returned = list(block.last_op.operands)  # type: ignore[union-attr]
    part = partition_step(function, batch_args)
    accumulated, acc_ops, acc_inputs, apply_ops, apply_inputs = split_step(block, part, batch_args)
    constrain = _constrainer(mesh, names)
    n_acc = len(acc_inputs)

    def values(xs: Sequence[Any]) -> list[Any]:
        env = {block.args[k]: x for k, x in zip(acc_inputs, xs[:n_acc], strict=True)}
        eval_ops(acc_ops, env, handlers, constrain)
        return [env[v] for v in accumulated]

    def first(*xs: Any) -> tuple[Any, ...]:
        return tuple(values(xs))

    def accumulate(*xs: Any) -> tuple[Any, ...]:
        return tuple(a + x for a, x in zip(xs[n_acc:], values(xs), strict=True))

    def accumulate_last(*xs: Any) -> tuple[Any, ...]:
        return tuple(averaged(x, steps) for x in accumulate(*xs))

    def apply(*xs: Any) -> tuple[Any, ...]:
        n = len(apply_inputs)
        env = {block.args[k]: x for k, x in zip(apply_inputs, xs[:n], strict=True)}
        env.update(zip(accumulated, xs[n:], strict=True))
        eval_ops(apply_ops, env, handlers, constrain)
        return tuple(env[v] for v in returned)

    arg_shardings = [NamedSharding(mesh, s) for s in in_specs]
    args = function.function_type.inputs.data
    micro_leaves = tuple(k for k in acc_inputs if k in batch_args)
    micro_structs = {
        k: jax.ShapeDtypeStruct(shape_of(args[k]), dtype_of(args[k]), sharding=arg_shardings[k])
        for k in micro_leaves
    }
    acc_in = [
        micro_structs.get(
            k, jax.ShapeDtypeStruct(shape_of(args[k]), dtype_of(args[k]), sharding=arg_shardings[k])
        )
        for k in acc_inputs
    ]
    first_program = jax.jit(first)
    layouts = first_program.lower(*acc_in).compile().output_shardings
    acc_structs = tuple(
        jax.ShapeDtypeStruct(shape_of(v.type), dtype_of(v.type), sharding=s)
        for v, s in zip(accumulated, layouts, strict=True)
    )
    return AccumulatingStep(
        num_micro_batches=steps,
        in_shardings=tuple(
            NamedSharding(mesh, PartitionSpec(None, *s) if k in batch_args else s)
            for k, s in enumerate(in_specs)
        ),
        acc_inputs=acc_inputs,
        apply_inputs=apply_inputs,
        micro_batch=micro_batch_program([arg_shardings[k] for k in micro_leaves]),
        micro_leaves=micro_leaves,
        zeros=None,
        accumulate=jax.jit(
            accumulate,
            out_shardings=tuple(layouts),
            donate_argnums=tuple(range(n_acc, n_acc + len(accumulated))),
        ),
        accumulate_last=jax.jit(accumulate_last, out_shardings=tuple(layouts)),
        apply=jax.jit(apply, out_shardings=tuple(out_shardings)),
        acc_structs=acc_structs,
        reduced_structs=acc_structs,
        micro_structs=micro_structs,
        first=first_program,
    )


def compile_annotated(
    function: func.FuncOp,
    mesh: Mesh,
    names: Sequence[str],
    num_micro_batches: int = 1,
    batch_args: Sequence[int] = (),
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``function`` as one jitted program on ``mesh`` whose argument and result
    specs are its input and output shardings and whose annotated values are
    sharding constraints; XLA's SPMD partitioner propagates the rest. Returns
    the program and its input shardings. With ``num_micro_batches`` B > 1 the
    batch arguments are passed as ``[B, micro-batch...]`` (their micro-batch
    dimension unsplit) and the gradients are accumulated over them."""
    from jax.sharding import PartitionSpec

    ins = function.function_type.inputs.data
    outs = function.function_type.outputs.data
    accumulating = num_micro_batches > 1
    in_specs = []
    for k in range(len(ins)):
        spec = partition_spec(signature_spec(function, k), names)
        in_specs.append(PartitionSpec(None, *spec) if accumulating and k in batch_args else spec)
    # a result without a spec is laid out as XLA's propagation chooses (Alpa's
    # UNDEFINED output sharding)
    out_specs = [annotated_spec(function, k, result=True) for k in range(len(outs))]
    out_shardings = tuple(
        None if s is None else NamedSharding(mesh, partition_spec(s, names)) for s in out_specs
    )
    if accumulating:
        step = _accumulating_annotated(
            function,
            mesh,
            names,
            num_micro_batches,
            batch_args,
            [partition_spec(signature_spec(function, k), names) for k in range(len(ins))],
            out_shardings,
        )
        return step, step.in_shardings
    in_shardings = tuple(NamedSharding(mesh, s) for s in in_specs)
    jitted = jax.jit(
        _annotated_eval(function, mesh, names),
        in_shardings=in_shardings,
        out_shardings=out_shardings,
    )
    return jitted, in_shardings


class XlaBackend:
    """Runs modules on the local JAX devices."""

    name = "xla"

    def compile(self, module: ModuleOp) -> Any:
        """An :class:`XlaExecutable` of ``@main``, or for an outlined pipeline
        module (one with a ``pipeline.plan``) a
        :class:`~alpa_ir.backends.xla_pipeline.LocalPipelineExecutable`."""
        from alpa_ir.dialects.pipeline import PlanOp
        from alpa_ir.ir.module_utils import top_level_ops

        if any(True for _ in top_level_ops(module, PlanOp)):
            from alpa_ir.backends.xla_pipeline import LocalPipelineExecutable

            return LocalPipelineExecutable(module)
        function = main_function(module)
        trees = tree_texts(function)
        mesh_op = function_mesh(module, function)
        if mesh_op is None:
            block = function.body.block
            jitted = jax.jit(lambda *flat: tuple(eval_block(block, list(flat))))
            return XlaExecutable(module, function, jitted, trees)
        mesh = jax_mesh(mesh_op)
        if OBJECTIVE_ATTR in function.attributes:  # planned: every collective explicit
            from alpa_ir.backends.spmd import compile_spmd

            jitted, in_shardings = compile_spmd(module, function, mesh, mesh_axis_names(mesh_op))
        else:
            jitted, in_shardings = compile_annotated(function, mesh, mesh_axis_names(mesh_op))
        return XlaExecutable(module, function, jitted, trees, mesh, in_shardings)

    def execute(self, module: ModuleOp, *args: Any) -> Any:
        return self.compile(module)(*args)
