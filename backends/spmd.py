"""Run an explicitly sharded module as one SPMD program (``jax.shard_map``).

After ``auto-sharding`` every value of ``@main`` has a spec, every op's
operands arrive in the specs its strategy needs, and every communication is
an explicit op of the ``sharding`` dialect. This executor runs exactly that
plan: each device evaluates the ops on its local blocks (the rule's local
computation) and the collectives become ``psum``, ``all_gather``,
``psum_scatter`` and ``all_to_all`` over the mesh axes. XLA's partitioner has
nothing left to decide, so the collectives in the compiled HLO are the ones
the plan predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.autosharding.gradient_reductions import accumulated_reached, scatter_chains
from alpa_ir.autosharding.local_ops import (
    LOCALIZERS,
    LocalContext,
    block_offsets,
    indexed_block_op,
    iota_offset,
    linear_axis_index,
    split_indexed_dims,
)
from alpa_ir.backends.collective_combining import combined_all_gather, combined_reduce_scatter
from alpa_ir.backends.grad_accumulation import (
    GRAD_SYNC_SCOPE,
    AccumulatingStep,
    averaged,
    micro_batch_program,
    split_step,
    zeros_program,
)
from alpa_ir.dialects.attrs import PROPAGATED_ATTR
from alpa_ir.dialects.lax import ConstantOp, LaxOp, PrimitiveOp
from alpa_ir.dialects.sharding import (
    AllGatherOp,
    AllReduceOp,
    AllReduceProgramOp,
    AllToAllOp,
    ReduceScatterOp,
    ReshardOp,
    ShardingSpec,
    signature_spec,
    spec_of_value,
)
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.jax_export import bind_lax_op, eval_block
from alpa_ir.frontend.local_random import local_random_bits
from alpa_ir.ir.module_utils import symbol_op
from alpa_ir.pipeline.deferred_sums import DeferredSum, DeferredSums, deferred_sums
from alpa_ir.pipeline.step_partition import deferred_reductions, partition_step
from alpa_ir.runtime.devices import partition_spec
from alpa_ir.runtime.interpreter import CompiledFunction
from alpa_ir.runtime.program import StepProgram


def local_slice(
    x: Any, src: ShardingSpec, dst: ShardingSpec, mesh_shape: Sequence[int], names: Sequence[str]
) -> Any:
    """Go from ``src`` to ``dst`` locally: ``dst`` may only split more, or be
    partial over more axes (the value is kept on index 0 of those axes)."""
    for d, (have, want) in enumerate(zip(src.dims, dst.dims, strict=True)):
        if have == want:
            continue
        if want[: len(have)] != have:
            raise AlpaError(f"reshard {src} -> {dst} is not a local slice")
        added = want[len(have) :]
        size = x.shape[d]
        for a in added:
            size //= mesh_shape[a]
        index = linear_axis_index(added, mesh_shape, names)
        x = lax.dynamic_slice_in_dim(x, index * size, size, axis=d)
    new_partial = [a for a in dst.partial if a not in src.partial]
    if new_partial:
        keep = jnp.bool_(True)
        for a in new_partial:
            keep = keep & (lax.axis_index(names[a]) == 0)
        x = jnp.where(keep, x, jnp.zeros_like(x))
    return x


class _LocalEvaluator:
    """Evaluates @main's ops on local blocks inside ``shard_map``."""

    def __init__(
        self,
        function: func.FuncOp,
        mesh_shape: Sequence[int],
        names: Sequence[str],
        positions: dict[int, int] | None = None,
    ) -> None:
        self.function = function
        self.mesh_shape = tuple(mesh_shape)
        self.names = tuple(names)
        # device id (index into jax.devices()) -> row-major position in the mesh
        self.positions = positions or {}

    def axis_names(self, axes: Sequence[int]) -> Any:
        picked = tuple(self.names[a] for a in axes)
        return picked[0] if len(picked) == 1 else picked

    def run(self, block: Block, args: Sequence[Any]) -> list[Any]:
        env: dict[SSAValue, Any] = dict(zip(block.args, args, strict=True))
        self.run_ops([op for op in block.ops if op is not block.last_op], env)
        return [env[v] for v in block.last_op.operands]  # type: ignore[union-attr]

    def run_ops(
        self,
        ops: Sequence[Operation],
        env: dict[SSAValue, Any],
        skip: frozenset[Operation] = frozenset(),
    ) -> None:
        """Evaluate ``ops``; those in ``skip`` pass their operand through.

        Reduce-scatters and all-gathers are combined, as XLA's combiners do on
        GPU: the ops run in rounds; in a round every op that does not depend on
        a waiting collective runs, the collectives wait, and at the round's end
        those waiting run combined, one per kind, mesh axes and dtype
        (:mod:`alpa_ir.backends.collective_combining`). The ops that read them
        run in the next round. The trace's order changes, not its values.
        Collectives of the forward pass and of the rest (after the ``backward``
        marker) are never combined: ZeRO-3 gathers a parameter again for the
        backward pass so as not to hold it through the step."""
        backward = next((k for k, op in enumerate(ops) if _is_backward_marker(op)), len(ops))
        phase = {op: k > backward for k, op in enumerate(ops)}
        while ops:
            later: list[Operation] = []
            blocked: set[SSAValue] = set()
            waiting: dict[SSAValue, tuple[Operation, Any, bool]] = {}
            for op in ops:
                if any(v in blocked for v in op.operands):
                    later.append(op)
                    blocked.update(op.results)
                elif op in skip:
                    env[op.results[0]] = env[op.operands[0]]
                elif isinstance(op, ReduceScatterOp | AllGatherOp):
                    waiting[op.results[0]] = (op, env[op.operands[0]], phase[op])
                    blocked.add(op.results[0])
                else:
                    results = self.eval_op(op, [env[v] for v in op.operands])
                    for value, result in zip(op.results, results, strict=True):
                        env[value] = result
            self._run_combined(waiting, env)
            ops = later

    def _run_combined(
        self, waiting: dict[SSAValue, tuple[Operation, Any, bool]], env: dict[SSAValue, Any]
    ) -> None:
        """Run the waiting collectives, combined by pass, kind, mesh axes and dtype."""
        groups: dict[tuple[Any, ...], list[SSAValue]] = {}
        for value, (op, x, after_forward) in waiting.items():
            key = (type(op), tuple(op.mesh_axes), jnp.dtype(x.dtype), after_forward)
            groups.setdefault(key, []).append(value)
        for (kind, axes, _, _), group in groups.items():
            xs = [waiting[v][1] for v in group]
            dims = [waiting[v][0].int_prop("dim") for v in group]
            size = int(np.prod([self.mesh_shape[a] for a in axes]))
            combine = combined_reduce_scatter if kind is ReduceScatterOp else combined_all_gather
            results = combine(xs, dims, self.axis_names(axes), size)
            for value, result in zip(group, results, strict=True):
                env[value] = result

    def eval_op(self, op: Operation, xs: list[Any]) -> list[Any]:
        if isinstance(op, ConstantOp):
            spec = spec_of_value(op.result, self.function)
            value = jnp.asarray(op.value())
            return [
                local_slice(
                    value, ShardingSpec.replicated(value.ndim), spec, self.mesh_shape, self.names
                )
            ]
        if isinstance(op, AllReduceOp):
            collective: Callable[..., Any] = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[
                op.reduction
            ]
            return [collective(xs[0], self.axis_names(op.mesh_axes))]
        if isinstance(op, AllReduceProgramOp):
            from alpa_ir.backends.program_collectives import run_program

            group_size = 1
            for a in op.mesh_axes:
                group_size *= self.mesh_shape[a]
            return [run_program(xs[0], op, self.names, self.positions, group_size)]
        if isinstance(op, AllGatherOp):
            return [
                lax.all_gather(
                    xs[0], self.axis_names(op.mesh_axes), axis=op.int_prop("dim"), tiled=True
                )
            ]
        if isinstance(op, ReduceScatterOp):
            return [
                lax.psum_scatter(
                    xs[0],
                    self.axis_names(op.mesh_axes),
                    scatter_dimension=op.int_prop("dim"),
                    tiled=True,
                )
            ]
        if isinstance(op, AllToAllOp):
            return [
                lax.all_to_all(
                    xs[0],
                    self.axis_names(op.mesh_axes),
                    split_axis=op.int_prop("dst_dim"),
                    concat_axis=op.int_prop("src_dim"),
                    tiled=True,
                )
            ]
        if isinstance(op, ReshardOp):
            return [local_slice(xs[0], op.src.spec, op.dst.spec, self.mesh_shape, self.names)]
        if isinstance(op, LaxOp):
            return self.eval_lax(op, xs)
        if isinstance(op, PrimitiveOp):
            return bind_lax_op(op, xs)
        raise AlpaError(f"the SPMD executor cannot run op '{op.name}'")

    def eval_lax(self, op: LaxOp, xs: list[Any]) -> list[Any]:
        name = op.primitive_name
        localize = LOCALIZERS.get(name)
        if localize is None and not name.startswith("scatter"):
            return bind_lax_op(op, xs)
        ctx = LocalContext(
            [shape_of(t) for t in op.operand_types],
            [shape_of(t) for t in op.result_types],
            [spec_of_value(v, self.function) for v in op.operands],
            [spec_of_value(v, self.function) for v in op.results],
            self.mesh_shape,
        )
        params = op.jax_params() if localize is None else localize(op.jax_params(), ctx)
        if split_indexed_dims(name, params, ctx):  # e.g. a vocabulary-split embedding
            return [
                indexed_block_op(
                    name, xs, params, ctx, self.names, lambda a, p: bind_lax_op(op, a, None, p)[0]
                )
            ]
        if localize is None:
            return bind_lax_op(op, xs)
        from alpa_ir.dialects.jax_primitives import bind_primitive, lookup_primitive

        if name == "random_bits_rows" or (name == "random_bits" and not ctx.operand_shapes[0]):
            offsets = block_offsets(ctx, 0, self.names)
            global_shape = ctx.result_shapes[0]
            if name == "random_bits_rows":  # the micro-batch's rows of the whole batch's draw
                global_shape = tuple(params["global_shape"])
                offsets[0] = offsets[0] + jnp.asarray(xs[1]).astype(jnp.uint32)
            return [
                local_random_bits(
                    xs[0], params["bit_width"], global_shape, ctx.local_result(0), offsets
                )
            ]
        out = bind_primitive(lookup_primitive(name), xs, params, op.dropped_params())
        if name == "iota":
            out = iota_offset(out, params, ctx, self.names)
        return [out]


