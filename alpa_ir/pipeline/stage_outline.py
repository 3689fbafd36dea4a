"""Outline a training step into per-stage forward, backward and apply-grad functions.

Input: an imported step whose ``@main`` carries layer markers
(``mark_pipeline_boundary``, or those ``cluster-operators`` inserted) and the
gradient marker (``alpa_ir.grad`` / ``value_and_grad``), and a slicing of its
layers into stages, each on a named logical mesh.

Layers come from the markers' positions. Differentiation mirrors every
forward marker into the backward computation (the marker's transpose), so a
step with ``L`` layers has ``2(L − 1)`` layer markers in program order:
segment ``s`` (the ops after ``s`` markers) is the forward of layer ``s`` for
``s < L − 1``, the last layer's forward *and* backward for ``s = L − 1``, and
the backward of layer ``2(L − 1) − s`` after that. The backward ops of a layer
thus land with its forward ops (Alpa §5.1, constraint 1).

Ops after the gradient marker that depend on the gradients, or that depend on
neither the batch nor the gradients and are used only by such ops or the
return (the optimizer, ``apply``), run once per step in apply-grad functions:

- an apply op that depends on no forward/backward result, only on ``@main``
  arguments, constants and other such ops (Adam's step counter ``count + 1``,
  the bias corrections ``1 - b**count``, the decay ``b1 * mu`` of optimizer
  state), is *duplicated*: every apply-grad function that uses it, directly
  or through its own ops, computes its own copy, so no value crosses from one
  apply-grad function to another (``emit-instructions`` runs each stage's
  apply-grad on its own mesh once all gradients are there). A step result
  that is such a value (the new count) is returned by the lowest stage whose
  apply-grad function uses it (stage 0 when none does);
- any other apply op goes to the stage of the gradient or parameter it
  updates: that of its first operand computed by a forward/backward
  function, else of one computed by an earlier apply op.

Markers are identities and disappear; operand-free ops (constants, iota) are
copied into every function that uses them.

Output, written into the module (the pipeline IR contract):
``pipeline.plan``, one ``pipeline.stage`` per stage, functions
``stage<i>_forward`` / ``stage<i>_backward`` / ``stage<i>_apply_grad`` (each
with ``mesh.mesh``), and ``@main`` rewritten as the driver: only ``func.call``
ops in dependency order and the return. Forward and backward functions run
once per micro-batch; results of theirs that apply-grad functions use or
``@main`` returns are accumulated (mean over micro-batches).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FlatSymbolRefAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from alpa_ir.dialects.attrs import BATCH_ATTR, PER_MICRO_BATCH_ATTR
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.dialects.pipeline import SCHEDULES, PlanOp, StageOp
from alpa_ir.dialects.types import dtype_of
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, top_level_ops
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


def count_layers(function: func.FuncOp) -> int:
    """``L``: the layers that the step's markers delimit (1 without markers)."""
    markers = [op for op in function.body.block.ops if is_layer_marker(op)]
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
    try:
        return dtype_of(type_).kind == "f"  # type: ignore[arg-type]
    except Exception:  # not a tensor
        return False


def function_name(stage: int, phase: str) -> str:
    return f"stage{stage}_{phase}"


def _batch_args(function: func.FuncOp) -> list[int]:
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


class _Assignment:
    """Which (stage, phase) group every op of ``@main`` belongs to. Operand-free
    ops (``floating``) and apply ops computed from ``@main`` arguments and
    constants only (``shared``) belong to none: every function that uses
    them computes its own copy."""

    def __init__(self, function: func.FuncOp, slices: Sequence[StageSlice]) -> None:
        block = function.body.block
        self.ops = [op for op in block.ops if op is not block.last_op]
        num_layers = count_layers(function)
        _check_slices(slices, num_layers)
        stage_of_layer = [k for k, s in enumerate(slices) for _ in range(s.first, s.last + 1)]
        partition = partition_step(function, _batch_args(function))
        grad_dependent = set(partition.apply)
        self.batch_dependent = set(partition.compute)
        self.alias: dict[SSAValue, SSAValue] = {}
        self.floating: set[Operation] = set()
        self.shared: set[Operation] = set()
        self.group: dict[Operation, tuple[int, str]] = {}
        segments: dict[Operation, int] = {}
        after_grad: set[Operation] = set()
        segment = 0
        for op in self.ops:
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
                if op not in self.batch_dependent and op not in grad_dependent:
                    after_grad.add(op)
        apply_ops = _apply_phase(self.ops, grad_dependent, after_grad, block.last_op)
        last = num_layers - 1
        apply_ops |= _deferred_gradient_sums(self.ops, segments, last, self.resolve)
        for op, s in segments.items():
            if op not in apply_ops:
                layer = _layer_of_segment(s, last)
                phase = "forward" if s <= last else "backward"
                self.group[op] = (stage_of_layer[layer], phase)
        self._assign_apply([op for op in self.ops if op in apply_ops])

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


