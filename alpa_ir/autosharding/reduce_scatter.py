"""The reduce-scatter rewrite (Alpa §4.2, ZeRO), the library of
``reduce-scatter-rewrite``: after auto-sharding, turn the all-reduce of a
gradient into a reduce-scatter wherever that shards the weight update.

For each ``sharding.all_reduce`` (a sum over mesh axes A),
:func:`rewrite_all_reduces` follows its
result through the ops that keep the layout (element-wise ops of the same
shape, transposes, pipeline markers): the optimizer's update of one
parameter. If that update reads optimizer state (a donated argument) and
some dimension d of the gradient is unsplit and divisible by |A|, it rewrites:

- the all-reduce becomes a reduce-scatter over A along d;
- every op of the update runs on its 1/|A| slice; operands from outside the
  update (the parameter, scalars) are sliced locally, which costs nothing;
- optimizer state read only by the update (donated, returned as its new
  value) is kept sharded: an argument and a result of 1/|A| the size;
- values leaving the update elsewhere (the new parameter) are all-gathered
  back to their layout.

Communication volume does not change (all-reduce = reduce-scatter +
all-gather); optimizer memory drops by |A| (ZeRO-2). ``mode=zero3`` also keeps
the parameters sharded: they are returned sharded and all-gathered where the
forward pass reads them, and again where the backward pass reads them.
"""

from __future__ import annotations

import math

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from alpa_ir.autosharding.apply_plan import insert_reshard
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.lax_primitives import OpKind
from alpa_ir.dialects.sharding import (
    SPEC_ATTR,
    STRATEGY_ATTR,
    AllReduceOp,
    ReduceScatterOp,
    ReshardOp,
    ShardingSpec,
    set_result_specs,
    spec_of_value,
)
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.jaxpr_import import ALIASES_ATTR
from alpa_ir.hardware.device_mesh import function_mesh
from alpa_ir.ir.module_utils import main_function

_IDENTITY = ("pipeline_marker", "optimization_barrier")
_SPLIT_KEEPING_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")


def _follow(
    op: Operation,
    k: int,
    spec: ShardingSpec,
    update_shape: tuple[int, ...],
    broadcasts: bool,
) -> dict[int, ShardingSpec] | None:
    """The specs of ``op``'s results when its operand ``k`` has ``spec``, for
    layout-preserving ops; None for any other op. A broadcast is followed only
    up to the size of ``update_shape`` (the gradient's: Adafactor's factored
    moments expanded for the update), never out to activations, and only when
    ``broadcasts`` (ZeRO-3: the factored moments' column reductions then gather
    the squared gradient whole, which ZeRO-2's economy does not take)."""
    if not isinstance(op, LaxOp):
        return None
    name = op.primitive_name
    if name in _IDENTITY:
        return {k: spec}
    if name == "transpose":
        return {0: ShardingSpec(tuple(spec.dims[p] for p in op.param("permutation")))}
    if name == "reshape":
        moved = _unit_reshape(spec, shape_of(op.operands[k].type), shape_of(op.results[0].type))
        return None if moved is None else {0: moved}
    if op.SPEC.kind is OpKind.ELEMENTWISE and all(
        shape_of(r.type) == shape_of(op.operands[k].type) for r in op.results
    ):
        return {r: spec for r in range(len(op.results))}
    if name == "broadcast_in_dim" and broadcasts and k == 0 and not spec.partial:
        # the split dims keep their size: each device broadcasts its slice
        src, dst = shape_of(op.operands[0].type), shape_of(op.results[0].type)
        if math.prod(dst) > math.prod(update_shape):
            return None
        where = op.param("broadcast_dimensions")
        if any(spec.dims[d] and src[d] != dst[where[d]] for d in range(len(src))):
            return None
        dims: list[tuple[int, ...]] = [()] * len(dst)
        for d, at in enumerate(where):
            dims[at] = spec.dims[d]
        return {0: ShardingSpec(tuple(dims))}
    if name in _SPLIT_KEEPING_REDUCTIONS and len(op.operands) == 1 and not spec.partial:
        # a reduction over unsplit dims keeps the split: each device reduces its slice
        axes = set(op.param("axes"))
        if not any(spec.dims[d] for d in axes):
            kept = tuple(dims for d, dims in enumerate(spec.dims) if d not in axes)
            return {0: ShardingSpec(kept)}
    return None


