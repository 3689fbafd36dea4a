"""Sums over a stage's mesh that a pipeline runs once per step, not once per
micro-batch.

A backward function of a pipeline stage runs once per micro-batch; its
gradients are accumulated over the micro-batches before the apply-grad
function reads them. A gradient's sum over the devices of the stage's mesh
(an all-reduce, or ZeRO's reduce-scatter) commutes with the accumulation, so
it may run once per step on the accumulated partial sums, as Alpa runs it and
as the stage cost model prices it
(:func:`~alpa_ir.autosharding.gradient_reductions.deferred_reductions`).
:func:`deferred_sums` finds, for the results of one stage function that are
read once per step only, the reductions whose result reaches them: the
runtime runs the function without those reductions (each device returns its
partial sum) and applies each reduction to the accumulated result
(``backends/spmd``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from xdsl.dialects import func
from xdsl.ir import Operation

from alpa_ir.autosharding.gradient_reductions import (
    StepPartition,
    accumulated_reached,
    deferred_reductions,
)
from alpa_ir.dialects.sharding import AllReduceOp, ReduceScatterOp, spec_of_value


@dataclass(frozen=True)
class DeferredSum:
    """A result whose sum over ``axes`` runs once per step: an all-reduce, or a
    reduce-scatter leaving tensor axis ``dim`` split over ``axes``."""

    kind: Literal["all_reduce", "reduce_scatter"]
    axes: tuple[int, ...]
    dim: int
    partial_dims: tuple[tuple[int, ...], ...]
    """The spec (mesh axes per tensor axis) of each device's partial sum, as
    the function computes it without the reduction."""
    dims: tuple[tuple[int, ...], ...]
    """The result's spec as the function returns it (after the reduction)."""


@dataclass(frozen=True)
class DeferredSums:
    """The reductions of a function deferred past the micro-batches (``ops``)
    and the results they reach, by result index."""

    ops: frozenset[Operation]
    results: dict[int, DeferredSum]


def deferred_sums(function: func.FuncOp, once_per_step: Collection[int]) -> DeferredSums:
    """The sums over the mesh of ``function`` that may wait for the last
    micro-batch: those whose result reaches, through linear ops only, results
    of indices ``once_per_step`` (accumulated over the micro-batches and read
    only once per step) and nothing else."""
    block = function.body.block
    returned = list(block.last_op.operands)  # type: ignore[union-attr]
    wanted = set(once_per_step)
    elsewhere = {v for k, v in enumerate(returned) if k not in wanted}
    accumulated = tuple(
        dict.fromkeys(v for k, v in enumerate(returned) if k in wanted and v not in elsewhere)
    )
    if not accumulated:
        return DeferredSums(frozenset(), {})
    ops = tuple(op for op in block.ops if op is not block.last_op)
    part = StepPartition((), ops, (), accumulated)
    found = deferred_reductions(part, function)
    results: dict[int, DeferredSum] = {}
    for op in found:
        kind: Literal["all_reduce", "reduce_scatter"] = "all_reduce"
        dim, scattered = 0, None
        if isinstance(op, ReduceScatterOp):  # reaches its results through markers only
            kind, dim = "reduce_scatter", op.int_prop("dim")
            scattered = spec_of_value(op.operands[0], function).dims
        else:
            assert isinstance(op, AllReduceOp)
        for value in accumulated_reached(op.results[0], set(accumulated)):
            dims = spec_of_value(value, function).dims
            partial = dims if scattered is None else scattered
            for k, v in enumerate(returned):
                if v is value:
                    results[k] = DeferredSum(kind, tuple(op.mesh_axes), dim, partial, dims)
    return DeferredSums(found, results)


__all__ = ["DeferredSum", "DeferredSums", "deferred_sums"]