def _is_backward_marker(op: Operation) -> bool:
    return (
        isinstance(op, LaxOp)
        and op.primitive_name == "pipeline_marker"
        and op.param("kind") == "backward"
    )


def _with_micro_batch_dim(spec: PartitionSpec, add: bool) -> PartitionSpec:
    return PartitionSpec(None, *spec) if add else spec


def compile_spmd(
    module: ModuleOp,
    function: func.FuncOp,
    mesh: Mesh,
    names: Sequence[str],
    donate: Sequence[int] = (),
    num_micro_batches: int = 1,
    batch_args: Sequence[int] = (),
    deferred: DeferredSums | None = None,
    accumulators: Sequence[int] = (),
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A jitted function of the flat arguments running ``function``'s plan, and
    the input shardings it expects. With ``num_micro_batches`` B > 1 the batch
    arguments are passed as ``[B, micro-batch...]`` and the gradients are
    accumulated over the B micro-batches (see :mod:`alpa_ir.pipeline.step_partition`).
    ``deferred`` (a pipeline stage's function, run once per micro-batch): its
    reductions are skipped and the results they reach are returned as each
    device's partial sum, stacked along a new leading axis over the reduced
    mesh axes (:func:`finish_program` completes their accumulation).
    ``accumulators`` (a pipeline stage's function, run once per micro-batch):
    the indices of results summed over the micro-batches in place, as Alpa's
    backward programs: the program takes their running sums as its first
    parameters, donated, and returns ``sum + result`` in their place (in the
    result's layout, stacked where its reduction is deferred); the returned
    input shardings are those of the function's own arguments."""
    from jax.sharding import NamedSharding

    mesh_shape = tuple(mesh.devices.shape)
    all_devices = jax.devices()
    positions = {all_devices.index(d): k for k, d in enumerate(mesh.devices.flat)}
    evaluator = _LocalEvaluator(function, mesh_shape, names, positions)
    block = function.body.block
    in_specs = tuple(
        _with_micro_batch_dim(
            partition_spec(spec_of_value(a, function), names),
            k in batch_args and num_micro_batches > 1,
        )
        for k, a in enumerate(block.args)
    )
    returned = list(block.last_op.operands)  # type: ignore[union-attr]
    out_specs = tuple(partition_spec(spec_of_value(v, function), names) for v in returned)
    if deferred is not None and deferred.results:
        sums = deferred
        out_specs = tuple(
            _stacked_spec(sums.results[k], names) if k in sums.results else s
            for k, s in enumerate(out_specs)
        )

        def local(*flat: Any) -> tuple[Any, ...]:
            env: dict[SSAValue, Any] = dict(zip(block.args, flat, strict=True))
            evaluator.run_ops([op for op in block.ops if op is not block.last_op], env, sums.ops)
            outs = [env[v] for v in returned]
            return tuple(x[None] if k in sums.results else x for k, x in enumerate(outs))
    elif num_micro_batches > 1:
        step = _accumulating_spmd(
            evaluator, function, mesh, names, donate, num_micro_batches, batch_args
        )
        return step, step.in_shardings
    else:

        def local(*flat: Any) -> tuple[Any, ...]:
            return tuple(evaluator.run(block, flat))

    in_shardings = tuple(NamedSharding(mesh, s) for s in in_specs)
    if accumulators:
        local = _summing_in_place(local, tuple(accumulators))
        in_specs = (*(out_specs[k] for k in accumulators), *in_specs)
        donate = (*range(len(accumulators)), *(len(accumulators) + d for d in donate))
    mapped = jax.shard_map(
        local, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )
    jitted = jax.jit(
        mapped,
        in_shardings=tuple(NamedSharding(mesh, s) for s in in_specs),
        out_shardings=tuple(NamedSharding(mesh, s) for s in out_specs),
        donate_argnums=tuple(donate),
    )
    return jitted, in_shardings


def compile_propagated(
    function: func.FuncOp, mesh: Mesh, names: Sequence[str], accumulators: Sequence[int] = ()
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A stage function planned by XLA's propagation (no ILP, so no
    ``sharding.objective``: :mod:`alpa_ir.autosharding.xla_propagation`) as
    one jitted program whose input and output shardings are its arguments'
    and results' specs; XLA's SPMD partitioner lays out the rest.
    ``accumulators`` as :func:`compile_spmd`'s."""
    block = function.body.block
    ins = [partition_spec(signature_spec(function, k), names) for k in range(len(block.args))]
    outs = [partition_spec(s, names) for s in _result_specs(function)]

    def run(*flat: Any) -> tuple[Any, ...]:
        return tuple(eval_block(block, list(flat)))

    in_shardings = tuple(NamedSharding(mesh, s) for s in ins)
    n = len(accumulators)
    program = _summing_in_place(run, tuple(accumulators)) if n else run
    jitted = jax.jit(
        program,
        in_shardings=(*(NamedSharding(mesh, outs[k]) for k in accumulators), *in_shardings),
        out_shardings=tuple(NamedSharding(mesh, s) for s in outs),
        donate_argnums=tuple(range(n)),
    )
    return jitted, in_shardings


def _result_specs(function: func.FuncOp) -> list[ShardingSpec]:
    """The spec of each result of ``function``: on the op that computes it
    (the ILP's plan, or one written by hand), on the signature after XLA's
    propagation."""
    returned = list(function.body.block.last_op.operands)  # type: ignore[union-attr]
    if PROPAGATED_ATTR in function.attributes:
        return [signature_spec(function, k, result=True) for k in range(len(returned))]
    return [spec_of_value(v, function) for v in returned]


def _summing_in_place(
    local: Callable[..., tuple[Any, ...]], accumulators: tuple[int, ...]
) -> Callable[..., tuple[Any, ...]]:
    """``local`` taking the running sums of its results ``accumulators`` first
    and returning ``sum + result`` in their place."""
    n = len(accumulators)

    def summed(*xs: Any) -> tuple[Any, ...]:
        outs = list(local(*xs[n:]))
        for acc, k in zip(xs[:n], accumulators, strict=True):
            outs[k] = acc + outs[k]
        return tuple(outs)

    return summed


def _accumulating_spmd(
    evaluator: _LocalEvaluator,
    function: func.FuncOp,
    mesh: Mesh,
    names: Sequence[str],
    donate: Sequence[int],
    steps: int,
    batch_args: Sequence[int],
) -> AccumulatingStep:
    """The accumulate, accumulate-last and apply programs of ``function``'s plan
    (:mod:`alpa_ir.backends.grad_accumulation`). An accumulator holds each
    device's own sum until the last micro-batch: in its value's layout, except
    behind a deferred reduce-scatter, where it keeps the layout before the
    scatter (the whole partial sum, scattered once per step)."""
    block = function.body.block
    part = partition_step(function, batch_args)
    deferred = deferred_reductions(part, function)
    accumulated, acc_ops, acc_inputs, apply_ops, apply_inputs = split_step(block, part, batch_args)
    returned = list(block.last_op.operands)  # type: ignore[union-attr]

    def spec(value: SSAValue) -> PartitionSpec:
        return partition_spec(ShardingSpec(spec_of_value(value, function).dims), names)

    final = [spec(v) for v in accumulated]
    carried = list(final)
    types = [v.type for v in accumulated]
    # a reduce-scatter whose result reaches an accumulated value through
    # unary linear ops only (a ZeRO-2 gradient, relaid out for its update):
    # each micro-batch's partial sum is accumulated whole, and the scatter and
    # those ops run once, on the sum
    chains = scatter_chains(part)
    for end, (scatter, _) in chains.items():
        j = accumulated.index(end)
        carried[j], types[j] = spec(scatter.operands[0]), scatter.operands[0].type
    deferred = frozenset(op for op in deferred if not isinstance(op, ReduceScatterOp))
    skipped = deferred | {op for _, ops in chains.values() for op in ops if not _is_marker(op)}
    arg_specs = [partition_spec(spec_of_value(a, function), names) for a in block.args]
    out_specs = tuple(partition_spec(spec_of_value(v, function), names) for v in returned)
    n_acc = len(acc_inputs)

    def run_micro_batch(xs: Sequence[Any]) -> dict[SSAValue, Any]:
        env = {block.args[k]: x for k, x in zip(acc_inputs, xs[:n_acc], strict=True)}
        evaluator.run_ops(acc_ops, env, skip=skipped)
        return {v: acc + env[v] for v, acc in zip(accumulated, xs[n_acc:], strict=True)}

    def accumulate(*xs: Any) -> tuple[Any, ...]:
        env = run_micro_batch(xs)
        return tuple(env[v] for v in accumulated)

    def accumulate_last(*xs: Any) -> tuple[Any, ...]:
        env = {v: averaged(x, steps) for v, x in run_micro_batch(xs).items()}
        with jax.named_scope(GRAD_SYNC_SCOPE):  # once per step, on the sums
            for op in deferred:
                for value in accumulated_reached(op.results[0], set(accumulated)):
                    env[value] = evaluator.eval_op(op, [env[value]])[0]
            # the scatters combined, as the per-micro-batch ones were
            waiting = {
                start.results[0]: (start, env[end], True) for end, (start, _) in chains.items()
            }
            scattered: dict[SSAValue, Any] = {}
            evaluator._run_combined(waiting, scattered)
            for end, (start, ops) in chains.items():
                x = scattered[start.results[0]]
                for op in ops[1:]:
                    if not _is_marker(op):
                        x = evaluator.eval_op(op, [x])[0]
                env[end] = x
        return tuple(env[v] for v in accumulated)

    def apply(*xs: Any) -> tuple[Any, ...]:
        n = len(apply_inputs)
        env = {block.args[k]: x for k, x in zip(apply_inputs, xs[:n], strict=True)}
        env.update(zip(accumulated, xs[n:], strict=True))
        evaluator.run_ops(apply_ops, env)
        return tuple(env[v] for v in returned)

    def sharded(a: Sequence[PartitionSpec]) -> tuple[NamedSharding, ...]:
        return tuple(NamedSharding(mesh, s) for s in a)

    def program(
        fn: Callable[..., Any],
        ins: Sequence[PartitionSpec],
        outs: Sequence[PartitionSpec],
        donated: Sequence[int],
    ) -> Any:
        mapped = jax.shard_map(
            fn, mesh=mesh, in_specs=tuple(ins), out_specs=tuple(outs), check_vma=False
        )
        return jax.jit(
            mapped,
            in_shardings=sharded(ins),
            out_shardings=sharded(outs),
            donate_argnums=tuple(donated),
        )

    acc_in = [arg_specs[k] for k in acc_inputs]
    accs = range(n_acc, n_acc + len(accumulated))
    same = [n_acc + j for j in range(len(accumulated)) if carried[j] == final[j]]
    apply_in = [arg_specs[k] for k in apply_inputs]
    kept = set(donate)
    micro_leaves = tuple(k for k in acc_inputs if k in batch_args)
    args = function.function_type.inputs.data
    return AccumulatingStep(
        num_micro_batches=steps,
        in_shardings=tuple(
            NamedSharding(mesh, _with_micro_batch_dim(s, k in batch_args))
            for k, s in enumerate(arg_specs)
        ),
        acc_inputs=acc_inputs,
        apply_inputs=apply_inputs,
        micro_batch=micro_batch_program(sharded([arg_specs[k] for k in micro_leaves])),
        micro_leaves=micro_leaves,
        zeros=zeros_program(
            [
                jax.ShapeDtypeStruct(shape_of(t), dtype_of(t), sharding=NamedSharding(mesh, c))
                for t, c in zip(types, carried, strict=True)
            ]
        ),
        accumulate=program(accumulate, [*acc_in, *carried], carried, accs),
        accumulate_last=program(accumulate_last, [*acc_in, *carried], final, same),
        apply=program(
            apply,
            [*apply_in, *final],
            out_specs,
            [j for j, k in enumerate(apply_inputs) if k in kept],
        ),
        acc_structs=tuple(
            jax.ShapeDtypeStruct(shape_of(t), dtype_of(t), sharding=NamedSharding(mesh, c))
            for t, c in zip(types, carried, strict=True)
        ),
        reduced_structs=tuple(
            jax.ShapeDtypeStruct(
                shape_of(v.type), dtype_of(v.type), sharding=NamedSharding(mesh, f)
            )
            for v, f in zip(accumulated, final, strict=True)
        ),
        micro_structs={
            k: jax.ShapeDtypeStruct(
                shape_of(args[k]), dtype_of(args[k]), sharding=NamedSharding(mesh, arg_specs[k])
            )
            for k in micro_leaves
        },
    )


def _is_marker(op: Operation) -> bool:
    return isinstance(op, LaxOp) and op.primitive_name == "pipeline_marker"


def _stacked_spec(deferred: DeferredSum, names: Sequence[str]) -> PartitionSpec:
    """Each device's partial sum stacked along a new leading axis over the
    reduced mesh axes."""
    axes = tuple(names[a] for a in deferred.axes)
    inner = partition_spec(ShardingSpec(deferred.partial_dims), names)
    return PartitionSpec(axes[0] if len(axes) == 1 else axes, *inner)


def finish_program(deferred: DeferredSum, mesh: Mesh, names: Sequence[str]) -> Callable[..., Any]:
    """The jitted reduction of stacked partial sums (:func:`compile_spmd`'s
    ``deferred`` results, accumulated) into the result's spec."""
    axes = tuple(names[a] for a in deferred.axes)
    over = axes[0] if len(axes) == 1 else axes
    in_spec = _stacked_spec(deferred, names)
    out_spec = partition_spec(ShardingSpec(deferred.dims), names)

    def local(x: Any) -> Any:
        if deferred.kind == "reduce_scatter":
            return lax.psum_scatter(x[0], over, scatter_dimension=deferred.dim, tiled=True)
        return lax.psum(x[0], over)

    mapped = jax.shard_map(local, mesh=mesh, in_specs=in_spec, out_specs=out_spec, check_vma=False)
    return jax.jit(
        mapped,
        in_shardings=NamedSharding(mesh, in_spec),
        out_shardings=NamedSharding(mesh, out_spec),
    )


def compile_mesh_functions(
    module: ModuleOp, program: StepProgram, mesh: str, devices: Sequence[Any]
) -> tuple[Mesh, dict[str, CompiledFunction]]:
    """Compile the functions ``mesh`` runs as SPMD programs on ``devices``
    (the mesh's device ids remapped to these devices in row-major order). A
    function's sums over the mesh that reach only results read once per step
    run once per step, on their accumulation (:mod:`alpa_ir.pipeline.deferred_sums`)."""
    info = program.meshes[mesh]
    if len(devices) != info.size:
        raise AlpaError(f"mesh @{mesh} needs {info.size} devices, got {len(devices)}")
    jmesh = Mesh(np.array(devices, dtype=object).reshape(info.shape), info.axis_names)
    names = [i.target for i in program.instructions[mesh] if i.kind == "run"]
    compiled: dict[str, CompiledFunction] = {}
    for name in dict.fromkeys(names):
        function = symbol_op(module, name, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        sums = deferred_sums(function, program.once_per_step.get(name, ()))
        in_place = program.summed_in_place(program.calls[name])
        if PROPAGATED_ATTR in function.attributes:  # enable_auto_sharding=False: no ILP
            run, in_shardings = compile_propagated(function, jmesh, info.axis_names, in_place)
        else:  # the specs on its ops: the ILP's plan, or a plan text written by hand
            run, in_shardings = compile_spmd(
                module, function, jmesh, info.axis_names, deferred=sums, accumulators=in_place
            )
        finish = {k: finish_program(d, jmesh, info.axis_names) for k, d in sums.results.items()}
        finish_shardings = {
            k: NamedSharding(jmesh, partition_spec(ShardingSpec(d.dims), info.axis_names))
            for k, d in sums.results.items()
        }
        results = function.function_type.outputs.data
        finish_inputs = {
            k: jax.ShapeDtypeStruct(
                (math.prod(info.shape[a] for a in d.axes), *shape_of(results[k])),
                dtype_of(results[k]),
                sharding=NamedSharding(jmesh, _stacked_spec(d, info.axis_names)),
            )
            for k, d in sums.results.items()
        }
        out_specs = _result_specs(function)
        acc_structs = tuple(
            finish_inputs[k]
            if k in finish_inputs
            else jax.ShapeDtypeStruct(
                shape_of(results[k]),
                dtype_of(results[k]),
                sharding=NamedSharding(jmesh, partition_spec(out_specs[k], info.axis_names)),
            )
            for k in in_place
        )
        compiled[name] = CompiledFunction(
            run,
            in_shardings,
            finish,
            finish_shardings,
            finish_inputs,
            in_place,
            acc_structs,
            zeros_program(acc_structs) if in_place else None,
        )
    return jmesh, compiled