def _required(op: Operation, k: int, result_specs: list[ShardingSpec]) -> ShardingSpec:
    """The spec operand ``k`` of a layout-preserving op needs for these results."""
    operand = op.operands[k]
    rank = len(shape_of(operand.type))
    assert isinstance(op, LaxOp)
    if op.primitive_name in _IDENTITY:
        return result_specs[k]
    if op.primitive_name == "transpose":
        dims: list[tuple[int, ...]] = [()] * rank
        for out_d, in_d in enumerate(op.param("permutation")):
            dims[in_d] = result_specs[0].dims[out_d]
        return ShardingSpec(tuple(dims))
    if op.primitive_name == "reshape":
        back = _unit_reshape(result_specs[0], shape_of(op.results[0].type), shape_of(operand.type))
        return back if back is not None else ShardingSpec.replicated(rank)
    if op.primitive_name == "broadcast_in_dim":
        src, dst = shape_of(operand.type), shape_of(op.results[0].type)
        where = op.param("broadcast_dimensions")
        out = result_specs[0].dims
        return ShardingSpec(
            tuple(out[at] if src[d] == dst[at] else () for d, at in enumerate(where))
        )
    if op.primitive_name in _SPLIT_KEEPING_REDUCTIONS:
        axes = set(op.param("axes"))
        kept = iter(result_specs[0].dims)
        return ShardingSpec(tuple(() if d in axes else next(kept) for d in range(rank)))
    have, out = shape_of(operand.type), shape_of(op.results[0].type)
    if have == out:
        return result_specs[0]
    if len(have) == len(out):  # an operand broadcast along its size-1 dims
        dims = result_specs[0].dims
        return ShardingSpec(tuple(dims[d] if have[d] == out[d] else () for d in range(rank)))
    return ShardingSpec.replicated(rank)


def _unit_reshape(
    spec: ShardingSpec, src: tuple[int, ...], dst: tuple[int, ...]
) -> ShardingSpec | None:
    """The spec after a reshape that only adds or drops size-1 dims (None for
    any other reshape, or when a dropped unit dim was split)."""
    src_dims = [d for d, n in enumerate(src) if n != 1]
    dst_dims = [d for d, n in enumerate(dst) if n != 1]
    if [src[d] for d in src_dims] != [dst[d] for d in dst_dims] or spec.partial:
        return None
    if any(spec.dims[d] for d, n in enumerate(src) if n == 1):
        return None
    dims: list[tuple[int, ...]] = [()] * len(dst)
    for s_dim, d_dim in zip(src_dims, dst_dims, strict=True):
        dims[d_dim] = spec.dims[s_dim]
    return ShardingSpec(tuple(dims))


def _pull_in_feeders(region: list[Operation], new_spec: dict[SSAValue, ShardingSpec]) -> None:
    """Add to the update the layout-preserving ops that only feed it (the decay
    of an optimizer moment, ``b1 * mu``), so that state read only through them
    is sharded too. Their results take the spec their readers in the update need."""
    members = set(region)
    work = list(region)
    while work:
        op = work.pop()
        results = [new_spec.get(r) for r in op.results]
        if any(s is None for s in results):
            continue
        for k, value in enumerate(op.operands):
            producer = value.owner
            if (
                not isinstance(producer, LaxOp)
                or producer in members
                or len(producer.results) != 1
                or value in new_spec
                or not all(u.operation in members for u in value.uses)
            ):
                continue
            want = _required(op, k, results)  # type: ignore[arg-type]
            if not want.used_axes():
                continue
            if producer.primitive_name != "transpose" and not (
                producer.SPEC.kind is OpKind.ELEMENTWISE
                and shape_of(value.type) == shape_of(op.results[0].type)
            ):
                continue
            new_spec[value] = want
            members.add(producer)
            region.append(producer)
            work.append(producer)


def rewrite_all_reduces(module: ModuleOp, mode: str = "zero2") -> None:
    """Rewrite every sum all-reduce of ``module``'s planned ``@main`` that shards a
    weight update (module docstring; ``mode``: ``zero2`` or ``zero3``)."""
    function = main_function(module)
    mesh = function_mesh(module, function)
    if mesh is None:
        raise AlpaError("reduce-scatter-rewrite: @main has no mesh; run auto-sharding first")
    aliases = _aliases(function)
    for ar in [o for o in function.body.block.ops if isinstance(o, AllReduceOp)]:
        if ar.reduction == "sum":
            _rewrite_one(function, ar, mesh.shape, aliases, mode)


