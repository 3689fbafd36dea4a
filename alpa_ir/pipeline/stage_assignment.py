"""Which stage and phase every op of a marked step belongs to (the first half
of outlining, see :mod:`alpa_ir.pipeline.stage_outline`): layers from the
markers, the slices of layers into stages, forward/backward segments, and the
apply-grad rounds of the ops after the gradient marker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DenseArrayBase,
    ModuleOp,
)
from xdsl.ir import Operation, SSAValue

from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.types import dtype_of
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import top_level_ops
from alpa_ir.pipeline.step_partition import is_grad_marker, partition_step

PHASES = ("forward", "backward", "apply_grad")


@dataclass(frozen=True)
class StageSlice:
    """Layers ``first..last`` (inclusive) on the logical mesh ``@mesh``."""

    first: int
    last: int
    mesh: str


def fresh_mesh_names(module: ModuleOp, count: int) -> list[str]:
    """``count`` names ``meshK`` no top-level op of ``module`` has yet."""
    taken = {op.sym_name.data for op in top_level_ops(module, LogicalMeshOp)}  # type: ignore[attr-defined]
    names: list[str] = []
    k = 0
    while len(names) < count:
        if f"mesh{k}" not in taken:
            names.append(f"mesh{k}")
        k += 1
    return names


def is_layer_marker(op: Operation) -> bool:
    return (
        isinstance(op, LaxOp)
        and op.primitive_name == "pipeline_marker"
        and op.param("kind") == "layer"
    )


def is_backward_marker(op: Operation) -> bool:
    """The operand-free marker before the first op of the backward pass
    (:mod:`alpa_ir.frontend.differentiation`)."""
    return (
        isinstance(op, LaxOp)
        and op.primitive_name == "pipeline_marker"
        and op.param("kind") == "backward"
    )


def is_forward_only(function: func.FuncOp) -> bool:
    """Whether ``@main`` computes no gradients (an inference step): it has no
    gradient marker, which every differentiated step has (``alpa_ir.grad``'s,
    or the one the importer puts after JAX's backward pass)."""
    return not any(is_grad_marker(op) for op in function.body.block.ops)


def count_layers(function: func.FuncOp) -> int:
    """``L``: the layers that the step's markers delimit (1 without markers):
    ``L - 1`` markers in a forward-only step, ``2(L - 1)`` in a differentiated
    one (each forward marker mirrored in the backward pass)."""
    markers = [op for op in function.body.block.ops if is_layer_marker(op)]
    if is_forward_only(function):
        return len(markers) + 1
    if len(markers) % 2:
        raise AlpaError(
            f"@{function.sym_name.data} has {len(markers)} layer markers; a differentiated "
            "step has an even number (each forward marker is mirrored in the backward pass)"
        )
    half = len(markers) // 2
    for k in range(half):
        forward, backward = markers[k], markers[len(markers) - 1 - k]
        # integer and boolean values have no cotangents to mirror
        differentiable = [v.type for v in forward.operands if _is_float(v.type)]
        if backward.operands and differentiable != [v.type for v in backward.operands]:
            raise AlpaError(
                f"layer marker {k} and its backward mirror carry different types; "
                "mark layer boundaries only inside the differentiated loss function"
            )
    return half + 1


def _is_float(type_: object) -> bool:
    """A floating-point tensor type, bf16 included (numpy's kind of ml_dtypes'
    bfloat16 is ``V``, not ``f``)."""
    import jax.numpy as jnp

    try:
        return bool(jnp.issubdtype(dtype_of(type_), jnp.floating))  # type: ignore[arg-type]
    except Exception:  # not a tensor
        return False


def function_name(stage: int, phase: str) -> str:
    return f"stage{stage}_{phase}"


def batch_args(function: func.FuncOp) -> list[int]:
    attr = function.attributes.get(BATCH_ATTR)
    return [int(x) for x in attr.get_values()] if isinstance(attr, DenseArrayBase) else []


def _check_slices(slices: Sequence[StageSlice], num_layers: int) -> None:
    if not slices:
        raise AlpaError("a pipeline plan needs at least one stage")
    if len(slices) > num_layers:
        raise AlpaError(f"{len(slices)} stages requested but the step has only {num_layers} layers")
    expected = 0
    for k, s in enumerate(slices):
        if s.first != expected or s.last < s.first:
            raise AlpaError(
                f"stage {k} covers layers {s.first}..{s.last}; stages must cover layers "
                f"0..{num_layers - 1} in order without gaps"
            )
        expected = s.last + 1
    if expected != num_layers:
        raise AlpaError(f"the stages cover layers 0..{expected - 1} of 0..{num_layers - 1}")


class Assignment:
    """Which (stage, phase) group every op of ``@main`` belongs to. Operand-free
    ops (``floating``) and apply ops computed from ``@main`` arguments and
    constants only (``shared``) belong to none: every function that uses
    them computes its own copy."""

    def __init__(self, function: func.FuncOp, slices: Sequence[StageSlice]) -> None:
        block = function.body.block
        self.function = function
        self.ops = [op for op in block.ops if op is not block.last_op]
        num_layers = count_layers(function)
        _check_slices(slices, num_layers)
        stage_of_layer = [k for k, s in enumerate(slices) for _ in range(s.first, s.last + 1)]
        self.alias: dict[SSAValue, SSAValue] = {}
        self.floating: set[Operation] = set()
        self.shared: set[Operation] = set()
        self.group: dict[Operation, tuple[int, str]] = {}
        if is_forward_only(function):
            self._assign_forward_only(stage_of_layer)
            return
        partition = partition_step(function, batch_args(function))
        grad_dependent = set(partition.apply)
        self.batch_dependent = set(partition.compute)
        segments: dict[Operation, int] = {}
        after_grad: set[Operation] = set()
        last = num_layers - 1
        # the ops of segment ``last`` after the ``backward`` marker: the last
        # layer's backward, outlined apart from its forward (as Alpa does)
        last_backward: set[Operation] = set()
        segment = 0
        in_backward = False
        for op in self.ops:
            if is_backward_marker(op):
                in_backward = True
            if is_layer_marker(op) or is_grad_marker(op):
                for result, operand in zip(op.results, op.operands, strict=True):
                    self.alias[result] = operand
                segment += is_layer_marker(op)
                if is_grad_marker(op):
                    after_grad.clear()  # only the ops after the last gradient marker
            elif not op.operands and not op.regions:
                self.floating.add(op)
            else:
                segments[op] = segment
                if segment == last and in_backward:
                    last_backward.add(op)
                if op not in self.batch_dependent and op not in grad_dependent:
                    after_grad.add(op)
        apply_ops = _apply_phase(self.ops, grad_dependent, after_grad, block.last_op)
        apply_ops |= _deferred_gradient_sums(self.ops, segments, last, self.resolve)
        for op, s in segments.items():
            if op not in apply_ops:
                layer = _layer_of_segment(s, last)
                phase = "backward" if s > last or op in last_backward else "forward"
                self.group[op] = (stage_of_layer[layer], phase)
        self._assign_apply([op for op in self.ops if op in apply_ops])

    def _assign_forward_only(self, stage_of_layer: Sequence[int]) -> None:
        """An inference step: every op runs in the forward function of its
        layer's stage, once per micro-batch (no backward, no apply-grad)."""
        segment = 0
        self.batch_dependent = set()
        block = self.ops[0].parent_block() if self.ops else None
        batch: set[SSAValue] = (
            {block.args[k] for k in batch_args(self.function)} if block is not None else set()
        )
        for op in self.ops:
            if any(v in batch for v in op.operands):
                batch.update(op.results)
            if is_layer_marker(op):
                for result, operand in zip(op.results, op.operands, strict=True):
                    self.alias[result] = operand
                segment += 1
            elif not op.operands and not op.regions:
                self.floating.add(op)
            else:
                self.group[op] = (stage_of_layer[segment], "forward")
                if any(v in batch for v in op.results):
                    self.batch_dependent.add(op)

    def resolve(self, value: SSAValue) -> SSAValue:
        while value in self.alias:
            value = self.alias[value]
        return value

    def producer(self, value: SSAValue) -> Operation | None:
        owner = self.resolve(value).owner
        return owner if isinstance(owner, Operation) else None

    def copied(self, value: SSAValue) -> Operation | None:
        """The producer of ``value`` when functions copy it rather than receive it."""
        producer = self.producer(value)
        if producer is not None and (producer in self.floating or producer in self.shared):
            return producer
        return None

    def _assign_apply(self, apply_ops: list[Operation]) -> None:
        """Each apply op goes to a stage, and to the first apply-grad round
        after every round of another stage whose result it reads (a global
        gradient norm: each stage's partial sums in round 0, their total in
        round 1, the updates that use it in round 1 or 2)."""
        rounds: dict[Operation, int] = {}
        for op in apply_ops:
            producers = [self.producer(v) for v in op.operands]
            groups = [self.group[p] for p in producers if p is not None and p in self.group]
            if not groups:  # only @main arguments, constants and other shared ops
                self.shared.add(op)
                continue
            computed = [g for g in groups if not is_apply_phase(g[1])]
            chosen = computed[0] if computed else groups[0]
            stage = chosen[0]
            round_ = 0
            for p in producers:
                if p in rounds:
                    other = self.group[p][0] != stage
                    round_ = max(round_, rounds[p] + other)
            rounds[op] = round_
            self.group[op] = (stage, apply_phase(round_))


def apply_phase(round_: int) -> str:
    """The phase name of apply-grad round ``round_`` (``apply_grad``, ``apply_grad_1``, ...)."""
    return "apply_grad" if round_ == 0 else f"apply_grad_{round_}"


def is_apply_phase(phase: str) -> bool:
    return phase.startswith("apply_grad")


def apply_round(phase: str) -> int:
    return 0 if phase == "apply_grad" else int(phase.rsplit("_", 1)[1])


def _apply_phase(
    ops: Sequence[Operation],
    grad_dependent: set[Operation],
    after_grad: set[Operation],
    terminator: Operation,
) -> set[Operation]:
    """The ops that run once per step after the gradients (``apply``): those
    that depend on the gradients, and the ops of ``after_grad`` (after the
    gradient marker, depending on neither the batch nor the gradients) whose
    users all are apply ops or the return. Users come later in program
    order, so one backward sweep decides every op after its users."""
    phase = set(grad_dependent)
    for op in reversed(ops):
        if op in after_grad and all(
            use.operation in phase or use.operation is terminator
            for result in op.results
            for use in result.uses
        ):
            phase.add(op)
    return phase


def _layer_of_segment(segment: int, last: int) -> int:
    """The layer of an op in ``segment`` of the step (segments counted across
    the layer markers): segments ``0..last`` hold the forward of layers
    ``0..last`` (the last also its backward, after the ``backward`` marker), the later ones the backward of
    the layers before it, mirrored (segment ``last + 1`` is layer ``last - 1``)."""
    return segment if segment <= last else 2 * last - segment


def _deferred_gradient_sums(
    ops: Sequence[Operation],
    segments: dict[Operation, int],
    last: int,
    resolve: Callable[[SSAValue], SSAValue],
) -> set[Operation]:
    """The additions (``add_any``, how differentiation sums a value's
    cotangents) of one parameter's gradient contributions computed in
    different layers, whose sum only reaches the gradient marker: a tied
    embedding's part from the LM head and its part from the lookup. They join
    the apply phase, which adds the contributions once per step after each
    stage has accumulated its own over the micro-batches, instead of one
    stage sending its contribution to the other on every micro-batch."""

    sums: set[Operation] = set()
    for op in reversed(ops):
        if (
            isinstance(op, LaxOp)
            and op.primitive_name == "add_any"
            and op in segments
            and all(
                is_grad_marker(use.operation) or use.operation in sums
                for result in op.results
                for use in result.uses
            )
        ):
            sums.add(op)
    sources: dict[Operation, set[int]] = {}
    for op in ops:
        if op not in sums:
            continue
        found: set[int] = set()
        for operand in op.operands:
            producer = resolve(operand).owner
            if producer in sums:
                found |= sources[producer]  # type: ignore[index]
            elif producer in segments:
                found.add(_layer_of_segment(segments[producer], last))  # type: ignore[index]
        sources[op] = found
    return {op for op in sums if len(sources[op]) > 1}
