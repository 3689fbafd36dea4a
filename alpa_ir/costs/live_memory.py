"""The peak of the bytes live at once in a block, in program order (the
activations a stage keeps per micro-batch)."""

from __future__ import annotations

from xdsl.ir import Block, SSAValue

from alpa_ir.costs.fusion import BlockFusion, fused_live_ranges, merge_identity_ranges


def peak_live_bytes(
    block: Block,
    excluded_args: set[int],
    nbytes: object,
    *,
    fusion: bool = False,
    decisions: BlockFusion | None = None,
) -> float:
    """Peak bytes of the values live at once in ``block`` in program order: an
    argument (not excluded) from the start, a result from its op, each until
    its last use; returned values stay live to the end. With ``fusion``, only
    the values :mod:`alpa_ir.costs.fusion` materializes, each until the last kernel
    that reads it (``decisions``: the block's fusion, if made already)."""
    assert callable(nbytes)
    if fusion:
        ranges = fused_live_ranges(block, excluded_args, decisions)
        return _peak([(nbytes(v), born, last) for v, born, last in ranges], len(block.ops))
    plain = _plain_ranges(block, excluded_args)
    return _peak([(nbytes(value), born, last) for value, born, last in plain], len(block.ops))


def _plain_ranges(block: Block, excluded_args: set[int]) -> list[tuple[SSAValue, int, int]]:
    """Every value's (value, born, last use) in program order, without fusion."""
    ops = list(block.ops)
    position = {op: i for i, op in enumerate(ops)}
    end = len(ops)

    def last_use(value: SSAValue, born: int) -> int:
        last = born
        for use in value.uses:
            user = use.operation
            while user.parent_block() is not block and user.parent_op() is not None:
                user = user.parent_op()  # a use inside a region counts at its op
            if user is block.last_op:
                return end
            last = max(last, position.get(user, born))
        return last

    values: list[tuple[SSAValue, int]] = [
        (a, 0) for k, a in enumerate(block.args) if k not in excluded_args
    ]
    values += [(r, i) for i, op in enumerate(ops) for r in op.results]
    return merge_identity_ranges(
        block,
        [
            (value, born, last_use(value, born))
            for value, born in values
            if value.uses or born != 0 or not isinstance(value.owner, Block)  # not unused
        ],
    )


def live_across(
    block: Block,
    excluded_args: set[int],
    nbytes: object,
    boundary: int,
    *,
    fusion: bool = False,
    decisions: BlockFusion | None = None,
) -> float:
    """Bytes of the values (as :func:`peak_live_bytes` counts them) made at or
    before op ``boundary`` and still read after it: what a forward+backward
    function holds between its forward and its backward (the stash) when
    ``boundary`` is its forward's last op."""
    assert callable(nbytes)
    if fusion:
        ranges = [
            (nbytes(v), born, last)
            for v, born, last in fused_live_ranges(block, excluded_args, decisions)
        ]
    else:
        ranges = [(nbytes(v), born, last) for v, born, last in _plain_ranges(block, excluded_args)]
    return sum(size for size, born, last in ranges if born <= boundary < last)


def _peak(ranges: list[tuple[float, int, int]], end: int) -> float:
    """The largest sum of sizes of ``(size, born, last)`` ranges alive at once."""
    delta = [0.0] * (end + 2)
    for size, born, last in ranges:
        delta[born] += size
        delta[last + 1] -= size
    live, peak = 0.0, 0.0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak
