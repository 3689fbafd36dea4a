"""Write a chosen plan into the IR: a spec on every value, the strategy of
every op, and explicit collectives for every partial result and reshard.

After this, ``@main`` is an explicit SPMD program: each op's operands arrive
in the specs its strategy needs, so a device can run each op on its local
blocks, and all communication is visible as ``sharding`` ops.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import Rewriter

from alpa_ir.autosharding.graph import StrategyGraph
from alpa_ir.autosharding.resharding import ReshardStep, reshard_steps
from alpa_ir.dialects.lax import ConstantOp, LaxOp
from alpa_ir.dialects.lax_attrs import ints_attr
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    STRATEGY_ATTR,
    AllGatherOp,
    AllReduceOp,
    AllToAllOp,
    ReduceScatterOp,
    ReshardOp,
    ShardingSpec,
    set_result_specs,
    spec_of_value,
)
from alpa_ir.dialects.types import shape_of


def step_op(step: ReshardStep, value: SSAValue, before: ShardingSpec) -> Operation:
    """The explicit op of one reshard step."""
    common = {"operands": [value], "result_types": [value.type]}
    if step.kind == "all_reduce":
        props = {"axes": ints_attr(step.axes)}
        if step.reduce != "sum":
            props["reduce"] = StringAttr(step.reduce)
        op: Operation = AllReduceOp.create(properties=props, **common)
    elif step.kind == "reduce_scatter":
        op = ReduceScatterOp.create(
            properties={"axes": ints_attr(step.axes), "dim": IntegerAttr(step.dim, i64)}, **common
        )
    elif step.kind == "all_gather":
        op = AllGatherOp.create(
            properties={"axes": ints_attr(step.axes), "dim": IntegerAttr(step.dim, i64)}, **common
        )
    elif step.kind == "all_to_all":
        op = AllToAllOp.create(
            properties={
                "axes": ints_attr(step.axes),
                "src_dim": IntegerAttr(step.src_dim, i64),
                "dst_dim": IntegerAttr(step.dst_dim, i64),
            },
            **common,
        )
    else:
        op = ReshardOp.create(
            properties={"src": before.to_attr(), "dst": step.after.to_attr()}, **common
        )
    set_result_specs(op, [step.after])
    return op


def insert_reshard(
    value: SSAValue, src: ShardingSpec, dst: ShardingSpec, before_op: Operation, reduce: str = "sum"
) -> SSAValue:
    """Insert the ops that reshard ``value`` before ``before_op``; return the new value."""
    current, spec = value, src
    for step in reshard_steps(src, dst, reduce):
        op = step_op(step, current, spec)
        Rewriter.insert_op(op, _before(before_op))
        current, spec = op.results[0], step.after
    return current


def _before(op: Operation):
    from xdsl.rewriter import InsertPoint

    return InsertPoint.before(op)


def _after(op: Operation):
    from xdsl.rewriter import InsertPoint

    return InsertPoint.after(op)


def apply_plan(
    function: func.FuncOp,
    graph: StrategyGraph,
    choice: Sequence[int],
    aliases: Sequence[object] = (),
) -> None:
    """Annotate ``function`` with the strategies ``choice`` picks for ``graph``'s
    nodes. ``aliases`` (output, input) pairs: the output is returned in the
    input's spec."""
    block: Block = function.body.block
    spec_of: dict[SSAValue, ShardingSpec] = {}
    chosen = [node.strategies[c] for node, c in zip(graph.nodes, choice, strict=True)]
    for strategy in chosen:
        spec_of.update(strategy.value_specs)

    def final_spec(value: SSAValue) -> ShardingSpec:
        value = graph.alias.get(value, value)
        return spec_of.get(value) or ShardingSpec.replicated(len(shape_of(value.type)))

    # Function arguments.
    function.arg_attrs = ArrayAttr(
        [DictionaryAttr({SPEC_ATTR: final_spec(a).to_attr()}) for a in block.args]
    )
    required: dict[tuple[Operation, int], ShardingSpec] = {}
    for strategy in chosen:
        required.update(strategy.operand_specs)
    for node, strategy in zip(graph.nodes, chosen, strict=True):
        for op in node.ops:
            op_strategy = strategy.op_strategies[op]
            op.attributes[STRATEGY_ATTR] = StringAttr(op_strategy.name)
            set_result_specs(op, op_strategy.result_specs)
            if op_strategy.partial_axes:
                _complete_partials(
                    op, op_strategy.result_specs, op_strategy.final_result_specs, op_strategy.reduce
                )
    # Constants and transparent ops.
    for op in list(block.ops):
        if isinstance(op, ConstantOp):
            set_result_specs(op, [ShardingSpec.replicated(len(shape_of(op.result.type)))])
        elif isinstance(op, LaxOp) and op.results and op.results[0] in graph.alias:
            set_result_specs(op, [final_spec(r) for r in op.results])
    # Reshards in front of every operand that arrives in the wrong spec; uses in
    # block order, so that a reshard shared by several uses precedes all of them.
    position = {op: i for i, op in enumerate(block.ops)}
    cache: dict[tuple[SSAValue, ShardingSpec], SSAValue] = {}
    for op, k, _value in sorted(graph.uses, key=lambda use: (position[use[0]], use[1])):
        want = required.get((op, k))
        operand = op.operands[k]
        have = spec_of_value(operand, function)
        if want is None or want == have:
            continue
        key = (operand, want)
        if key not in cache:
            cache[key] = insert_reshard(operand, have, want, op)
        op.operands[k] = cache[key]
    # Results of the function: the new value of a donated input in its spec.
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    for alias in aliases:
        out, inp = alias.output, alias.input  # type: ignore[attr-defined]
        want = spec_of_value(block.args[inp], function)
        value = ret.operands[out]
        have = spec_of_value(value, function)
        if have != want:
            ret.operands[out] = insert_reshard(value, have, want, ret)
    function.res_attrs = ArrayAttr(
        [DictionaryAttr({SPEC_ATTR: spec_of_value(v, function).to_attr()}) for v in ret.operands]
    )


def _complete_partials(
    op: Operation, partial: Sequence[ShardingSpec], final: Sequence[ShardingSpec], reduce: str
) -> None:
    """Insert the all-reduce after ``op`` that completes each partial result."""
    anchor = op
    for result, have, want in zip(op.results, partial, final, strict=True):
        if not have.partial:
            continue
        uses = list(result.uses)
        current, spec = result, have
        for step in reshard_steps(have, want, reduce):
            new = step_op(step, current, spec)
            Rewriter.insert_op(new, _after(anchor))
            anchor, current, spec = new, new.results[0], step.after
        for use in uses:
            use.operation.operands[use.index] = current
