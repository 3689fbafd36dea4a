"""Micro-batches draw the one-device random numbers.

A step traced at the micro-batch shape draws its dropout masks per
micro-batch as ``random_bits(key, (b, ...))``: every micro-batch would draw
the same rows, where one device draws ``(B, ...)`` for the whole batch. This
rewrite gives ``@main`` one more batch argument, the row numbers of the batch
(``micro_batch_rows``, ``int32[B]``, which the executables pass as
``arange(B)``), and replaces each such draw by ``random_bits_rows`` of the
micro-batch's rows of the whole draw, starting at its first row number. The
micro-batch machinery (gradient accumulation in one program, the pipeline's
per-micro-batch inputs) hands every micro-batch its slice of the row numbers,
so every plan draws exactly the one-device mask.

A draw is rewritten when its leading dimension is the micro-batch size and
its bits meet the batch row for row: an op that reads them (or values
computed from them that keep that leading dimension) also reads a value
computed from the batch with the same leading dimension, and keeps it. Only threefry keys (``fry``) and draws of up to 32 bits
(JAX's partitionable counting); other draws keep drawing per micro-batch.
The same holds for ``random_split(key, (b, ...))``, one key per example
(``jax.random.split(key, batch_size)`` for a vmapped model): it becomes
``random_split_rows``.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, TensorType, i32, i64
from xdsl.ir import Operation, SSAValue

from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.key_type import KeyType
from alpa_ir.dialects.lax import PRIMITIVE_OPS, LaxOp
from alpa_ir.dialects.lax_attrs import ints_attr
from alpa_ir.dialects.types import shape_of

ROWS_NAME = "micro_batch_rows"
_ROWS = {"random_bits": "random_bits_rows", "random_split": "random_split_rows"}
"""Each draw whose leading dimension is the batch, and its by-rows form."""


def _draws(function: func.FuncOp, batch_args: list[int], rows: int) -> list[LaxOp]:
    """The ``random_bits`` ops of ``@main`` to rewrite (see the module doc)."""
    block = function.body.block
    batch_dep: set[SSAValue] = {block.args[k] for k in batch_args}
    for op in block.ops:
        if any(v in batch_dep for v in op.operands):
            batch_dep.update(op.results)
    draws = []
    for op in block.ops:
        if not (isinstance(op, LaxOp) and op.primitive_name in _ROWS):
            continue
        key_type = op.operands[0].type
        if not (
            isinstance(key_type, TensorType)
            and isinstance(key_type.element_type, KeyType)
            and key_type.element_type.tag == "fry"
            and not shape_of(key_type)
            and (op.primitive_name == "random_split" or op.param("bit_width") <= 32)
        ):
            continue
        shape = shape_of(op.results[0].type)
        if not shape or shape[0] != rows:
            continue
        if _meets_batch(op.results[0], batch_dep, rows):
            draws.append(op)
    return draws


def _meets_batch(value: SSAValue, batch_dep: set[SSAValue], rows: int) -> bool:
    """Whether ``value`` (or a value computed from it alone, row for row) is
    read, row for row, by an op that also reads a batch-dependent value.

    Row for row: only values whose leading dimension is still ``rows`` are
    followed. A key split in two (``jax.random.split(key)`` with 2-row
    micro-batches) whose halves are sliced out is not a per-example draw
    although its leading dimension equals the micro-batch's.
    """
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        for use in v.uses:
            user = use.operation
            kept = [r for r in user.results if _leading(r) == rows]
            if not kept:
                continue
            if any(o in batch_dep and _leading(o) == rows for o in user.operands if o is not v):
                return True
            stack.extend(kept)
    return False


def _leading(value: SSAValue) -> int | None:
    """The leading dimension of ``value`` (None for a scalar or non-tensor)."""
    shape = shape_of(value.type) if isinstance(value.type, TensorType) else ()
    return shape[0] if shape else None


def draw_micro_batch_rows(function: func.FuncOp, num_micro_batches: int) -> bool:
    """Rewrite ``@main``'s per-micro-batch draws (see the module doc); returns
    whether a ``micro_batch_rows`` argument was added."""
    from xdsl.dialects.builtin import DenseArrayBase

    attr = function.attributes.get(BATCH_ATTR)
    batch_args = [int(x) for x in attr.get_values()] if isinstance(attr, DenseArrayBase) else []
    block = function.body.block
    sizes = {shape_of(block.args[k].type)[0] for k in batch_args if shape_of(block.args[k].type)}
    if num_micro_batches <= 1 or len(sizes) != 1:
        return False
    rows = sizes.pop()
    draws = _draws(function, batch_args, rows)
    if not draws:
        return False
    arg = block.insert_arg(TensorType(i32, [rows]), len(block.args))
    arg.name_hint = ROWS_NAME
    for op in draws:
        start = _first_row(arg, op)  # next to the draw: it goes where the draw goes
        shape = shape_of(op.results[0].type)
        properties = {
            "shape": ints_attr(shape),
            "global_shape": ints_attr((rows * num_micro_batches, *shape[1:])),
        }
        if op.primitive_name == "random_bits":
            properties["bit_width"] = IntegerAttr(op.param("bit_width"), i64)
        new = PRIMITIVE_OPS[_ROWS[op.primitive_name]].create(
            operands=[op.operands[0], start],
            result_types=[op.results[0].type],
            properties=properties,
        )
        new.location = op.location
        block.insert_op_before(new, op)
        op.results[0].replace_all_uses_with(new.results[0])
        op.detach()
        op.erase()
    inputs = [*function.function_type.inputs.data, arg.type]
    function.function_type = func.FunctionType.from_lists(
        inputs, list(function.function_type.outputs.data)
    )
    if function.arg_attrs is not None:
        from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr

        function.arg_attrs = ArrayAttr([*function.arg_attrs.data, DictionaryAttr({})])
    function.attributes[BATCH_ATTR] = ints_attr([*batch_args, len(block.args) - 1])
    return True


def _first_row(rows: SSAValue, before: Operation) -> SSAValue:
    """The micro-batch's first row number (the least of ``rows``) as an int32
    scalar, computed before ``before``. A reduction, not a slice of
    ``rows[0]``: under data parallelism ``rows`` is split like the batch, and
    the least row is an all-reduce where the first one would need an
    all-gather (which data-parallel plans do not allow)."""
    block = before.parent_block()
    assert block is not None
    least = PRIMITIVE_OPS["reduce_min"].create(
        operands=[rows],
        result_types=[TensorType(i32, [])],
        properties={"axes": ints_attr([0])},
    )
    block.insert_op_before(least, before)
    return least.results[0]
