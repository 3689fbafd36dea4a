"""Layer boundaries of the backward pass, for boundaries JAX did not mirror.

A layer marker with operands placed inside the differentiated function
(``mark_pipeline_boundary(x)``) is mirrored by JAX itself: its transpose marks
the cotangents, so the backward pass carries the boundary too. Boundaries
placed any other way have no mirror: Alpa's operand-free
``mark_pipeline_boundary()``, and the boundaries ``cluster-operators`` draws
into an imported step. This module gives them one.

The frontend marks where the backward pass begins (a ``backward`` marker,
see :mod:`alpa_ir.frontend.differentiation`) and where it ends (the ``grad``
marker). Forward ops take the layer of their position among the forward
layer markers. Each backward op then takes a layer by what it reads:

- the *residual hint*: for every value computed by a forward op that it reads,
  the latest layer that computes or reads that value forward (a layer's
  boundary activation, read by the next layer's weight gradient, belongs to
  that next layer); the hint is the largest over those values;
- the *cotangent bound*: no later than any backward op it reads from, since
  the backward pass runs layers last to first (``L - 1`` when it reads none).

Its layer is the smaller of the two (the bound alone without a hint). The
backward ops are then stably reordered by descending layer, which keeps every
dependency (a producer's layer is never below its reader's), and an
operand-free layer marker is put between consecutive layers: the step then
has the layout :mod:`alpa_ir.pipeline.stage_outline` reads, ``2(L - 1)`` markers in
program order.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.differentiation import BACKWARD, GRAD, is_marker, make_marker

LAYER = "layer"


@dataclass(frozen=True)
class StepRegions:
    """The ops of a differentiated ``@main``: before the backward marker
    (``forward``), between it and the following grad marker (``backward``)."""

    forward: tuple[Operation, ...]
    backward: tuple[Operation, ...]
    backward_marker: Operation
    grad_marker: Operation


def step_regions(function: func.FuncOp) -> StepRegions | None:
    """The regions of a step with exactly one backward pass, else None."""
    ops = list(function.body.block.ops)
    starts = [k for k, op in enumerate(ops) if is_marker(op, BACKWARD)]
    if len(starts) != 1:
        return None
    start = starts[0]
    end = next((k for k in range(start + 1, len(ops)) if is_marker(ops[k], GRAD)), None)
    if end is None:
        return None
    return StepRegions(tuple(ops[:start]), tuple(ops[start + 1 : end]), ops[start], ops[end])


def forward_layer_markers(regions: StepRegions) -> list[Operation]:
    return [op for op in regions.forward if is_marker(op, LAYER)]


def needs_mirroring(function: func.FuncOp) -> bool:
    """Whether the step's forward layer markers lack mirrors in its backward pass."""
    regions = step_regions(function)
    if regions is None or not forward_layer_markers(regions):
        return False
    return not any(is_marker(op, LAYER) for op in regions.backward)


def mirror_layers(function: func.FuncOp) -> int:
    """Give the forward layer markers of ``@main`` mirrors in its backward pass
    (see the module doc); returns the number of layers. A step whose markers
    JAX mirrored is left alone."""
    regions = step_regions(function)
    if regions is None:
        raise AlpaError(
            "layer boundaries need a differentiated step: compute the gradients once with "
            "jax.grad, jax.value_and_grad or alpa_ir.grad"
        )
    markers = forward_layer_markers(regions)
    if any(is_marker(op, LAYER) for op in regions.backward):
        return len(markers) + 1
    num_layers = len(markers) + 1
    if num_layers == 1:
        return 1
    layer_of = _forward_layers(regions.forward)
    residual = _residual_layers(regions.forward, layer_of)
    backward_layer: dict[Operation, int] = {}
    for op in regions.backward:
        bound = num_layers - 1
        hint: int | None = None
        for operand in op.operands:
            owner = operand.owner
            if owner in backward_layer:
                bound = min(bound, backward_layer[owner])  # type: ignore[index]
            elif operand in residual:
                hint = residual[operand] if hint is None else max(hint, residual[operand])
        backward_layer[op] = bound if hint is None else min(bound, hint)
    _sink_constant_ops(regions.backward, backward_layer)
    _reorder(regions, backward_layer, num_layers)
    return num_layers


def _sink_constant_ops(backward: tuple[Operation, ...], layer_of: dict[Operation, int]) -> None:
    """Give each backward op computed from constants alone (the zero
    cotangents JAX's transposes broadcast, e.g. ``select_n(mask, zeros, g)``
    of a ReLU) the latest layer among its readers: it has no cotangent bound
    and no hint, and in the last layer it would be a zero tensor that the
    last stage computes and sends to every earlier stage that reads it.
    Operand-free ops are copied into each function that uses them anyway."""
    constant: set[Operation] = set()
    for op in backward:
        if all(_operand_free(o.owner) or o.owner in constant for o in op.operands):
            constant.add(op)
    for op in reversed(backward):
        if op not in constant:
            continue
        readers = [u.operation for r in op.results for u in r.uses]
        layers = [layer_of[r] for r in readers if r in layer_of]
        if layers:
            layer_of[op] = max(layers)


def _forward_layers(forward: tuple[Operation, ...]) -> dict[Operation, int]:
    layer, out = 0, {}
    for op in forward:
        if is_marker(op, LAYER):
            layer += 1
        else:
            out[op] = layer
    return out


