"""Megatron-LM's tensor-parallel shardings of a transformer layer's parameters.

Megatron (Shoeybi et al. 2019, §3) splits each block's matrices over the
tensor-parallel group so that one all-reduce per sub-block suffices: the first
matrices of a sub-block (attention's query, key and value projections, the
MLP's first projection(s)) are **column-parallel** (their output dimension
split: each device computes its heads or its slice of the hidden units from
the whole input), the last one (attention's output projection, the MLP's
second projection) is **row-parallel** (its input dimension split: each device
multiplies its slice and the partial sums are all-reduced). The output head is
column-parallel (the vocabulary split); layer norms and biases are replicated.

:func:`megatron_specs` gives these shardings for the parameter arguments of a
layer function as traced (forward and backward ops, parameters in any dtype),
without names: a parameter's *forward* use is the first ``dot_general`` in
program order that takes it (through dtype conversions and transposes). Going back from that
dot's other operand towards the layer's activation inputs, stopping at the
residual stream (the activation arguments or the embedding lookup, and the
sums that add onto them), a
column-parallel matrix meets no other parameter's dot (its input is the
normalized residual), a row-parallel one does (its input is the attention
output or the MLP's activations). An embedding table that only a ``gather``
reads is split by rows (Megatron's vocabulary-parallel embedding); other
parameters no dot takes (norms, biases) are replicated; a split that does not divide its dimension leaves the parameter
to the ILP. With these specs fixed (``StageCostOptions.keep_argument_specs``)
and the batch on the data axis, the ILP only routes the activations: the plan
is Megatron's.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.dialects.types import shape_of

TRANSPARENT = frozenset({"convert_element_type", "copy"})
"""Primitives that pass a parameter (or the residual stream) on unchanged in layout."""


def _primitive(op: Operation | None) -> str:
    return op.primitive_name if isinstance(op, LaxOp) else ""


def _layouts(value: SSAValue) -> dict[SSAValue, tuple[int, ...]]:
    """``value`` and what dtype conversions and transposes of it make, each with
    the dimension of ``value`` that each of its dimensions is."""
    rank = len(shape_of(value.type))
    seen = {value: tuple(range(rank))}
    stack = [value]
    while stack:
        v = stack.pop()
        for use in v.uses:
            op = use.operation
            name = _primitive(op)
            if name in TRANSPARENT:
                dims = seen[v]
            elif name == "transpose":
                assert isinstance(op, LaxOp)
                dims = tuple(seen[v][p] for p in op.param("permutation"))
            else:
                continue
            for r in op.results:
                if r not in seen:
                    seen[r] = dims
                    stack.append(r)
    return seen


def _residual_values(
    function: func.FuncOp, activations: Sequence[int], owners: set[SSAValue]
) -> set[SSAValue]:
    """The residual stream: the activation arguments, the embedding lookups (a
    ``gather`` from a parameter: the first layer's stream starts there), their
    conversions, and every sum that adds onto a residual value (``x + attention(x)``)."""
    block = function.body.block
    residual: set[SSAValue] = {block.args[k] for k in activations}
    for op in block.ops:
        name = _primitive(op)
        if name == "gather" and op.operands and op.operands[0] in owners:
            residual.update(op.results)
        elif name in TRANSPARENT or name == "add":
            if any(o in residual for o in op.operands):
                residual.update(op.results)
    return residual


def _meets_a_weight_dot(
    start: SSAValue, residual: set[SSAValue], weight_dots: set[Operation]
) -> bool:
    """Whether going back from ``start`` (stopping at the residual stream and the
    arguments) meets the result of a parameter's dot."""
    seen: set[SSAValue] = set()
    stack = [start]
    while stack:
        v = stack.pop()
        if v in seen or v in residual:
            continue
        seen.add(v)
        owner = v.owner
        if not isinstance(owner, Operation):
            continue  # a block argument
        if owner in weight_dots:
            return True
        stack.extend(owner.operands)
    return False


def megatron_specs(
    function: func.FuncOp,
    param_args: Sequence[int],
    mesh_shape: Sequence[int],
    tensor_axis: int,
) -> dict[int, ShardingSpec]:
    """The sharding of every parameter argument ``param_args`` of ``function`` on a
    mesh of ``mesh_shape`` whose axis ``tensor_axis`` is the tensor-parallel group
    (module docstring); parameters left out are the ILP's to choose."""
    block = function.body.block
    params = {int(k) for k in param_args}
    activations = [k for k in range(len(block.args)) if k not in params]
    tensor = int(mesh_shape[tensor_axis])
    forward: dict[int, tuple[Operation, int, tuple[int, ...]]] = {}  # its first dot
    owners: dict[SSAValue, tuple[int, tuple[int, ...]]] = {}
    for k in sorted(params):
        for v, dims in _layouts(block.args[k]).items():
            owners[v] = (k, dims)
    looked_up: set[int] = set()  # embedding tables (a gather's operand)
    for op in block.ops:
        name = _primitive(op)
        if name == "gather" and op.operands and op.operands[0] in owners:
            looked_up.add(owners[op.operands[0]][0])
        if name != "dot_general":
            continue
        for index, operand in enumerate(op.operands[:2]):
            if operand in owners and owners[operand][0] not in forward:
                k, dims = owners[operand]
                forward[k] = (op, index, dims)
    weight_dots = {entry[0] for entry in forward.values()}
    residual = _residual_values(function, activations, set(owners))
    specs: dict[int, ShardingSpec] = {}
    for k in sorted(params):
        shape = shape_of(block.args[k].type)
        rank = len(shape)
        if tensor == 1 or (k not in forward and k not in looked_up):
            specs[k] = ShardingSpec.replicated(rank)
            continue
        if k not in forward:  # Megatron's vocabulary-parallel embedding: rows split
            candidates = [0]
        else:
            op, index, dims = forward[k]
            assert isinstance(op, LaxOp)
            (lc, rc), (lb, rb) = op.param("dimension_numbers")
            contracting = [dims[d] for d in (lc if index == 0 else rc)]
            batch = [dims[d] for d in (lb if index == 0 else rb)]
            row = _meets_a_weight_dot(op.operands[1 - index], residual, weight_dots)
            free = [d for d in range(rank) if d not in contracting and d not in batch]
            candidates = contracting if row else free
        dim = next((d for d in candidates if shape[d] % tensor == 0), None)
        if dim is None:
            continue
        specs[k] = ShardingSpec(tuple((tensor_axis,) if d == dim else () for d in range(rank)))
    return specs


def batch_specs(
    function: func.FuncOp,
    param_args: Sequence[int],
    rows: int,
    mesh_shape: Sequence[int],
    split: Sequence[tuple[int, int]],
) -> dict[int, ShardingSpec]:
    """The activation arguments of a layer function (those not in ``param_args``
    whose first dimension is the micro-batch's ``rows``) split as a data- (and
    context-) parallel plan splits them: each ``(dimension, mesh axis)`` of
    ``split`` whose axis size divides it (``(0, data axis)``, ``(1, context
    axis)`` for the sequence)."""
    block = function.body.block
    params = {int(k) for k in param_args}
    specs: dict[int, ShardingSpec] = {}
    for k, arg in enumerate(block.args):
        shape = shape_of(arg.type)
        if k in params or not shape or shape[0] != rows:
            continue
        dims: list[tuple[int, ...]] = [() for _ in shape]
        for dim, axis in split:
            if dim < len(shape) and mesh_shape[axis] > 1 and shape[dim] % mesh_shape[axis] == 0:
                dims[dim] = (axis,)
        specs[k] = ShardingSpec(tuple(dims))
    return specs


__all__ = ["TRANSPARENT", "batch_specs", "megatron_specs"]