def _apply_round(phase: str) -> int:
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
    ``0..last`` (the last also its backward), the later ones the backward of
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


@dataclass
class _Group:
    key: tuple[int, str]
    ops: list[Operation]
    inputs: list[SSAValue]
    outputs: list[SSAValue]
    recompute: set[Operation] = field(default_factory=set)
    """Forward ops of its own stage a backward group recomputes (remat)."""


class _Inputs:
    """The values one group receives: operands of its ops (and of the copies
    it computes) that no op of its own or copy defines."""

    def __init__(
        self,
        assignment: _Assignment,
        key: tuple[int, str],
        owner: dict[SSAValue, tuple[int, str]],
        needed: dict[tuple[int, str], list[SSAValue]],
        remat: bool = False,
    ) -> None:
        self.assignment, self.key, self.owner, self.needed = assignment, key, owner, needed
        self.values: list[SSAValue] = []
        self.copies: set[Operation] = set()
        self.recompute: set[Operation] = set()
        """With ``remat`` (a backward group): the ops of its stage's forward group
        it recomputes from that group's inputs instead of receiving their results."""
        self.remat = remat
        self._seen: set[SSAValue] = set()

    def visit(self, operand: SSAValue) -> None:
        value = self.assignment.resolve(operand)
        copied = self.assignment.copied(value)
        if copied is not None:
            if copied not in self.copies:
                self.copies.add(copied)
                for inner in copied.operands:
                    self.visit(inner)
            return
        if self.owner.get(value) == self.key or value in self._seen:
            return
        if self.remat and self.owner.get(value) == (self.key[0], "forward"):
            producer = value.owner
            assert isinstance(producer, Operation)
            if producer not in self.recompute:
                self.recompute.add(producer)
                for inner in producer.operands:
                    self.visit(inner)
            return
        self._seen.add(value)
        self.values.append(value)
        if value in self.owner:
            self.needed[self.owner[value]].append(value)


def _collect_groups(
    assignment: _Assignment, returned: Sequence[SSAValue], remat: bool = False
) -> list[_Group]:
    groups: dict[tuple[int, str], _Group] = {}
    for op in assignment.ops:
        key = assignment.group.get(op)
        if key is not None:
            groups.setdefault(key, _Group(key, [], [], [])).ops.append(op)
    owner: dict[SSAValue, tuple[int, str]] = {
        r: key for key, g in groups.items() for op in g.ops for r in op.results
    }
    needed: dict[tuple[int, str], list[SSAValue]] = {k: [] for k in groups}
    last_stage = max((k[0] for k in groups), default=0)
    inputs = {
        key: _Inputs(
            assignment, key, owner, needed, remat and key[1] == "backward" and key[0] < last_stage
        )
        for key in groups
    }
    for key, g in groups.items():
        for op in g.ops:
            for operand in op.operands:
                inputs[key].visit(operand)
    for value in returned:
        value = assignment.resolve(value)
        copied = assignment.copied(value)
        if value in owner:
            needed[owner[value]].append(value)
        elif copied is not None:
            # A copied value the step returns: the lowest stage computing it
            # for its apply-grad returns it (stage 0 when none computes it).
            stage = min(
                (k[0] for k, c in inputs.items() if is_apply_phase(k[1]) and copied in c.copies),
                default=0,
            )
            key = (stage, "apply_grad")
            if key not in groups:
                groups[key] = _Group(key, [], [], [])
                needed[key] = []
                inputs[key] = _Inputs(assignment, key, owner, needed)
            inputs[key].visit(value)
            needed[key].append(value)
    for key, g in groups.items():
        g.inputs = inputs[key].values
        g.outputs = list(dict.fromkeys(needed[key]))
        g.recompute = inputs[key].recompute
    return list(groups.values())


