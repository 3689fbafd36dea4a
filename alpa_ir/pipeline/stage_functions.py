"""The ops of each (stage, phase) group cut out of ``@main`` and built into a
function: the values it receives and returns, recomputed forward ops (remat),
and the order of the groups (the second half of outlining)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DenseArrayBase,
    FlatSymbolRefAttr,
    FunctionType,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from alpa_ir.costs.function_fingerprint import Fingerprint
from alpa_ir.dialects.attrs import BATCH_ATTR, PER_MICRO_BATCH_ATTR
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.stage_assignment import Assignment, apply_round, function_name, is_apply_phase


@dataclass
class Group:
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
        assignment: Assignment,
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


def collect_groups(
    assignment: Assignment, returned: Sequence[SSAValue], remat: bool = False
) -> list[Group]:
    groups: dict[tuple[int, str], Group] = {}
    for op in assignment.ops:
        key = assignment.group.get(op)
        if key is not None:
            groups.setdefault(key, Group(key, [], [], [])).ops.append(op)
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
                groups[key] = Group(key, [], [], [])
                needed[key] = []
                inputs[key] = _Inputs(assignment, key, owner, needed)
            inputs[key].visit(value)
            needed[key].append(value)
    for key, g in groups.items():
        g.inputs = inputs[key].values
        g.outputs = list(dict.fromkeys(needed[key]))
        g.recompute = inputs[key].recompute
    return list(groups.values())


def order_groups(groups: list[Group], num_stages: int) -> list[Group]:
    """Forward stages ascending, backward descending, apply-grad in dependency order."""
    by_key = {g.key: g for g in groups}
    ordered = [by_key[(s, "forward")] for s in range(num_stages) if (s, "forward") in by_key]
    ordered += [
        by_key[(s, "backward")] for s in reversed(range(num_stages)) if (s, "backward") in by_key
    ]
    applies = sorted(
        (g for g in groups if is_apply_phase(g.key[1])),
        key=lambda g: (apply_round(g.key[1]), g.key[0]),
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


def body_steps(g: Group, assignment: Assignment) -> Iterator[Operation | tuple[SSAValue, SSAValue]]:
    """What :func:`build_function` puts into the function's block, in order:
    an op to copy (the ops of ``g``, each after the copied and recomputed
    producers of its operands), or ``(value, resolved)``: ``value`` stands for
    ``resolved`` (seen through the markers) where that is in the function."""
    copied: set[Operation] = set()

    def bind(operands: Sequence[SSAValue]) -> Iterator[Operation | tuple[SSAValue, SSAValue]]:
        for operand in operands:
            producer = assignment.copied(operand)
            if producer is None:
                owner = assignment.resolve(operand).owner
                if isinstance(owner, Operation) and owner in g.recompute:
                    producer = owner
            if producer is not None and producer not in copied:
                copied.add(producer)
                yield from bind(producer.operands)
                yield producer
        for operand in operands:
            yield operand, assignment.resolve(operand)

    for op in g.ops:
        yield from bind(op.operands)
        yield op
    yield from bind(g.outputs)


def group_fingerprint(
    g: Group, assignment: Assignment, printed: dict[Attribute, str] | None = None
) -> str:
    """The :func:`~alpa_ir.costs.function_fingerprint.function_fingerprint` of the
    function :func:`build_function` would build for ``g``, without building it
    (``printed``: the attributes' texts, shared by many groups)."""
    fingerprint = Fingerprint(
        FunctionType.from_lists([v.type for v in g.inputs], [v.type for v in g.outputs]),
        printed,
    )
    fingerprint.arguments(g.inputs)
    for step in body_steps(g, assignment):
        if isinstance(step, Operation):
            fingerprint.op(step)
        else:
            fingerprint.same_as(*step)
    fingerprint.returned(g.outputs)
    return fingerprint.digest()


def build_function(
    g: Group, assignment: Assignment, mesh: str, main_batch: set[SSAValue]
) -> func.FuncOp:
    block = Block(arg_types=[v.type for v in g.inputs])
    mapping: dict[SSAValue, SSAValue] = dict(zip(g.inputs, block.args, strict=True))
    for step in body_steps(g, assignment):
        if isinstance(step, Operation):
            block.add_op(step.clone(mapping))
        else:  # (with the value itself where its resolution is not in the function)
            operand, resolved = step
            mapping.setdefault(operand, mapping.get(resolved, operand))
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
