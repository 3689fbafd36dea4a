"""IR -> JAX: evaluate a block by binding the same JAX primitives again.

Used under ``jax.jit`` (or ``jax.make_jaxpr``) by the backends, so evaluating
a module traces exactly the jaxpr it was imported from. Ops of other dialects
(explicit collectives, reshards) are evaluated by handlers the caller passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from xdsl.dialects import func
from xdsl.ir import Block, Operation, Region, SSAValue

from alpa_ir.dialects.jax_primitives import bind_primitive, lookup_primitive
from alpa_ir.dialects.lax import ConstantOp, LaxOp, PrimitiveOp, ReturnOp
from alpa_ir.dialects.lax_primitives import BOUND_AS_IDENTITY
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError

OpHandler = Callable[[Operation, list[Any]], list[Any]]
"""Evaluates one non-lax op: (op, operand values) -> result values."""

_SCATTER_COMBINERS: Mapping[str, Callable[[Any, Any], Any] | None] = {
    "scatter": None,
    "scatter-add": lax.add,
    "scatter-sub": lax.sub,
    "scatter-mul": lax.mul,
    "scatter-min": lax.min,
    "scatter-max": lax.max,
}


def abstract_args(types: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(shape_of(t), dtype_of(t)) for t in types]


def region_to_closed_jaxpr(region: Region, handlers: Mapping[type, OpHandler] | None = None) -> Any:
    """Trace a region's block into the ClosedJaxpr a control-flow primitive binds."""
    block = region.block
    return jax.make_jaxpr(lambda *a: eval_block(block, list(a), handlers))(
        *abstract_args([arg.type for arg in block.args])
    )


def _rebuilt_params(op: LaxOp, args: Sequence[Any]) -> dict[str, Any]:
    spec = op.SPEC
    if not spec.rebuilt_params:
        return {}
    combine = _SCATTER_COMBINERS[spec.name]
    if combine is None:
        return {"update_jaxpr": None, "update_consts": ()}
    scalar = jax.ShapeDtypeStruct((), args[0].dtype)
    return {"update_jaxpr": jax.make_jaxpr(combine)(scalar, scalar).jaxpr, "update_consts": ()}


def bind_lax_op(
    op: LaxOp | PrimitiveOp,
    args: Sequence[Any],
    handlers: Mapping[type, OpHandler] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Bind the op's primitive to ``args`` and return its results as a list
    (with ``overrides`` replacing some of its parameters: a device's local op)."""
    if op.primitive_name in BOUND_AS_IDENTITY:
        return list(args)
    prim = lookup_primitive(op.primitive_name)
    params = op.jax_params()
    if isinstance(op, LaxOp):
        spec = op.SPEC
        for pname, region in zip(spec.region_params, op.regions, strict=False):
            params[pname] = region_to_closed_jaxpr(region, handlers)
        if spec.variadic_region_param:
            params[spec.variadic_region_param] = tuple(
                region_to_closed_jaxpr(r, handlers) for r in op.regions
            )
        params.update(_rebuilt_params(op, args))
    params.update(overrides or {})
    try:
        dropped = op.dropped_params() if isinstance(op, LaxOp) else ()
        out = bind_primitive(prim, args, params, dropped)
    except TypeError as exc:
        raise AlpaError(f"cannot bind primitive '{op.primitive_name}': {exc}") from exc
    return list(out) if prim.multiple_results else [out]


ResultHook = Callable[[Operation, list[Any]], list[Any]]
"""Called with each op and its results; returns the results to use instead."""


def eval_block(
    block: Block,
    args: Sequence[Any],
    handlers: Mapping[type, OpHandler] | None = None,
    on_result: ResultHook | None = None,
) -> list[Any]:
    """Evaluate ``block`` on ``args``; returns the operands of its terminator."""
    env: dict[SSAValue, Any] = dict(zip(block.args, args, strict=True))
    terminator = block.last_op
    if not isinstance(terminator, func.ReturnOp | ReturnOp):
        raise AlpaError("block has no terminator")
    eval_ops([op for op in block.ops if op is not terminator], env, handlers, on_result)
    return [env[v] for v in terminator.operands]


def eval_ops(
    ops: Sequence[Operation],
    env: dict[SSAValue, Any],
    handlers: Mapping[type, OpHandler] | None = None,
    on_result: ResultHook | None = None,
) -> None:
    """Evaluate ``ops`` in order, reading their operands from ``env`` and
    writing their results to it."""
    handlers = handlers or {}
    for op in ops:
        operands = [env[v] for v in op.operands]
        if isinstance(op, ConstantOp):
            results = [jnp.asarray(op.value())]
        elif isinstance(op, LaxOp | PrimitiveOp):
            results = bind_lax_op(op, operands, handlers)
        elif (handler := handlers.get(type(op))) is not None:
            results = handler(op, operands)
        else:
            raise AlpaError(f"the xla backend cannot execute op '{op.name}'")
        if on_result is not None:
            results = on_result(op, results)
        for value, result in zip(op.results, results, strict=True):
            env[value] = result
