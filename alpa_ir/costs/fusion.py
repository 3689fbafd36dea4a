"""A model of XLA's operator fusion for the cost model's memory estimates.

XLA does not write every intermediate of a step to device memory: chains of
elementwise and layout ops (converts, broadcasts, adds, ``exp``, ...) fuse into
one kernel with their consumer, and a reduction reads its fused elementwise
inputs directly (XLA's loop and input fusion). Only fusion outputs are
materialized. This module decides, for the top-level ops of a block:

* which results are **materialized**: a result of an op that is not fusible
  (a contraction, an indexing op, a collective, a control op, ...), a value
  the block returns, a value some user cannot fuse (a ``dot_general``
  reads its operands from memory), or a value several kernels read whose op
  streams more than one array (duplicating it into each of them would read
  all its inputs once per kernel: a residual stream's ``add``, read by the
  next layer norm and the next residual ``add``, would otherwise be recomputed
  by every later kernel of the network; XLA duplicates only cheap producers);
  a fusible op nobody reads is dead (XLA removes it); everything else lives
  only inside a fused kernel;
* when each op's computation really **runs**: a fused op runs inside each of
  its consumers, so the inputs it reads stay live until the last of them.

With ``tiled_attention`` (FlashAttention, as Llama 3 and Megatron-LM run
their attention) the attention is one tiled kernel whose ``[.., S, S]``
values stay in on-chip memory: a result with at least three dimensions, the
last two equal, made by a batched ``dot_general`` (the scores ``Q·Kᵀ``, or
the probabilities' gradient ``dO·Vᵀ``) or by fusible ops from such values
(the mask, softmax and their gradients) is never materialized; the
kernel's inputs stay live until the kernel that reads the tiled values ends
(the ``P·V`` or ``dS·K`` contraction). The recomputation of the scores in
FlashAttention's backward is not priced.

From these, :func:`fused_live_ranges` gives the live ranges the stage cost
model's peak-memory estimate uses, and :func:`fused_traffic_bytes` the bytes
moved to and from device memory (each materialized value written once and read
once per kernel that reads it). The model is coarse on purpose: XLA also
fuses some producers into contractions' epilogues, which is not modelled, so
the estimate errs towards materializing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.dialects.lax import ConstantOp, LaxOp
from alpa_ir.dialects.lax_primitives import OpKind
from alpa_ir.dialects.sharding import ReshardOp
from alpa_ir.dialects.types import dtype_of, shape_of

_FUSIBLE = (OpKind.ELEMENTWISE, OpKind.LAYOUT, OpKind.MARKER)
IDENTITY_PRIMITIVES = frozenset({"pipeline_marker", "optimization_barrier"})


def is_identity(op: Operation) -> bool:
    """An op whose results are its operands (pipeline markers, optimization barriers)."""
    return isinstance(op, LaxOp) and op.primitive_name in IDENTITY_PRIMITIVES


def is_fusible(op: Operation) -> bool:
    """Can ``op`` fuse into its consumers (elementwise, layout, identity markers,
    ops without operands such as constants and iotas, and a plan's
    ``sharding.reshard``, which after auto-sharding is a local slice: the plan's
    communication is in separate collective ops)?"""
    if isinstance(op, ReshardOp | ConstantOp):
        return True
    return isinstance(op, LaxOp) and (op.kind in _FUSIBLE or not op.operands)


def fuses_inputs(op: Operation) -> bool:
    """Can ``op`` read fused producers directly (a fusible op or a reduction)?"""
    return is_fusible(op) or (isinstance(op, LaxOp) and op.kind is OpKind.REDUCTION)


CHEAP_PRODUCERS = frozenset({"broadcast_in_dim", "constant", "iota"})
"""Ops whose result costs no read of an array its size (a broadcast of a
smaller array, a constant, an index)."""


def is_cheap(value: SSAValue, depth: int = 8) -> bool:
    """Is ``value`` made without reading an array its size: by a
    :data:`CHEAP_PRODUCERS` op, or by fusible ops over cheap values only (a
    causal mask compared from iotas, a broadcast sliced by a plan's reshard),
    looked up to ``depth`` producers back?"""
    owner = value.owner
    if isinstance(owner, ConstantOp):
        return True
    if not isinstance(owner, Operation) or not is_fusible(owner):
        return False
    if isinstance(owner, LaxOp) and owner.primitive_name in CHEAP_PRODUCERS:
        return True
    if depth <= 0 or not owner.operands:
        return not owner.operands
    return all(is_cheap(v, depth - 1) for v in owner.operands)


def streamed_inputs(op: Operation) -> int:
    """How many arrays as large as its result ``op`` reads (operands of the
    result's element count that are not :func:`is_cheap`)."""
    try:
        size = math.prod(shape_of(op.results[0].type))
    except Exception:  # no tensor result
        return 0
    count = 0
    for operand in op.operands:
        try:
            same = math.prod(shape_of(operand.type)) == size
        except Exception:  # a token
            continue
        if same and not is_cheap(operand):
            count += 1
    return count


class BlockFusion:
    """The fusion decisions for one block's top-level ops (module docstring)."""

    def __init__(self, block: Block, tiled_attention: bool = False) -> None:
        self.block = block
        self.ops = list(block.ops)
        self.position = {op: i for i, op in enumerate(self.ops)}
        self.end = len(self.ops)
        self.materialized: set[SSAValue] = set()
        self.runs_until: dict[Operation, int] = {}
        self._users: dict[SSAValue, list[Operation]] = {}
        self.tiled: set[SSAValue] = tiled_attention_values(self.ops) if tiled_attention else set()
        """The tiled attention's values (module docstring): never materialized."""
        for op in reversed(self.ops):
            self._decide(op)

    def top(self, op: Operation) -> Operation:
        """The top-level op of the block that contains ``op`` (a use in a region)."""
        while op.parent_block() is not self.block and op.parent_op() is not None:
            op = op.parent_op()  # type: ignore[assignment]
        return op

    def users(self, value: SSAValue) -> list[Operation]:
        """The top-level ops that read ``value``, seeing through identity ops
        (a marker's result is its operand's buffer). Kept per value: the
        block is not changed while its decisions are read, and the decisions
        and the kernels reading a value ask for the same users many times
        (a list the callers only read)."""
        found = self._users.get(value)
        if found is not None:
            return found
        out: list[Operation] = []
        for use in value.uses:
            user = self.top(use.operation)
            if is_identity(user) and user.parent_block() is self.block:
                out += self.users(user.results[use.index])
            else:
                out.append(user)
        self._users[value] = out
        return out

    def _decide(self, op: Operation) -> None:
        """Called in reverse program order: every user's decision is made."""
        here = self.position[op]
        if is_identity(op):
            self.runs_until[op] = here
            return
        fusible = is_fusible(op)
        fused_until = here
        for result in op.results:
            users = self.users(result)
            if fusible and not users:  # dead: XLA removes it
                continue
            if result in self.tiled and users and self.block.last_op not in users:
                for user in users:  # inside the attention kernel, up to its end
                    fused_until = max(fused_until, self.runs_until.get(user, self.end))
                continue
            if (
                not fusible
                or not users
                or any(u is self.block.last_op or not fuses_inputs(u) for u in users)
                # (both pure: the cheap test first, the walk of the readers only if needed)
                or (streamed_inputs(op) > 1 and self.kernels_reading(result) > 1)
            ):
                self.materialized.add(result)
                continue
            for user in users:
                fused_until = max(fused_until, self.runs_until.get(user, self.end))
        self.runs_until[op] = (
            here if any(r in self.materialized for r in op.results) else fused_until
        )

    def last_read(self, value: SSAValue, born: int) -> int:
        """The position after which nothing reads ``value`` any more."""
        last = born
        for user in self.users(value):
            if user is self.block.last_op:
                return self.end
            last = max(last, self.runs_until.get(user, self.end))
        return last

    def kernels_reading(self, value: SSAValue) -> int:
        """How many materializing kernels read ``value`` (through fused chains)."""
        return len(self.kernel_ops_reading(value))

    def kernel_ops_reading(self, value: SSAValue) -> list[Operation]:
        """The materializing kernels (their last op) that read ``value``
        (through fused chains)."""
        seen: set[Operation] = set()
        stack = [u for u in self.users(value) if u is not self.block.last_op]
        kernels: list[Operation] = []
        while stack:
            user = stack.pop()
            if user in seen:
                continue
            seen.add(user)
            if any(r in self.materialized for r in user.results) or not user.results:
                kernels.append(user)
            for result in user.results:
                if result not in self.materialized:
                    stack.extend(u for u in self.users(result) if u is not self.block.last_op)
        return kernels


def _square_tail(value: SSAValue) -> bool:
    try:
        shape = shape_of(value.type)
    except Exception:  # no tensor
        return False
    return len(shape) >= 3 and shape[-1] == shape[-2] > 1


def _batched_dot(op: Operation) -> bool:
    if not (isinstance(op, LaxOp) and op.primitive_name == "dot_general"):
        return False
    (_, (lhs_batch, _)) = op.param("dimension_numbers")
    return bool(lhs_batch)


def tiled_attention_values(ops: list[Operation]) -> set[SSAValue]:
    """The values a tiled attention kernel keeps on chip (module docstring),
    of the top-level ``ops`` in program order."""
    tiled: set[SSAValue] = set()
    for op in ops:
        if not (_batched_dot(op) or (is_fusible(op) and any(v in tiled for v in op.operands))):
            continue
        tiled.update(r for r in op.results if _square_tail(r))
    return tiled


def merge_identity_ranges(
    block: Block, ranges: list[tuple[SSAValue, int, int]]
) -> list[tuple[SSAValue, int, int]]:
    """Live ranges where an identity op's result (a pipeline marker, an
    optimization barrier) is the buffer of its operand: the operand's range
    extends to the result's last read and the result takes no memory of its own
    (when the operand has no range, being fused into the marker, the result's
    range stands for the buffer)."""
    index = {value: k for k, (value, _, _) in enumerate(ranges)}
    merged = list(ranges)
    dropped: set[int] = set()
    for op in block.ops:
        if not is_identity(op):
            continue
        for operand, result in zip(op.operands, op.results, strict=True):
            if operand not in index or result not in index:
                continue
            i, j = index[operand], index[result]
            value, born, last = merged[i]
            merged[i] = (value, born, max(last, merged[j][2]))
            dropped.add(j)
            index[result] = i
    return [r for k, r in enumerate(merged) if k not in dropped]


def fused_live_ranges(
    block: Block, excluded_args: set[int], fusion: BlockFusion | None = None
) -> list[tuple[SSAValue, int, int]]:
    """``(value, born, last read)`` of every value that occupies device memory
    under the fusion model: the block's used arguments (but ``excluded_args``)
    and its materialized results. Positions index the block's ops; the end of
    the block is ``len(ops)``. ``fusion``: the block's decisions, if made already."""
    fusion = fusion or BlockFusion(block)
    ranges = [
        (arg, 0, fusion.last_read(arg, 0))
        for k, arg in enumerate(block.args)
        if k not in excluded_args and arg.uses
    ]
    for i, op in enumerate(fusion.ops):
        for result in op.results:
            if result in fusion.materialized:
                ranges.append((result, i, fusion.last_read(result, i)))
    return ranges


def fused_traffic_bytes(
    block: Block,
    shapes: Callable[[SSAValue], tuple[int, ...]],
    fusion: BlockFusion | None = None,
) -> float:
    """Bytes written to and read from device memory by the block's kernels:
    each materialized result written once, and each materialized value or
    argument read once per kernel that reads it. ``fusion``: the block's
    decisions, if made already."""
    fusion = fusion or BlockFusion(block)
    total = 0.0
    for value, size in _materialized_sizes(block, shapes, fusion):
        writes = 0 if value.owner is block else 1
        total += size * (writes + fusion.kernels_reading(value))
    return total


def _materialized_sizes(
    block: Block, shapes: Callable[[SSAValue], tuple[int, ...]], fusion: BlockFusion
) -> Iterator[tuple[SSAValue, int]]:
    """The block's arguments and materialized results with their bytes (a
    non-tensor value, a token, moves nothing and is left out)."""
    for value in [*block.args, *(r for op in fusion.ops for r in op.results)]:
        if value.owner is not block and value not in fusion.materialized:
            continue
        try:
            yield value, math.prod(shapes(value)) * dtype_of(value.type).itemsize
        except Exception:
            continue


def traffic_by_kernel(
    block: Block,
    shapes: Callable[[SSAValue], tuple[int, ...]],
    fusion: BlockFusion | None = None,
) -> dict[Operation, float]:
    """:func:`fused_traffic_bytes` per kernel (keyed by the op that ends it):
    a materialized result's write to its op, each read to the kernel that
    reads it. The values sum to :func:`fused_traffic_bytes`."""
    fusion = fusion or BlockFusion(block)
    out: dict[Operation, float] = {}
    for value, size in _materialized_sizes(block, shapes, fusion):
        if value.owner is not block:
            owner = value.owner
            out[owner] = out.get(owner, 0.0) + size  # type: ignore[index]
        for kernel in fusion.kernel_ops_reading(value):
            out[kernel] = out.get(kernel, 0.0) + size
    return out


def moves_minor_dimension(op: Operation) -> bool:
    """Is ``op`` a ``transpose`` whose result's minor (last) dimension is not
    its operand's (a read of its operand strides through memory)?"""
    if not (isinstance(op, LaxOp) and op.primitive_name == "transpose"):
        return False
    permutation = tuple(op.param("permutation"))
    return bool(permutation) and permutation[-1] != len(permutation) - 1


def transposed_reads(
    block: Block,
    shapes: Callable[[SSAValue], tuple[int, ...]],
    fusion: BlockFusion | None = None,
) -> list[float]:
    """The bytes of every read that strides through memory: a ``transpose``
    moving the minor dimension reads its operand across rows in each kernel it
    runs in (once when its result is materialized, else once per kernel that
    fuses it, as XLA duplicates it into each consumer). One entry per such
    read, the transposed array's bytes."""
    fusion = fusion or BlockFusion(block)
    reads: list[float] = []
    for op in fusion.ops:
        if not moves_minor_dimension(op):
            continue
        (result,) = op.results
        try:
            size = float(math.prod(shapes(result)) * dtype_of(result.type).itemsize)
        except Exception:  # a non-tensor value
            continue
        count = 1 if result in fusion.materialized else fusion.kernels_reading(result)
        reads += [size] * count
    return reads


__all__ = [
    "CHEAP_PRODUCERS",
    "BlockFusion",
    "fused_live_ranges",
    "fused_traffic_bytes",
    "fuses_inputs",
    "is_cheap",
    "is_fusible",
    "is_identity",
    "merge_identity_ranges",
    "moves_minor_dimension",
    "streamed_inputs",
    "tiled_attention_values",
    "traffic_by_kernel",
    "transposed_reads",
]