def _order(groups: list[_Group], num_stages: int) -> list[_Group]:
    """Forward stages ascending, backward descending, apply-grad in dependency order."""
    by_key = {g.key: g for g in groups}
    ordered = [by_key[(s, "forward")] for s in range(num_stages) if (s, "forward") in by_key]
    ordered += [
        by_key[(s, "backward")] for s in reversed(range(num_stages)) if (s, "backward") in by_key
    ]
    applies = sorted(
        (g for g in groups if is_apply_phase(g.key[1])),
        key=lambda g: (_apply_round(g.key[1]), g.key[0]),
    )
    defined = {v for g in ordered for v in g.outputs}
    while applies:
        ready = [g for g in applies if all(_defined(v, defined) for v in g.inputs)]
        if not ready:
            names = ", ".join(function_name(*g.key) for g in applies)
            raise AlpaError(
                f"the apply-grad computations {names} depend on each other (e.g. global "
                "gradient clipping across stages); outline them into one stage"
            )
        for g in ready:
            ordered.append(g)
            defined.update(g.outputs)
            applies.remove(g)
    for position, g in enumerate(ordered):
        earlier = {v for h in ordered[:position] for v in h.outputs}
        for value in g.inputs:
            if not _defined(value, earlier):
                raise AlpaError(
                    f"{function_name(*g.key)} uses a value computed later in the step; "
                    "layer markers must follow the order of the computation"
                )
    return ordered


def _defined(value: SSAValue, defined: set[SSAValue]) -> bool:
    return not isinstance(value.owner, Operation) or value in defined


def _build_function(
    g: _Group, assignment: _Assignment, mesh: str, main_batch: set[SSAValue]
) -> func.FuncOp:
    block = Block(arg_types=[v.type for v in g.inputs])
    mapping: dict[SSAValue, SSAValue] = dict(zip(g.inputs, block.args, strict=True))
    copied: set[Operation] = set()

    def bind(operands: Sequence[SSAValue]) -> None:
        """Map ``operands`` into the function, computing the copied (and the
        rematerialized) ones first."""
        for operand in operands:
            producer = assignment.copied(operand)
            if producer is None:
                owner = assignment.resolve(operand).owner
                if isinstance(owner, Operation) and owner in g.recompute:
                    producer = owner
            if producer is not None and producer not in copied:
                copied.add(producer)
                bind(producer.operands)
                block.add_op(producer.clone(mapping))
        for operand in operands:
            mapping.setdefault(operand, mapping.get(assignment.resolve(operand), operand))

    for op in g.ops:
        bind(op.operands)
        block.add_op(op.clone(mapping))
    bind(g.outputs)
    block.add_op(func.ReturnOp(*[mapping[v] for v in g.outputs]))
    function = func.FuncOp(
        function_name(*g.key),
        ([v.type for v in g.inputs], [v.type for v in g.outputs]),
        Region(block),
    )
    function.attributes[MESH_ATTR] = FlatSymbolRefAttr(mesh)
    batch = [k for k, v in enumerate(g.inputs) if v in main_batch]
    if batch:
        function.attributes[BATCH_ATTR] = DenseArrayBase.from_list(i64, batch)
    if not is_apply_phase(g.key[1]):
        varying = [k for k, v in enumerate(g.outputs) if v.owner in assignment.batch_dependent]
        function.attributes[PER_MICRO_BATCH_ATTR] = DenseArrayBase.from_list(i64, varying)
    return function


