"""Split a stage's backward into B and W (zero-bubble pipelines, Qi et al. ICLR'24).

A stage's backward function computes two kinds of results: the gradients an
earlier stage needs for its own backward (and anything else read per
micro-batch), and the gradients of this stage's weights, which only the
apply-grad functions read. :func:`split_backward` moves the ops that only the
second kind needs into a new function, ``stageK_backward_weight`` (W), and
leaves the rest in the backward function (B):

- B's ops: every op the B results need (its backward slice). W's ops: the ops
  the W results need that B does not have. No op is computed twice.
- W's arguments: the backward's arguments its ops read, then the values of
  B's ops it reads, which B returns after its own results.
- ``@main`` calls B, then W; the stage's ``backward_weight`` names W. A
  stage without a backward function (a forward that holds its backward too)
  is split the same way (its W holds the weight gradients of the fused
  function).

Sharding specs follow the values: B and W keep the specs of the original
arguments and results, and a value passed from B to W carries the spec of
the op that produces it. Runs on the outlined module before
``cross-mesh-resharding`` (transfers name results by index). A stage whose
weight gradients need no op of their own is left as it is. Returns, per
stage, the name of its W function or None.
"""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FlatSymbolRefAttr,
    ModuleOp,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from alpa_ir.dialects.attrs import BATCH_ATTR, PER_MICRO_BATCH_ATTR
from alpa_ir.dialects.pipeline import StageOp, TransferOp, plan_stages
from alpa_ir.dialects.sharding import SPEC_ATTR, result_specs, spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, symbol_op, top_level_ops


def _used_values(op: Operation) -> Iterable[SSAValue]:
    """The values ``op`` reads, also from inside its regions, defined outside it."""
    yield from op.operands
    for region in op.regions:
        for inner in region.walk():
            for v in inner.operands:
                owner = v.owner
                parent = owner.parent_op() if isinstance(owner, Block) else owner
                while parent is not None and parent is not op:
                    parent = parent.parent_op()
                if parent is None:
                    yield v


def _slice(outputs: Iterable[SSAValue], block: Block) -> set[Operation]:
    """The ops of ``block`` that ``outputs`` need."""
    needed: set[Operation] = set()
    stack = [v.owner for v in outputs if isinstance(v.owner, Operation)]
    while stack:
        op = stack.pop()
        if op in needed or op.parent_block() is not block:
            continue
        needed.add(op)
        stack += [v.owner for v in _used_values(op) if isinstance(v.owner, Operation)]
    return needed


def _ints(function: func.FuncOp, name: str) -> set[int]:
    attr = function.attributes.get(name)
    return {int(x) for x in attr.get_values()} if isinstance(attr, DenseArrayBase) else set()


def _spec_dict(function: func.FuncOp, value: SSAValue) -> DictionaryAttr:
    """The spec of a value B passes to W: its producer's, if annotated."""
    owner = value.owner
    if isinstance(owner, Operation) and result_specs(owner) is not None:
        return DictionaryAttr({SPEC_ATTR: spec_of_value(value, function).to_attr()})
    return DictionaryAttr({})


def _attrs(entries: list[Attribute]) -> ArrayAttr[DictionaryAttr]:
    return ArrayAttr(entries)  # type: ignore[arg-type]


def _copy_function_attrs(source: func.FuncOp, target: func.FuncOp) -> None:
    for name, attr in source.attributes.items():
        if name not in target.attributes and name not in (BATCH_ATTR, PER_MICRO_BATCH_ATTR):
            target.attributes[name] = attr


def _weight_results(call: func.CallOp, apply_calls: set[str], returned: set[SSAValue]) -> list[int]:
    """Results of ``call`` that only apply-grad functions read."""
    out = []
    for k, result in enumerate(call.results):
        users = [u.operation for u in result.uses]
        if (
            users
            and result not in returned
            and all(
                isinstance(u, func.CallOp) and u.callee.root_reference.data in apply_calls
                for u in users
            )
        ):
            out.append(k)
    return out