def _backward_start(block: Block, position: dict[Operation, int]) -> int:
    """The position of the step's first ``backward`` marker (the end of the
    forward pass); past the last op if there is none."""
    for op in block.ops:
        if (
            isinstance(op, LaxOp)
            and op.primitive_name == "pipeline_marker"
            and op.param("kind") == "backward"
        ):
            return position[op]
    return len(position)


def _aliases(function: func.FuncOp) -> dict[int, int]:
    """Output index -> donated input index."""
    attr = function.attributes.get(ALIASES_ATTR)
    if not isinstance(attr, ArrayAttr):
        return {}
    return {ints_of(p)[0]: ints_of(p)[1] for p in attr.data}  # type: ignore[arg-type]


def _set_arg_spec(function: func.FuncOp, index: int, spec: ShardingSpec) -> None:
    attrs = list(function.arg_attrs.data)  # type: ignore[union-attr]
    attrs[index] = DictionaryAttr({SPEC_ATTR: spec.to_attr()})
    function.arg_attrs = ArrayAttr(attrs)


def _set_res_spec(function: func.FuncOp, index: int, spec: ShardingSpec) -> None:
    attrs = list(function.res_attrs.data)  # type: ignore[union-attr]
    attrs[index] = DictionaryAttr({SPEC_ATTR: spec.to_attr()})
    function.res_attrs = ArrayAttr(attrs)


def _reshards_to(op: Operation, spec: ShardingSpec) -> bool:
    """Whether ``op`` is a reshard to ``spec`` (a value already split so needs none)."""
    return isinstance(op, ReshardOp) and op.dst.spec == spec


def _gathered_back(
    function: func.FuncOp,
    region: set[Operation],
    new_spec: dict[SSAValue, ShardingSpec],
    aliases: dict[int, int],
    sharded_args: dict[int, ShardingSpec],
) -> int:
    """How many values of the update the rewrite would all-gather back for
    readers outside it (sharded state returned as such needs none; a value read
    only by reductions is not counted, as in Alpa, whose partitioner reduces the
    slices: here it is gathered whole, which is why ZeRO-2 does not follow
    broadcasts into Adafactor's factored moments, see :func:`_follow`).

    One is the new parameter of a weight update: its all-gather and the
    reduce-scatter move what the all-reduce moved. More means the all-reduced
    value feeds other computation too (a batch norm's batch mean normalizes the
    activations, its scale gradient the input gradient): each extra gather adds
    its bytes and a latency on the critical path to save a little state, so
    Alpa (``GenerateReduceScatter``: at most one all-gather) and this rewrite
    keep such an all-reduce."""
    ret = function.body.block.last_op
    count = 0
    for value, spec in new_spec.items():
        if spec == spec_of_value(value, function):
            continue
        readers = [
            u.operation
            for u in value.uses
            if u.operation not in region
            and not (u.operation is ret and aliases.get(u.index) in sharded_args)
            and not _reshards_to(u.operation, spec)
        ]
        if readers and not all(
            isinstance(r, LaxOp) and r.SPEC.kind is OpKind.REDUCTION for r in readers
        ):
            count += 1
    return count