def outline_stages(
    module: ModuleOp,
    slices: Sequence[StageSlice],
    num_micro_batches: int = 1,
    schedule: str = "1f1b",
    remat: bool = False,
    schedules: Collection[str] = SCHEDULES,
) -> None:
    """Rewrite ``module``'s ``@main`` into the outlined pipeline form (see module
    doc). With ``remat`` (Alpa's ``remat_layer``) the backward function of every
    stage but the last recomputes its stage's forward values from the forward
    function's inputs instead of receiving them: a stage keeps only its inputs
    per micro-batch in flight, not its activations. ``schedules``: the schedule
    names known (the built-in ones, and a plugin's where the caller has them)."""
    if schedule not in schedules:
        raise AlpaError(
            f"unknown pipeline schedule '{schedule}'; expected one of {', '.join(schedules)}"
        )
    if num_micro_batches < 1:
        raise AlpaError(f"num_micro_batches must be at least 1, got {num_micro_batches}")
    main = main_function(module)
    returned = list(main.body.block.last_op.operands)  # type: ignore[union-attr]
    assignment = _Assignment(main, slices)
    groups = _order(_collect_groups(assignment, returned, remat), len(slices))
    batch_values = {main.body.block.args[k] for k in _batch_args(main)}
    functions = {
        g.key: _build_function(g, assignment, slices[g.key[0]].mesh, batch_values) for g in groups
    }

    new_block = Block(arg_types=[a.type for a in main.body.block.args])
    values: dict[SSAValue, SSAValue] = dict(zip(main.body.block.args, new_block.args, strict=True))
    for g in groups:
        call = func.CallOp(
            function_name(*g.key), [values[v] for v in g.inputs], [v.type for v in g.outputs]
        )
        new_block.add_op(call)
        values.update(zip(g.outputs, call.results, strict=True))
    new_block.add_op(func.ReturnOp(*[values[assignment.resolve(v)] for v in returned]))
    new_main = func.FuncOp(
        "main",
        main.function_type,
        Region(new_block),
        arg_attrs=main.arg_attrs,
        res_attrs=main.res_attrs,
    )
    for name, attr in main.attributes.items():
        if name not in new_main.attributes:
            new_main.attributes[name] = attr

    top = module.body.block
    stage_ops = []
    for k, s in enumerate(slices):
        refs: dict[str, Attribute] = {
            phase: FlatSymbolRefAttr(function_name(k, phase))
            for phase in PHASES
            if (k, phase) in functions
        }
        rounds = sorted(
            (_apply_round(p), p) for (i, p) in functions if i == k and is_apply_phase(p)
        )
        if len(rounds) > 1 or (rounds and rounds[0][0] > 0):
            if rounds[0][0] > 0:  # a stage whose apply-grad starts in a later round
                refs["apply_grad"] = FlatSymbolRefAttr(function_name(k, rounds[0][1]))
                rounds = rounds[1:]
            else:
                rounds = rounds[1:]
            if rounds:
                refs["apply_grad_rounds"] = ArrayAttr(
                    [FlatSymbolRefAttr(function_name(k, p)) for _, p in rounds]
                )
        stage_ops.append(
            StageOp.create(
                properties={
                    "sym_name": StringAttr(f"stage{k}"),
                    "layers": DenseArrayBase.from_list(i64, [s.first, s.last]),
                    "mesh": FlatSymbolRefAttr(s.mesh),
                    **refs,
                }
            )
        )
    plan = PlanOp.create(
        properties={
            "sym_name": StringAttr("plan"),
            "stages": ArrayAttr([FlatSymbolRefAttr(f"stage{k}") for k in range(len(slices))]),
            "num_micro_batches": IntegerAttr(num_micro_batches, i64),
            "schedule": StringAttr(schedule),
        }
    )
    top.insert_ops_before([plan, *stage_ops, *functions.values(), new_main], main)
    top.erase_op(main)


@dataclass(frozen=True)
class LayerRangeFunction:
    """The forward+backward ops of layers ``first..last`` as one function (a
    stage candidate for ``construct-stages``). ``param_args``: its arguments
    that are non-batch arguments of ``@main`` (parameters); ``cross_bytes``:
    bytes of the other arguments computed by other layers (activations in,
    gradients back), i.e. what crosses into the stage per micro-batch."""

    function: func.FuncOp
    param_args: tuple[int, ...]
    cross_bytes: float
    backward_bytes: float = 0.0
    """The part of ``cross_bytes`` that later layers send back (gradients);
    the rest comes from earlier layers (activations)."""


