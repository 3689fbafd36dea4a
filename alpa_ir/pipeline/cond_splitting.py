"""Split a ``lax.cond`` into independent conditionals, one per group of results.

An optimizer guarded by a condition (``optax.MultiSteps``, "skip the update
unless every gradient is finite", a hand-written ``lax.cond`` around
``tx.update``) is one ``cond`` whose operands are every parameter, gradient
and optimizer state of the model and whose results are all their new values.
A pipeline must update each stage's parameters on that stage; one ``cond``
would have to run on one mesh and receive every other stage's state. Most of
its results are independent: the new value of one parameter reads that
parameter, its gradient and its optimizer state, and a few shared scalars
(the step count, the learning rate).

Results are grouped by what they share: two results belong together when, in
some branch, they are computed from a common non-scalar argument or a
common non-scalar intermediate value. Scalars may be shared freely: a group
that needs one takes it as an operand, and scalar computations inside the
branches (bias corrections) are repeated in every group that uses them. Each
group becomes a ``cond`` with the same predicate, only the arguments its
results need, and in each branch only the ops its results need. Semantics do
not change.
"""

from __future__ import annotations

import math

from xdsl.ir import Block, Operation, Region, SSAValue

from alpa_ir.dialects.lax import PRIMITIVE_OPS, LaxOp, ReturnOp
from alpa_ir.dialects.types import shape_of


def _is_scalar(value: SSAValue) -> bool:
    try:
        return math.prod(shape_of(value.type)) <= 1
    except Exception:  # not a tensor
        return True


class _Groups:
    """Union-find over a cond's results."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, k: int) -> int:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for k in range(len(self.parent)):
            out.setdefault(self.find(k), []).append(k)
        return sorted(out.values())


def _slices(block: Block) -> list[set[Operation | SSAValue]]:
    """For each returned value of ``block``: the ops and block arguments it depends on."""
    terminator = block.last_op
    assert terminator is not None
    memo: dict[SSAValue, frozenset[Operation | SSAValue]] = {}
    for arg in block.args:
        memo[arg] = frozenset({arg})
    for op in block.ops:
        if op is terminator:
            break
        deps: set[Operation | SSAValue] = {op}
        for operand in op.operands:
            deps |= memo.get(operand, frozenset())
        frozen = frozenset(deps)
        for result in op.results:
            memo[result] = frozen
    return [set(memo.get(v, frozenset())) for v in terminator.operands]


def result_groups(cond: LaxOp) -> list[list[int]]:
    """The groups of ``cond``'s results that can be computed by separate conds."""
    groups = _Groups(len(cond.results))
    for region in cond.regions:
        slices = _slices(region.block)
        owner: dict[Operation | SSAValue, int] = {}
        for k, deps in enumerate(slices):
            for dep in deps:
                values = dep.results if isinstance(dep, Operation) else [dep]
                if all(_is_scalar(v) for v in values):
                    continue
                if dep in owner:
                    groups.union(owner[dep], k)
                else:
                    owner[dep] = k
    return groups.groups()


def _split_region(region: Region, outputs: list[int], args: list[int]) -> Region:
    """A copy of ``region`` that takes block arguments ``args`` and returns ``outputs``."""
    block = region.block
    terminator = block.last_op
    assert terminator is not None
    needed: set[Operation | SSAValue] = set()
    slices = _slices(block)
    for k in outputs:
        needed |= slices[k]
    new_block = Block(arg_types=[block.args[a].type for a in args])
    mapping: dict[SSAValue, SSAValue] = {
        block.args[a]: new for a, new in zip(args, new_block.args, strict=True)
    }
    for op in block.ops:
        if op is terminator:
            break
        if op in needed:
            new_block.add_op(op.clone(mapping))
    new_block.add_op(ReturnOp.create(operands=[mapping[terminator.operands[k]] for k in outputs]))
    return Region(new_block)


def split_cond(cond: LaxOp) -> list[Operation]:
    """Replace ``cond`` by one cond per result group (no-op for one group);
    returns the new ops."""
    groups = result_groups(cond)
    if len(groups) < 2:
        return [cond]
    block = cond.parent_block()
    assert block is not None
    index, *operands = cond.operands
    new_ops: list[Operation] = []
    for outputs in groups:
        used: set[int] = set()
        for region in cond.regions:
            slices = _slices(region.block)
            for k in outputs:
                used |= {a.index for a in slices[k] if isinstance(a, SSAValue)}  # type: ignore[attr-defined]
        args = sorted(used)
        new = PRIMITIVE_OPS["cond"].create(
            operands=[index, *(operands[a] for a in args)],
            result_types=[cond.results[k].type for k in outputs],
            properties=dict(cond.properties),
            attributes=dict(cond.attributes),
            regions=[_split_region(r, outputs, args) for r in cond.regions],
        )
        new.location = cond.location
        block.insert_op_before(new, cond)
        for k, result in zip(outputs, new.results, strict=True):
            cond.results[k].replace_all_uses_with(result)
        new_ops.append(new)
    cond.detach()
    cond.erase()
    return new_ops


def split_conds(block: Block) -> int:
    """Split every top-level cond of ``block``; returns how many conds were split."""
    count = 0
    for op in list(block.ops):
        if isinstance(op, LaxOp) and op.primitive_name == "cond":
            count += len(split_cond(op)) > 1
    return count
