"""Split a training step at its gradient marker.

The ``grad`` marker (``alpa_ir.grad`` / ``value_and_grad``) separates the
computation of the gradients from their application. Ops of ``@main`` fall in
three parts:

- ``setup``: depends neither on the batch nor on the marked gradients (e.g.
  casting parameters); runs once;
- ``compute``: depends on the batch and not on the marked gradients (forward,
  backward, and the marker itself); runs once per micro-batch;
- ``apply``: depends on the marked gradients (the optimizer); runs once.

Values that ``compute`` defines and ``apply`` or the results use are
accumulated over micro-batches (their mean: exact for the usual mean losses,
and for a sum normalised after the gradients, e.g. gradients divided by a
token count computed from the batch: both are averaged, so their ratio is the
whole batch's).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from alpa_ir.autosharding.gradient_reductions import (
    StepPartition,
    deferred_reductions,
    gradient_ops,
)
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.micro_batch_random import ROWS_NAME


def is_grad_marker(op: Operation) -> bool:
    return (
        isinstance(op, LaxOp)
        and op.primitive_name == "pipeline_marker"
        and op.param("kind") == "grad"
    )


def partition_step(function: func.FuncOp, batch_args: Sequence[int]) -> StepPartition:
    block = function.body.block
    ops = [op for op in block.ops if op is not block.last_op]
    markers = [op for op in ops if is_grad_marker(op)]
    if not markers:
        raise AlpaError(
            "gradient accumulation needs the gradients marked: compute them with "
            "alpa_ir.grad or alpa_ir.value_and_grad"
        )
    batch_values: set[SSAValue] = {block.args[i] for i in batch_args}
    forced = _per_micro_batch_after(ops, markers[-1], batch_values)
    batch_dep: set[SSAValue] = set(batch_values)
    grad_dep: set[SSAValue] = set()
    setup, compute, apply = [], [], []
    for op in ops:
        uses_grad = any(v in grad_dep for v in op.operands)
        uses_batch = any(v in batch_dep for v in op.operands)
        if is_grad_marker(op):
            compute.append(op)
            grad_dep.update(op.results)
        elif uses_batch and not uses_grad and (op in forced or op not in forced.after):
            compute.append(op)
            batch_dep.update(op.results)
        elif uses_grad or uses_batch:
            if any(v in batch_values for v in op.operands):
                raise AlpaError(
                    f"op {op.name} after the gradient marker reads a batch argument directly; "
                    "gradient accumulation needs the optimizer step to read the batch only "
                    "through values computed from it before (e.g. a token count)"
                )
            apply.append(op)
            grad_dep.update(op.results)
        else:
            setup.append(op)
    later = set(apply) | {block.last_op}
    accumulated: list[SSAValue] = []
    for op in compute:
        for value in op.results:
            if any(use.operation in later for use in value.uses):
                accumulated.append(value)
    return StepPartition(tuple(setup), tuple(compute), tuple(apply), tuple(accumulated))


class _Forced(set[Operation]):
    """Ops after the last gradient marker that run per micro-batch; ``after``
    holds every op after that marker."""

    after: set[Operation]


def _per_micro_batch_after(
    ops: Sequence[Operation], last_marker: Operation, batch_values: set[SSAValue]
) -> _Forced:
    """Which ops after the last gradient marker still run once per micro-batch.

    Such an op reading the batch only through values computed before the
    marker runs once per step on their accumulated (mean) values, as the
    one-device step computes it from the whole batch (``loss / num_tokens`` of
    a summed loss), unless a batch argument is read, by it or by an op that
    reads its result (an accuracy: ``argmax(logits) == labels``): those run per
    micro-batch. A conversion of an integer to a float runs per micro-batch
    too, so that a count is averaged as a float, not rounded as an integer."""
    position = {op: k for k, op in enumerate(ops)}
    after = [op for op in ops if position[op] > position[last_marker]]
    forced = _Forced()
    forced.after = set(after)
    for op in reversed(after):
        if any(v in batch_values for v in op.operands) or _is_count_to_float(op):
            forced.add(op)
            continue
        if any(use.operation in forced for r in op.results for use in r.uses):
            forced.add(op)
    return forced


def _is_count_to_float(op: Operation) -> bool:
    """An integer converted to a float (a token count about to divide a sum):
    it is converted per micro-batch and averaged as a float."""
    if not (isinstance(op, LaxOp) and op.primitive_name == "convert_element_type"):
        return False
    from alpa_ir.dialects.types import dtype_of

    try:
        src, dst = dtype_of(op.operands[0].type), dtype_of(op.results[0].type)
    except Exception:
        return False
    import jax.numpy as jnp  # bf16's numpy kind is "V", not "f"

    return src.kind in "iub" and bool(jnp.issubdtype(dst, jnp.floating))


def micro_batch_statistics(function: func.FuncOp, batch_args: Sequence[int]) -> list[Operation]:
    """Reductions over the batch dimension whose result flows back into
    per-example values (BatchNorm's mean and variance): under micro-batching
    each micro-batch is normalised by its own statistics (as in Alpa), which
    differs from one step on the whole batch. Found on the ops before the
    first ``backward`` marker (the forward pass), from the batch arguments'
    leading dimension."""
    from alpa_ir.dialects.types import shape_of

    block = function.body.block
    sizes = {shape_of(block.args[k].type)[0] for k in batch_args if shape_of(block.args[k].type)}
    if len(sizes) != 1:
        return []
    size = sizes.pop()
    # the row numbers' least element is the micro-batch's first row, not a statistic
    batch_dep: set[SSAValue] = {
        block.args[k] for k in batch_args if block.args[k].name_hint != ROWS_NAME
    }
    from_stats: dict[SSAValue, Operation] = {}
    found: list[Operation] = []
    for op in block.ops:
        if isinstance(op, LaxOp) and op.primitive_name == "pipeline_marker":
            if op.param("kind") == "backward":
                break
        operands = list(op.operands)
        if not any(v in batch_dep for v in operands):
            continue
        batch_dep.update(op.results)
        sources = {from_stats[v] for v in operands if v in from_stats}
        if (
            isinstance(op, LaxOp)
            and op.kind.value == "reduction"
            and 0 in tuple(op.param("axes"))
            and shape_of(operands[0].type)[:1] == (size,)
        ):
            for r in op.results:
                from_stats[r] = op
            continue
        for r in op.results:
            shape = shape_of(r.type)
            if sources and shape[:1] == (size,):
                found += [s for s in sources if s not in found]
            elif sources:
                from_stats[r] = next(iter(sources))
    return found


def warn_micro_batch_statistics(function: func.FuncOp, batch_args: Sequence[int], b: int) -> None:
    """Warn (once per compilation) that batch statistics are per micro-batch."""
    import warnings

    if b <= 1:
        return
    found = micro_batch_statistics(function, batch_args)
    if not found:
        return
    where = ""
    location = found[0].location
    file = getattr(location, "filename", None)
    if file is not None:
        where = f" (first at {file.data}:{location.line.data})"  # type: ignore[attr-defined]
    warnings.warn(
        f"the step computes statistics over the batch dimension{where} (e.g. BatchNorm); with "
        f"{b} micro-batches each micro-batch is normalised by its own micro-batch statistics, "
        "as in Alpa, not by those of the whole batch",
        UserWarning,
        stacklevel=4,
    )


def batch_leaves_of(function: func.FuncOp) -> list[int]:
    """The flat indices of ``@main``'s batch arguments (``alpa.batch_args``)."""
    from xdsl.dialects.builtin import DenseArrayBase

    attr = function.attributes.get("alpa.batch_args")
    return [int(x) for x in attr.get_values()] if isinstance(attr, DenseArrayBase) else []


__all__ = [
    "StepPartition",
    "batch_leaves_of",
    "deferred_reductions",
    "gradient_ops",
    "is_grad_marker",
    "micro_batch_statistics",
    "partition_step",
    "warn_micro_batch_statistics",
]
