"""``FollowParallel`` of a pipelined step (Alpa's ``FollowLayerOption``).

An evaluation step ``(params, batch)`` follows a ``PipeshardParallel`` train
step as Alpa compiles it: a forward-only pipeline (``pipeline_schedule=
"inference"``) on the train step's stage meshes, its layers cut so that each
op runs on the stage that holds the parameters it reads, and each parameter
kept where the train step keeps it, so that no parameter moves between the
two steps.

- **Cutting** (Alpa's ``slice_jaxpr_with_var_assignment``, without its flops
  refinement): the step is traced; in program order, an op goes to the
  highest stage of the parameters it reads, or of the ops before it, so the
  stages follow each other; a layer boundary is marked where the stage rises.
- **Meshes**: ``ManualStageOption``, layer ``k`` on stage ``k``'s submesh of
  the train step (its devices, its logical shape).
- **Layouts**: the step is planned once to learn which inputs each stage's
  forward takes, then planned with ``stage_input_shardings``: each parameter
  gets the spec the train step's forward of the same stage gives it, every
  other input stays free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import jax
from jax.extend.core import Literal
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument

from alpa_ir.api.pipeshard import ManualStageOption, PipeshardParallel
from alpa_ir.dialects.pipeline import plan_stages
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.markers import mark_pipeline_boundary
from alpa_ir.ir.module_utils import main_function, symbol_op
from alpa_ir.pipeline.stage_specs import stage_input_functions


def forward_arg_specs(module: ModuleOp) -> dict[int, tuple[int, ShardingSpec | None]]:
    """For each argument of ``@main`` that a stage's forward takes as it is:
    (the first such stage, the spec that forward gives it)."""
    forward: dict[str, int] = {}
    for k, stage in enumerate(plan_stages(module)):
        for phase, name in stage.phase_functions():
            if phase == "forward":
                forward[name] = k
    main = main_function(module)
    out: dict[int, tuple[int, ShardingSpec | None]] = {}
    for call in main.body.block.ops:
        if not isinstance(call, func.CallOp):
            continue
        stage = forward.get(call.callee.root_reference.data)
        if stage is None:
            continue
        function = symbol_op(module, call.callee.root_reference.data, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        specs = _arg_specs(function)
        for position, operand in enumerate(call.operands):
            if isinstance(operand, BlockArgument) and operand.owner is main.body.block:
                out.setdefault(operand.index, (stage, specs[position]))
    return out


def _arg_specs(function: func.FuncOp) -> list[ShardingSpec | None]:
    from alpa_ir.dialects.sharding import spec_of_value

    return [spec_of_value(a, function) for a in function.args]


def follow_layers(
    fn: Callable[..., Any], stage_of_leaf: Sequence[int | None]
) -> tuple[Callable[..., Any], Callable[..., int]]:
    """``fn`` with a layer boundary wherever the stage of its ops rises
    (module docstring); ``stage_of_leaf``: per flattened argument, the stage
    that holds it (None: any). Also returns a function of the arguments
    giving the number of layers the cut makes."""

    def stages_of(jaxpr: Any) -> list[int]:
        held = {v: s for v, s in zip(jaxpr.invars, stage_of_leaf, strict=True) if s is not None}
        current, out = 0, []
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if not isinstance(v, Literal) and v in held:
                    current = max(current, held[v])
            out.append(current)
        return out

    @functools.wraps(fn)
    def cut(*args: Any) -> Any:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        jaxpr = closed.jaxpr
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, closed.consts, strict=True))
        env.update(zip(jaxpr.invars, jax.tree.leaves(args), strict=True))

        def read(v: Any) -> Any:
            return v.val if isinstance(v, Literal) else env[v]

        previous = 0
        for eqn, stage in zip(jaxpr.eqns, stages_of(jaxpr), strict=True):
            for _ in range(stage - previous):
                mark_pipeline_boundary()
            previous = stage
            params = eqn.primitive.get_bind_params(eqn.params)
            outs = eqn.primitive.bind(*map(read, eqn.invars), **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs, strict=True))
        return jax.tree.unflatten(jax.tree.structure(shapes), [read(v) for v in jaxpr.outvars])

    def num_layers(*args: Any) -> int:
        stages = stages_of(jax.make_jaxpr(fn)(*args).jaxpr)
        return 1 + (stages[-1] if stages else 0)

    return cut, num_layers


def _params_leaves(executable: Any) -> list[int]:
    """The flattened argument indices of the train step's ``state.params``."""
    indices = jax.tree.unflatten(executable.in_tree, list(range(executable.in_tree.num_leaves)))
    state = indices[0] if isinstance(indices, tuple | list) and indices else None
    if not hasattr(state, "params"):
        raise AlpaError(
            "FollowParallel: the followed pipeline's first argument has no .params (a "
            "TrainState is expected)"
        )
    return list(jax.tree.leaves(state.params))