def _rewrite_one(
    function: func.FuncOp,
    ar: AllReduceOp,
    mesh_shape: tuple[int, ...],
    aliases: dict[int, int],
    mode: str,
) -> None:
    block: Block = function.body.block
    ret = block.last_op
    assert ret is not None
    axes = ar.mesh_axes
    n = 1
    for a in axes:
        n *= mesh_shape[a]
    old_spec = spec_of_value(ar.output, function)
    shape = shape_of(ar.output.type)
    dim = next((d for d, s in enumerate(shape) if not old_spec.dims[d] and s % n == 0), None)
    if dim is None:
        return
    dims = list(old_spec.dims)
    dims[dim] = tuple(axes)
    new_spec: dict[SSAValue, ShardingSpec] = {ar.output: ShardingSpec(tuple(dims))}

    # The update: ops reachable through layout-preserving ops.
    region: list[Operation] = []
    frontier = [ar.output]
    while frontier:
        value = frontier.pop()
        for use in list(value.uses):
            user = use.operation
            if user in region:
                continue
            follows = _follow(user, use.index, new_spec[value], shape, mode == "zero3")
            if follows is None:
                continue
            region.append(user)
            for r, spec in follows.items():
                new_spec[user.results[r]] = spec
                frontier.append(user.results[r])

    _pull_in_feeders(region, new_spec)

    # Optimizer state: a donated argument read only by the update, whose new
    # value the update returns. (zero3: any donated argument the update returns.)
    region_set = set(region)
    sharded_args: dict[int, ShardingSpec] = {}
    returned = [(u.index, v) for v in new_spec for u in v.uses if u.operation is ret]
    for output, value in returned:
        arg_index = aliases.get(output)
        if arg_index is None:
            continue
        arg = block.args[arg_index]
        only_update = all(u.operation in region_set for u in arg.uses)
        if (only_update or mode == "zero3") and arg.type == value.type:
            sharded_args[arg_index] = new_spec[value]
    if not any(  # worth it only if it shards some optimizer state
        all(u.operation in region_set for u in block.args[i].uses) for i in sharded_args
    ):
        return
    # ZeRO-2 saves optimizer memory only where the communication stays that of
    # the all-reduce; ZeRO-3 is asked to shard the parameters whatever it gathers
    if (
        mode == "zero2"
        and _gathered_back(function, region_set, new_spec, aliases, sharded_args) > 1
    ):
        return

    # Rewrite the all-reduce.
    rs = ReduceScatterOp.create(
        operands=[ar.input],
        result_types=[ar.output.type],
        properties={"axes": ar.axes, "dim": IntegerAttr(dim, i64)},
    )
    set_result_specs(rs, [new_spec[ar.output]])
    Rewriter.insert_op(rs, InsertPoint.before(ar))
    new_spec[rs.results[0]] = new_spec.pop(ar.output)
    ar.output.replace_all_uses_with(rs.results[0])
    Rewriter.erase_op(ar)

    # Sharded arguments: their other readers (zero3: the forward and backward
    # passes) are gathered for, once for the forward pass and once again for the
    # backward pass (ZeRO-3 frees a gathered parameter after the forward pass and
    # gathers it again for the backward pass, as Alpa and DeepSpeed do), each
    # gather placed before the first of its readers.
    position = {o: k for k, o in enumerate(block.ops)}
    backward = _backward_start(block, position)
    for index, spec in sharded_args.items():
        arg = block.args[index]
        before = spec_of_value(arg, function)
        _set_arg_spec(function, index, spec)
        readers = [
            use for use in arg.uses if use.operation not in region_set and use.operation is not ret
        ]
        passes = (
            [u for u in readers if position[u.operation] < backward],
            [u for u in readers if position[u.operation] > backward],
        )
        for group in passes:
            if group:
                first = min(group, key=lambda use: position[use.operation]).operation
                gathered = insert_reshard(arg, spec, before, first)
                for use in group:
                    use.operation.operands[use.index] = gathered

    # The update runs on slices (in block order; the gathers above are not in it).
    for op in sorted(region, key=position.__getitem__):
        old = [spec_of_value(r, function) for r in op.results]
        results = [new_spec.get(r, o) for r, o in zip(op.results, old, strict=True)]
        for k, v in enumerate(op.operands):
            want = _required(op, k, results)
            have = new_spec.get(v) or spec_of_value(v, function)
            if have != want:
                op.operands[k] = insert_reshard(v, have, want, op)
        set_result_specs(op, results)
        op.attributes[STRATEGY_ATTR] = StringAttr(f"{mode}-update")
        # Values leaving the update get their old layout back.
        for r, before, after in zip(op.results, old, results, strict=True):
            if before == after:
                continue
            for use in list(r.uses):
                user = use.operation
                if user in region_set:
                    continue
                if user is ret and aliases.get(use.index) in sharded_args:
                    _set_res_spec(function, use.index, after)
                    continue
                if _reshards_to(user, after):
                    # the plan already split it this way: nothing to move
                    user.results[0].replace_all_uses_with(r)
                    Rewriter.erase_op(user)
                    continue
                user.operands[use.index] = insert_reshard(r, after, before, user)


__all__ = ["rewrite_all_reduces"]
