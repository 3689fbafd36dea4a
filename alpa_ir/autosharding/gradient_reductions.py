"""Gradient reductions that can wait for the last micro-batch.

Under gradient accumulation a step's forward and backward run once per
micro-batch and their gradients are summed; a sum over devices (an all-reduce
or reduce-scatter of a gradient) commutes with that sum, so it may run once
per step on the accumulated gradient instead of once per micro-batch, as
Alpa runs it. :func:`deferred_reductions` finds those reductions in a planned
function, :func:`gradient_ops` the ops that produce gradients in an unplanned
one (the planner weighs them against the per-micro-batch work). The runtime
(``backends/spmd``), the ILP (``auto-sharding``'s ``compute_grad_scale``) and
the stage cost model (``costs/``) read them here.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from alpa_ir.dialects.lax import LaxOp


@dataclass(frozen=True)
class StepPartition:
    setup: tuple[Operation, ...]
    compute: tuple[Operation, ...]
    apply: tuple[Operation, ...]
    accumulated: tuple[SSAValue, ...]
    """Values of ``compute`` used by ``apply`` or returned."""


_LINEAR_UNARY = frozenset(
    {"neg", "reshape", "transpose", "squeeze", "copy", "convert_element_type", "pipeline_marker"}
)
"""Ops linear in their (single) operand: a sum over devices commutes with them."""


def deferred_reductions(
    part: StepPartition, function: func.FuncOp, *, any_reshard: bool = False
) -> frozenset[Operation]:
    """Sum-reductions of ``compute`` (all-reduce, reduce-scatter) whose result
    only reaches accumulated values, through ops linear in it: gradients
    synchronised over the mesh, possibly scaled (``g / n``) on the way. Under
    gradient accumulation they run once per step on the accumulated values
    instead of once per micro-batch (Alpa's behaviour: gradient traffic does
    not grow with the number of micro-batches); the sum is linear, so the
    result is the same. An all-reduce may pass through unary linear ops and a
    multiplication or division by a value that is the same on every device of
    its axes; a reduce-scatter only through markers (it changes the shape).
    ``any_reshard``: also through reshards that split over the reduced axes (a
    ZeRO gradient's slice: the sum and the slice are one reduce-scatter after
    the micro-batches, as Alpa runs it; the runtime here cannot defer those yet,
    the cost model prices what a deferring runtime does)."""
    from alpa_ir.dialects.sharding import AllReduceOp, ReduceScatterOp, ReshardOp, spec_of_value

    accumulated = set(part.accumulated)
    compute = set(part.compute)

    def linear_in(user: Operation, index: int, axes: tuple[int, ...], scatter: bool) -> bool:
        if isinstance(user, ReshardOp) and not scatter and any_reshard:
            return not spec_of_value(user.operands[0], function).partial
        if isinstance(user, ReshardOp) and not scatter:
            # a reshard is linear; it commutes with the sum over ``axes`` when
            # neither layout splits or gathers over them (each device moves the
            # same part of its own partial sum as the others of its group)
            specs = (
                spec_of_value(user.operands[0], function),
                spec_of_value(user.results[0], function),
            )
            return not any(s.partial or set(s.used_axes()) & set(axes) for s in specs)
        if not isinstance(user, LaxOp):
            return False
        name = user.primitive_name
        if name == "pipeline_marker":
            return True
        if scatter:
            return False
        if name in _LINEAR_UNARY and len(user.operands) == 1:
            if name == "convert_element_type":
                import jax.numpy as jnp  # bf16's numpy kind is "V", not "f"

                from alpa_ir.dialects.types import dtype_of

                return bool(jnp.issubdtype(dtype_of(user.results[0].type), jnp.floating))
            return True
        if name in ("mul", "div") and (name == "mul" or index == 0):
            other = user.operands[1 - index]
            spec = spec_of_value(other, function)
            return not spec.partial and not set(spec.used_axes()) & set(axes)
        return False

    def only_accumulated(value: SSAValue, axes: tuple[int, ...], scatter: bool) -> bool:
        """``value`` reaches, through linear ops only, accumulated values that
        nothing per micro-batch reads."""
        if value in accumulated:
            return all(use.operation not in compute for use in value.uses)
        if not value.uses:
            return False
        for use in value.uses:
            user = use.operation
            if not linear_in(user, use.index, axes, scatter):
                return False
            marker = getattr(user, "primitive_name", "") == "pipeline_marker"
            result = user.results[use.index if marker else 0]
            if not only_accumulated(result, axes, scatter):
                return False
        return True

    def factors(value: SSAValue, found: set[SSAValue]) -> set[SSAValue]:
        """The other operands of the multiplications and divisions on the
        (linear) paths from ``value`` to the accumulated values."""
        if value in accumulated:
            return found
        for use in value.uses:
            user = use.operation
            name = getattr(user, "primitive_name", "")
            if name in ("mul", "div"):
                found.add(user.operands[1 - use.index])
            factors(user.results[use.index if name == "pipeline_marker" else 0], found)
        return found

    out = set()
    for op in part.compute:
        if isinstance(op, AllReduceOp) and op.reduction != "sum":
            continue
        if not isinstance(op, AllReduceOp | ReduceScatterOp):
            continue
        if only_accumulated(op.results[0], tuple(op.mesh_axes), isinstance(op, ReduceScatterOp)):
            out.add(op)
    # A factor is the same on every device only while its own sums run: one
    # computed from a deferred sum (the sum's square ``m * m``, the product of
    # two deferred sums) is a partial value at run time, and the sum of
    # products of partial values is not the product of their sums.
    derived = _derived_values(out)
    return frozenset(op for op in out if not factors(op.results[0], set()) & derived)


def _derived_values(ops: set[Operation]) -> set[SSAValue]:
    """The results of ``ops`` and every value computed from them (a use
    inside a region taints the results of the ops around it)."""
    seen: set[SSAValue] = set()
    stack = [r for op in ops for r in op.results]
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        for use in value.uses:
            user: Operation | None = use.operation
            while user is not None:
                stack.extend(user.results)
                user = user.parent_op()
    return seen


def gradient_ops(part: StepPartition) -> frozenset[Operation]:
    """Ops of ``compute`` whose every result reaches, through ops linear in it
    (markers, unary linear ops, multiplications and divisions), only
    accumulated values that nothing per micro-batch reads: the ops producing
    gradients (the weight-gradient contractions and their scaling). A sum over
    devices of their results is deferred past the micro-batches
    (:func:`deferred_reductions`), so the planner prices it once per step."""
    accumulated = set(part.accumulated)
    compute = set(part.compute)
    memo: dict[SSAValue, bool] = {}

    def reaches(value: SSAValue) -> bool:
        if value in memo:
            return memo[value]
        if value in accumulated:
            memo[value] = all(use.operation not in compute for use in value.uses)
            return memo[value]
        ok = bool(value.uses)
        for use in value.uses:
            user = use.operation
            name = getattr(user, "primitive_name", None)
            if not (name in _LINEAR_UNARY or name in ("mul", "div")):
                ok = False
                break
            result = user.results[use.index if name == "pipeline_marker" else 0]
            if not reaches(result):
                ok = False
                break
        memo[value] = ok
        return ok

    return frozenset(
        op for op in part.compute if op.results and all(reaches(r) for r in op.results)
    )


def accumulated_reached(start: SSAValue, accumulated: set[SSAValue]) -> list[SSAValue]:
    """The accumulated values ``start`` (a deferred reduction's result) flows
    into, through the linear ops :func:`deferred_reductions` allows: one
    result each, a pipeline marker's by operand index."""
    out, stack = [], [start]
    while stack:
        value = stack.pop()
        if value in accumulated:
            out.append(value)
            continue
        for use in value.uses:
            user = use.operation
            marker = getattr(user, "primitive_name", "") == "pipeline_marker"
            stack.append(user.results[use.index if marker else 0])
    return out


_SCATTER_LINEAR = frozenset({"reshape", "transpose", "copy", "neg", "squeeze"})
"""Unary ops a reduce-scatter's result may pass through in :func:`scatter_chains`."""


def scatter_chains(part: StepPartition) -> dict[SSAValue, tuple[Operation, list[Operation]]]:
    """Per accumulated value, the sum reduce-scatter of ``part.compute`` it
    comes from and the ops from that scatter to it (the scatter first): a path
    on which every value has one use, through unary linear ops (a ZeRO-2
    gradient relaid out for its update) and pipeline markers, and whose end
    nothing per micro-batch reads. Under gradient accumulation the path runs
    once per step, on the sum of the scatter's operands (the same result:
    every op on it is linear), as Alpa reduce-scatters once per step."""
    from alpa_ir.dialects.sharding import ReduceScatterOp

    accumulated = set(part.accumulated)
    compute = set(part.compute)
    chains: dict[SSAValue, tuple[Operation, list[Operation]]] = {}
    for start in part.compute:
        if not isinstance(start, ReduceScatterOp):
            continue
        ops: list[Operation] = [start]
        value = start.results[0]
        while value not in accumulated:
            uses = list(value.uses)
            if len(uses) != 1:
                break
            user, index = uses[0].operation, uses[0].index
            name = getattr(user, "primitive_name", "")
            if name == "pipeline_marker":
                value = user.results[index]
            elif isinstance(user, LaxOp) and name in _SCATTER_LINEAR and len(user.operands) == 1:
                value = user.results[0]
            else:
                break
            ops.append(user)
        if value in accumulated and all(u.operation not in compute for u in value.uses):
            chains[value] = (start, ops)
    return chains


__all__ = [
    "StepPartition",
    "accumulated_reached",
    "deferred_reductions",
    "gradient_ops",
    "scatter_chains",
]
