"""Which dimension of every value is the batch dimension.

``force-batch-dim-to-mesh-dim`` (Alpa's ``force_batch_dim_to_mesh_dim``)
constrains every op, not only the inputs: each op must split its batch
dimension over the given mesh axis. The batch dimension of each value is
found by propagation from the batch arguments' leading dimension through the
ops' factor rules: the factor an operand's batch dimension belongs to is the
op's batch factor, and every result dimension made of it is a batch
dimension. Identity ops (markers) pass it through; ops without a rule, and
ops whose batch factor is only in an operand (a weight gradient contracting
the batch), end the propagation for their results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from xdsl.dialects import func
from xdsl.ir import SSAValue

from alpa_ir.autosharding.factors import FactorRule
from alpa_ir.autosharding.rules import RULES, TRANSPARENT_PRIMITIVES
from alpa_ir.dialects.lax import LaxOp

RuleLookup = Callable[[str], Any]


def batch_dims(
    function: func.FuncOp, batch_args: Iterable[int], rule_lookup: RuleLookup | None = None
) -> dict[SSAValue, int]:
    """Value -> its batch dimension, for the values of ``@main``'s top-level block."""
    lookup = rule_lookup or RULES.get
    block = function.body.block
    out: dict[SSAValue, int] = {}
    for k in batch_args:
        arg = block.args[k]
        if getattr(arg.type, "get_shape", lambda: ())():
            out[arg] = 0
    for op in block.ops:
        if not isinstance(op, LaxOp):
            continue
        if op.primitive_name in TRANSPARENT_PRIMITIVES:
            for operand, result in zip(op.operands, op.results, strict=True):
                if operand in out:
                    out[result] = out[operand]
            continue
        marked = [(k, out[v]) for k, v in enumerate(op.operands) if v in out]
        if not marked:
            continue
        rule_fn = lookup(op.primitive_name)
        if rule_fn is None:
            continue
        try:
            rule: FactorRule = rule_fn(op)
        except Exception:  # a rule that cannot describe this op: stop here
            continue
        factor = _batch_factor(rule, marked)
        if factor is None:
            continue
        for result, dims in zip(op.results, rule.results, strict=True):
            for d, factors in enumerate(dims):
                if factors and factors[0] == factor:
                    out[result] = d
                    break
    return out


def _batch_factor(rule: FactorRule, marked: list[tuple[int, int]]) -> int | None:
    for operand, dim in marked:
        dims = rule.operands[operand]
        if dim < len(dims) and dims[dim]:
            return dims[dim][0]
    return None