def follows_pipeline(method: Any) -> bool:
    """Whether ``method`` (a ``FollowParallel``) follows a pipelined step; its
    parameters' placements then come from the step (``state.params``), so a
    ``get_input_placement_specs`` of the method's is a one-line error."""
    from alpa_ir.api.pipeshard_executable import PipeshardExecutable

    if not isinstance(method.src_func.get_last_executable(), PipeshardExecutable):
        return False
    if method.get_input_placement_specs is not None:
        raise AlpaError(
            "FollowParallel: get_input_placement_specs is not taken for a pipelined step (its "
            "stages' state.params placements are followed)"
        )
    return True


def follow_pipeline(
    src: Any,
    fn: Callable[..., Any],
    args: Sequence[Any],
    num_micro_batches: int | None,
    *,
    batch_argnums: Sequence[int],
    static_argnums: Any,
) -> tuple[Callable[..., Any], PipeshardParallel]:
    """``fn`` cut by the parameters' stages and the inference pipeline on
    ``src``'s (a ``PipeshardExecutable``'s) stage meshes that keeps every
    parameter's spec (module docstring)."""
    from alpa_ir.api.pipeshard_executable import plan_pipeshard

    train = forward_arg_specs(src.module)
    params = _params_leaves(src)
    n_params = len(jax.tree.leaves(args[0])) if args else 0
    if n_params != len(params):
        raise AlpaError(
            f"FollowParallel: the followed step's state.params has {len(params)} arrays, the "
            f"first argument here {n_params}"
        )
    held = [train.get(i, (None, None)) for i in params]
    stage_of_leaf = [s for s, _ in held] + [None] * (len(jax.tree.leaves(args)) - n_params)
    cut, count = follow_layers(fn, stage_of_leaf)
    placements = src.placements
    num_stages = count(*args)
    meshes = [p.mesh for p in placements[:num_stages]]
    devices = [d for m in meshes for d in (m.devices or ())]
    method = PipeshardParallel(
        devices=devices,
        num_micro_batches=num_micro_batches or 1,
        layer_option="manual",
        stage_option=ManualStageOption(
            forward_stage_layer_ids=[[k] for k in range(num_stages)],
            submesh_logical_shapes=[tuple(m.shape) for m in meshes],
        ),
        pipeline_schedule="inference",
        backend=src.method.backend if hasattr(src, "method") else None,
    )
    # which inputs each stage's forward takes: known once the step is cut and outlined
    planned = plan_pipeshard(
        cut, tuple(args), method, donate_argnums=(), batch_argnums=batch_argnums,
        static_argnums=static_argnums,
    )  # fmt: skip
    spec_of_main = {j: held[j] for j in range(n_params)}
    stage_specs = []
    for k, functions in enumerate(stage_input_functions(planned.module)):
        main = main_function(planned.module)
        specs: list[ShardingSpec | None] = []
        for function in functions:
            call = next(
                c
                for c in main.body.block.ops
                if isinstance(c, func.CallOp)
                and c.callee.root_reference.data == function.sym_name.data
            )
            for operand in call.operands:
                stage, spec = (None, None)
                if isinstance(operand, BlockArgument) and operand.owner is main.body.block:
                    stage, spec = spec_of_main.get(operand.index, (None, None))
                specs.append(spec if stage == k else None)
        stage_specs.append(specs)
    return cut, replace(method, stage_input_shardings=stage_specs)


__all__ = ["follow_layers", "follow_pipeline", "follows_pipeline", "forward_arg_specs"]