def _residual_layers(
    forward: tuple[Operation, ...], layer_of: dict[Operation, int]
) -> dict[SSAValue, int]:
    """For every value a forward op computes: the latest layer computing or reading it forward."""
    latest: dict[SSAValue, int] = {}
    alias: dict[SSAValue, SSAValue] = {}
    for op in forward:
        if is_marker(op, LAYER):
            for result, operand in zip(op.results, op.operands, strict=True):
                alias[result] = alias.get(operand, operand)
            continue
        layer = layer_of[op]
        for operand in op.operands:
            value = alias.get(operand, operand)
            if value in latest:
                latest[value] = max(latest[value], layer)
        for result in op.results:
            latest[result] = layer
    for result, value in alias.items():
        if value in latest:
            latest[result] = latest[value]
    return latest


def _reorder(regions: StepRegions, layer_of: dict[Operation, int], num_layers: int) -> None:
    """Move the backward ops into descending layer order (stable) with an
    operand-free layer marker between consecutive layers."""
    block = regions.grad_marker.parent_block()
    assert block is not None
    for op in regions.backward:
        op.detach()
    anchor = regions.grad_marker
    for layer in range(num_layers - 1, -1, -1):
        for op in regions.backward:
            if layer_of[op] == layer:
                block.insert_op_before(op, anchor)
        if layer:
            block.insert_op_before(make_marker(LAYER), anchor)


def merge_runs(function: func.FuncOp) -> bool:
    """Make one backward pass of several: a step that differentiates more than
    once (a user's own gradient accumulation, unrolled) has a ``backward``
    marker and a ``grad`` marker per run. When no run's forward computation
    reads an earlier run's gradients, the ops are reordered into one run:
    every run's forward ops, one ``backward`` marker, every run's backward
    ops, the ``grad`` markers, then what combines the gradients. Returns
    whether the step now has one run (False when a forward op reads an
    earlier run's gradients, e.g. an update between chunks)."""
    block = function.body.block
    ops = list(block.ops)
    starts = [k for k, op in enumerate(ops) if is_marker(op, BACKWARD)]
    if len(starts) < 2:
        return len(starts) == 1
    grads = [k for k, op in enumerate(ops) if is_marker(op, GRAD) and k > starts[0]]
    if not grads:
        return False
    first, last = starts[0], grads[-1]
    kind: dict[Operation, str] = {}
    run_of: dict[Operation, int] = {}
    inside_backward = False
    run = 0
    for op in ops[first : last + 1]:
        if is_marker(op, BACKWARD):
            kind[op] = "start"
            inside_backward = True
            run += 1
        elif is_marker(op, GRAD):
            kind[op] = "grad"
            inside_backward = False
        elif inside_backward:
            kind[op] = "backward"
        else:  # between runs: the next run's forward, unless it reads a gradient
            reads = {o.owner for o in op.operands}
            late = any(kind.get(r) in ("backward", "grad", "after") for r in reads)  # type: ignore[arg-type]
            kind[op] = "after" if late else "forward"
            run_of[op] = run
    for op, k in kind.items():
        if k == "backward" and any(kind.get(o.owner) == "after" for o in op.operands):  # type: ignore[arg-type]
            return False
    span = ops[first : last + 1]
    runs = [ops[:first]] + [
        [op for op in span if kind[op] == "forward" and run_of[op] == r] for r in range(1, run)
    ]
    forward = _interleaved(runs)
    if forward is None:  # runs of different shapes: one after the other
        forward = [op for op in span if kind[op] == "forward"]
    else:  # the ops before the first marker are reordered with the rest
        for op in ops[:first]:
            op.detach()
    order = (
        forward
        + [ops[first]]
        + [op for op in span if kind[op] == "backward"]
        + [op for op in span if kind[op] == "grad"]
        + [op for op in span if kind[op] == "after"]
    )
    anchor = ops[last + 1]
    for op in span:
        op.detach()
    for op in order:
        block.insert_op_before(op, anchor)
    for op in span:
        if kind[op] == "start" and op is not ops[first]:
            op.erase()
    return True


def _signature(op: Operation) -> tuple[object, ...]:
    """What matching ops of two iterations share (their slice of the batch differs)."""
    return (op.name, tuple(op.operand_types), tuple(op.result_types))


def _interleaved(runs: list[list[Operation]]) -> list[Operation] | None:
    """The forward ops of unrolled iterations in lockstep, so that cutting the
    sequence into layers cuts every iteration at the same depth: the longest
    run of ops every run ends with (by kind and types) is interleaved, op ``i``
    of every run together; operand-free ops (shared constants) and the first
    run's other ops come first, the later runs' other ops (an accumulator
    update between iterations) last. None when that order would read a value
    before it is computed."""

    def floating(op: Operation) -> bool:
        return not op.operands and not op.regions

    free = [op for r in runs for op in r if floating(op)]
    runs = [[op for op in r if not floating(op)] for r in runs]
    common = min(_common_suffix(runs[0], r) for r in runs[1:])
    if common == 0:
        return None
    tails = [r[len(r) - common :] for r in runs]
    out = [*free, *runs[0][: len(runs[0]) - common]]
    for i in range(common):
        out += [t[i] for t in tails]
    for r in runs[1:]:
        out += r[: len(r) - common]
    position = {op: k for k, op in enumerate(out)}
    for k, op in enumerate(out):
        for operand in op.operands:
            owner = operand.owner
            if owner in position and position[owner] > k:  # type: ignore[index]
                return None
    return out


def _common_suffix(a: list[Operation], b: list[Operation]) -> int:
    n = 0
    while n < min(len(a), len(b)) and _signature(a[-1 - n]) == _signature(b[-1 - n]):
        n += 1
    return n


def _operand_free(owner: object) -> bool:
    """Whether ``owner`` is an op without operands (a constant, an iota)."""
    return isinstance(owner, Operation) and not owner.operands