def _split_one(
    module: ModuleOp, stage: StageOp, name: str, call: func.CallOp, weight: list[int]
) -> str | None:
    function = symbol_op(module, name, func.FuncOp)
    assert isinstance(function, func.FuncOp)
    block = function.body.block
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    kept = [k for k in range(len(ret.operands)) if k not in weight]
    b_ops = _slice((ret.operands[k] for k in kept), block)
    w_ops = _slice((ret.operands[k] for k in weight), block) - b_ops
    if not w_ops:
        return None
    w_order = [op for op in block.ops if op in w_ops]
    # what W reads: arguments of the function, then values B computes
    w_args: list[SSAValue] = []
    crossing: list[SSAValue] = []
    for op in w_order:
        for v in _used_values(op):
            owner = v.owner
            if isinstance(owner, Block) and owner is block and v not in w_args:
                w_args.append(v)
            elif isinstance(owner, Operation) and owner in b_ops and v not in crossing:
                crossing.append(v)
    for k in weight:  # a W result B computes (or an argument) passes through
        v = ret.operands[k]
        if isinstance(v.owner, Block) and v not in w_args:
            w_args.append(v)
        elif isinstance(v.owner, Operation) and v.owner in b_ops and v not in crossing:
            crossing.append(v)

    # W: a new function of the moved ops
    w_block = Block(arg_types=[v.type for v in (*w_args, *crossing)])
    mapping: dict[SSAValue, SSAValue] = dict(zip((*w_args, *crossing), w_block.args, strict=True))
    for op in w_order:
        op.detach()
        w_block.add_op(op)
    for op in w_order:
        for inner in (op, *(o for r in op.regions for o in r.walk())):
            if any(v in mapping for v in inner.operands):
                inner.operands = [mapping.get(v, v) for v in inner.operands]
    w_results = [mapping.get(ret.operands[k], ret.operands[k]) for k in weight]
    w_block.add_op(func.ReturnOp(*w_results))
    w_name = f"{name.removesuffix('_forward').removesuffix('_backward')}_backward_weight"
    for new, old in zip(w_block.args, (*w_args, *crossing), strict=True):
        new.name_hint = old.name_hint
    arg_specs = [
        function.arg_attrs.data[v.index] if function.arg_attrs is not None else DictionaryAttr({})  # type: ignore[attr-defined]
        for v in w_args
    ] + [_spec_dict(function, v) for v in crossing]
    res_specs = [
        function.res_attrs.data[k] if function.res_attrs is not None else DictionaryAttr({})
        for k in weight
    ]
    w_fn = func.FuncOp(
        w_name,
        ([v.type for v in w_block.args], [v.type for v in w_results]),
        Region(w_block),
        arg_attrs=_attrs(arg_specs),  # type: ignore[arg-type]
        res_attrs=_attrs(res_specs),  # type: ignore[arg-type]
    )
    _copy_function_attrs(function, w_fn)
    batch = [i for i, v in enumerate(w_args) if v.index in _ints(function, BATCH_ATTR)]  # type: ignore[attr-defined]
    if batch:
        w_fn.attributes[BATCH_ATTR] = DenseArrayBase.from_list(i64, batch)
    varying = _ints(function, PER_MICRO_BATCH_ATTR)
    w_fn.attributes[PER_MICRO_BATCH_ATTR] = DenseArrayBase.from_list(
        i64, [i for i, k in enumerate(weight) if k in varying]
    )

    # B: the function keeps its ops and returns its own results, then the crossing values
    b_results = [ret.operands[k] for k in kept] + crossing
    new_ret = func.ReturnOp(*b_results)
    block.insert_op_before(new_ret, ret)
    block.erase_op(ret)
    old_res = function.res_attrs.data if function.res_attrs is not None else None
    function.function_type = func.FunctionType.from_lists(
        [a.type for a in block.args], [v.type for v in b_results]
    )
    function.res_attrs = _attrs(
        [old_res[k] if old_res is not None else DictionaryAttr({}) for k in kept]
        + [_spec_dict(function, v) for v in crossing]
    )
    function.attributes[PER_MICRO_BATCH_ATTR] = DenseArrayBase.from_list(
        i64,
        [i for i, k in enumerate(kept) if k in varying]
        + list(range(len(kept), len(kept) + len(crossing))),
    )
    module.body.block.insert_op_after(w_fn, function)

    # @main: call B, then W
    b_call = func.CallOp(name, list(call.operands), [v.type for v in b_results])
    w_operands = (
        [call.operands[v.index] for v in w_args]
        + list(  # type: ignore[attr-defined]
            b_call.results[len(kept) :]
        )
    )
    w_call = func.CallOp(w_name, w_operands, [v.type for v in w_results])
    main_block = call.parent_block()
    assert main_block is not None
    main_block.insert_ops_before([b_call, w_call], call)
    for i, k in enumerate(kept):
        call.results[k].replace_all_uses_with(b_call.results[i])
    for i, k in enumerate(weight):
        call.results[k].replace_all_uses_with(w_call.results[i])
    main_block.erase_op(call)
    stage.properties["backward_weight"] = FlatSymbolRefAttr(w_name)
    return w_name


def split_backward(module: ModuleOp) -> list[str | None]:
    """Split every stage's backward into B and W (module docstring)."""
    if any(True for _ in top_level_ops(module, TransferOp)):
        raise AlpaError(
            "split-backward: the module already has pipeline.transfer ops; run it before "
            "cross-mesh-resharding"
        )
    main = main_function(module)
    calls = {
        op.callee.root_reference.data: op
        for op in main.body.block.ops
        if isinstance(op, func.CallOp)
    }
    ret = main.body.block.last_op
    returned = set(ret.operands) if ret is not None else set()
    stages = plan_stages(module)
    apply_calls = {
        name for stage in stages for phase, name in stage.phase_functions() if phase == "apply_grad"
    }
    out: list[str | None] = []
    for stage in stages:
        if stage.backward_weight is not None:
            out.append(stage.backward_weight.root_reference.data)
            continue
        ref = stage.backward if stage.backward is not None else stage.forward
        if ref is None or ref.root_reference.data not in calls:
            out.append(None)
            continue
        name = ref.root_reference.data
        call = calls[name]
        weight = _weight_results(call, apply_calls, returned)
        out.append(_split_one(module, stage, name, call, weight) if weight else None)
    return out


__all__ = ["split_backward"]