class LayerRanges:
    """Extract the forward+backward computation of any layer range of a marked
    step (``@main`` with ``L`` layers, see :func:`count_layers`) without
    outlining: the ops are grouped per layer once, each range is then cut out
    and cloned into a new function."""

    def __init__(self, function: func.FuncOp) -> None:
        from alpa_ir.dialects.types import nbytes_of

        self.num_layers = count_layers(function)
        slices = [StageSlice(k, k, "") for k in range(self.num_layers)]
        self._assignment = _Assignment(function, slices)
        self._block = function.body.block
        batch = set(_batch_args(function))
        self._params = {a for k, a in enumerate(self._block.args) if k not in batch}
        self._batch = {a for k, a in enumerate(self._block.args) if k in batch}
        self._nbytes = nbytes_of
        a = self._assignment
        self._layer = {
            op: key[0] for op, key in a.group.items() if key[1] in ("forward", "backward")
        }
        # For every produced value: the layers that use it (through markers);
        # -1 stands for a use outside any layer (apply-grad or the return).
        outside = -1
        self._user_layers: dict[SSAValue, set[int]] = {}
        for op in a.ops:
            if op in a.floating or is_layer_marker(op) or is_grad_marker(op):
                continue
            for operand in op.operands:
                value = a.resolve(operand)
                self._user_layers.setdefault(value, set()).add(self._layer.get(op, outside))
        for operand in self._block.last_op.operands:  # type: ignore[union-attr]
            self._user_layers.setdefault(a.resolve(operand), set()).add(outside)
        # Bytes of the values layer l receives from layer k (k != l), each value once per l.
        self._edges = [[0.0] * self.num_layers for _ in range(self.num_layers)]
        received: set[tuple[int, SSAValue]] = set()
        for op, layer in self._layer.items():
            for operand in op.operands:
                value = a.resolve(operand)
                producer = (
                    self._layer.get(value.owner) if isinstance(value.owner, Operation) else None
                )
                if producer is None or producer == layer or (layer, value) in received:
                    continue
                received.add((layer, value))
                self._edges[layer][producer] += float(nbytes_of(value.type))

    def layer_ops(self) -> list[tuple[list[Operation], list[Operation]]]:
        """Per layer: its forward ops and its backward ops, in program order."""
        out: list[tuple[list[Operation], list[Operation]]] = [
            ([], []) for _ in range(self.num_layers)
        ]
        for op in self._assignment.ops:
            layer = self._layer.get(op)
            if layer is not None:
                out[layer][self._assignment.group[op][1] == "backward"].append(op)
        return out

    def user_layers(self, value: SSAValue) -> frozenset[int]:
        """The layers whose ops read ``value`` (``-1``: a read outside every layer,
        by apply-grad or the return)."""
        return frozenset(self._user_layers.get(self._assignment.resolve(value), ()))

    def resolve(self, value: SSAValue) -> SSAValue:
        """``value`` seen through the layer and gradient markers."""
        return self._assignment.resolve(value)

    def returned(self) -> set[SSAValue]:
        """The values the step returns, seen through the markers."""
        ret = self._block.last_op
        return {self._assignment.resolve(v) for v in ret.operands} if ret is not None else set()

    def internal_bytes(self, first: int, last: int, *, backward: bool = False) -> float:
        """Bytes that layers ``first..last`` pass to each other (the sum over the
        layers of what each receives from another layer of the range); with
        ``backward``, only what later layers send to earlier ones (gradients)."""
        return float(self.internal_bytes_table(backward=backward)[first, last])

    def internal_bytes_table(self, *, backward: bool = False) -> np.ndarray:
        """:meth:`internal_bytes` of every range at once: ``[first, last]``
        (``0`` below the diagonal), from 2-D prefix sums of the layer-to-layer
        bytes."""
        edges = np.asarray(self._edges, dtype=np.float64)  # [receiver, sender]
        if backward:
            edges = np.triu(edges, 1)  # senders after their receivers
        prefix = np.zeros((self.num_layers + 1, self.num_layers + 1))
        prefix[1:, 1:] = edges.cumsum(0).cumsum(1)
        lo = np.arange(self.num_layers)[:, None]
        hi = np.arange(self.num_layers)[None, :] + 1
        table = prefix[hi, hi] - prefix[lo, hi] - prefix[hi, lo] + prefix[lo, lo]
        return np.where(lo < hi, table, 0.0)

    def function(self, first: int, last: int, name: str = "main") -> LayerRangeFunction:
        """Layers ``first..last`` (inclusive), forward and backward ops in program order."""
        if not 0 <= first <= last < self.num_layers:
            raise AlpaError(
                f"layer range {first}..{last} is outside the step's layers 0..{self.num_layers - 1}"
            )
        a = self._assignment
        ops = [op for op in a.ops if first <= self._layer.get(op, -1) <= last]
        inside = set(ops)
        inputs: list[SSAValue] = []
        seen: set[SSAValue] = set()
        for op in ops:
            for operand in op.operands:
                value = a.resolve(operand)
                owner = value.owner
                if isinstance(owner, Operation) and (owner in a.floating or owner in inside):
                    continue
                if value not in seen:
                    seen.add(value)
                    inputs.append(value)
        outputs = [
            r
            for op in ops
            for r in op.results
            if any(not first <= u <= last for u in self._user_layers.get(r, ()))
        ]
        g = _Group((0, "forward"), ops, inputs, outputs)
        built = _build_function(g, a, "", self._batch)
        built.sym_name = StringAttr(name)
        built.attributes.pop(MESH_ATTR, None)
        built.attributes.pop(PER_MICRO_BATCH_ATTR, None)
        params = tuple(k for k, v in enumerate(inputs) if v in self._params)
        crossing = [v for v in inputs if v not in self._params and v not in self._batch]
        cross = float(sum(self._nbytes(v.type) for v in crossing))
        back = float(
            sum(
                self._nbytes(v.type)
                for v in crossing
                if isinstance(v.owner, Operation) and self._layer.get(v.owner, -1) > last
            )
        )
        return LayerRangeFunction(built, params, cross, back)
