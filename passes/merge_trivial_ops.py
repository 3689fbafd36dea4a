"""``merge-trivial-ops`` (Alpa §4.2): group computationally trivial ops with
the deepest of their operands, so that the ILP sees one node per group.

Depth is the longest path from the function's inputs (arguments and constants
have depth 0; an op is one deeper than its deepest operand), computed in one
breadth-first sweep over the ops in program order. Element-wise ops,
reductions, and the layout ops transpose, broadcast, reshape and squeeze join
the group of their deepest operand's producer (the first such operand on a
tie); every other op starts a group of its own. A trivial op whose operands
are all inputs also starts its own group. A group whose first op yields a
scalar can only be replicated, so a trivial op with a non-scalar result never
joins one (it joins its deepest other operand's group, or starts its own).

Pipeline markers and optimization barriers are the identity: their results
count as their operands (an optimizer's update joins its gradient's group,
not one group of all gradients), and they belong to no group.

The grouping is recorded as the attribute ``sharding.group = N`` on every op of
``@main`` (constants and markers excepted), and ``sharding.num_groups`` on
``@main``. Semantics do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from alpa_ir.autosharding.rules import TRANSPARENT_PRIMITIVES
from alpa_ir.dialects.attrs import GROUP_ATTR
from alpa_ir.dialects.lax import ConstantOp, LaxOp
from alpa_ir.dialects.lax_primitives import OpKind
from alpa_ir.ir.module_utils import main_function

NUM_GROUPS_ATTR = "sharding.num_groups"

MERGEABLE_LAYOUT_OPS = frozenset({"transpose", "broadcast_in_dim", "reshape", "squeeze"})


def is_trivial(op: Operation) -> bool:
    """Whether ``op`` is merged into its deepest operand's group."""
    if not isinstance(op, LaxOp):
        return False
    kind = op.SPEC.kind
    if kind in (OpKind.ELEMENTWISE, OpKind.REDUCTION):
        return True
    return kind is OpKind.LAYOUT and op.SPEC.name in MERGEABLE_LAYOUT_OPS


def compute_groups(function: func.FuncOp) -> dict[Operation, int]:
    """Group id of every op of ``function`` (constants and the return excepted)."""
    depth: dict[SSAValue, int] = {}
    value_group: dict[SSAValue, int] = {}
    scalar_group: dict[int, bool] = {}
    groups: dict[Operation, int] = {}
    next_group = 0
    for op in function.body.block.ops:
        if isinstance(op, ConstantOp):
            depth[op.results[0]] = 0
            continue
        if isinstance(op, func.ReturnOp):
            continue
        if isinstance(op, LaxOp) and op.primitive_name in TRANSPARENT_PRIMITIVES:
            # Markers are the identity: their results are their operands.
            for result, operand in zip(op.results, op.operands, strict=True):
                depth[result] = depth.get(operand, 0)
                if operand in value_group:
                    value_group[result] = value_group[operand]
            continue
        produced = [v for v in op.operands if v in value_group]
        if _rank(op) > 0:
            produced = [v for v in produced if not scalar_group[value_group[v]]]
        op_depth = 1 + max((depth.get(v, 0) for v in op.operands), default=0)
        if is_trivial(op) and produced:
            deepest = max(produced, key=lambda v: depth[v])  # first on ties
            group = value_group[deepest]
        else:
            group = next_group
            next_group += 1
            scalar_group[group] = _rank(op) == 0
        groups[op] = group
        for result in op.results:
            depth[result] = op_depth
            value_group[result] = group
    return groups


def _rank(op: Operation) -> int:
    """Rank of the op's first result (0 for scalars and for ops without results)."""
    if not op.results:
        return 0
    shape = getattr(op.results[0].type, "get_shape", None)
    return len(shape()) if shape is not None else 0


@dataclass(frozen=True)
class MergeTrivialOps(ModulePass):
    """Merge element-wise, layout and reduction ops into their deepest operand's group."""

    name = "merge-trivial-ops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        main = main_function(op)
        groups = compute_groups(main)
        for member, group in groups.items():
            member.attributes[GROUP_ATTR] = IntegerAttr(group, i64)
        main.attributes[NUM_GROUPS_ATTR] = IntegerAttr(len(set(groups.values())), i64)
