"""One sharding rule per primitive (see :mod:`alpa_ir.autosharding.factors`).

``RULES`` maps a primitive name to a function of the op that returns its
:class:`FactorRule`. Primitives without a rule (control flow, ``lax.primitive``)
get only the replicated strategy, with a warning that names them. Plugins
contribute rules for their own primitives through ``alpa_ir_sharding_rules``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

import jax.numpy as jnp

from alpa_ir.autosharding.factors import Dims, FactorKind, FactorRule
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.lax_primitives import PRIMITIVES, OpKind
from alpa_ir.dialects.types import dtype_of, shape_of

P, R, N = FactorKind.PASS_THROUGH, FactorKind.REDUCTION, FactorKind.NEED_REPLICATION

RuleFn = Callable[[LaxOp], FactorRule]


def _shapes(op: LaxOp) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    return [shape_of(t) for t in op.operand_types], [shape_of(t) for t in op.result_types]


class _Builder:
    """Collects factors while a rule maps dims to them."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.kinds: list[FactorKind] = []
        self.names: list[str] = []

    def add(self, size: int, kind: FactorKind, name: str = "") -> int:
        self.sizes.append(int(size))
        # A size-1 factor cannot be sharded: record it as need-replication.
        self.kinds.append(kind if size > 1 else N)
        self.names.append(name or f"f{len(self.sizes) - 1}")
        return len(self.sizes) - 1

    def rule(self, operands: Sequence[Dims], results: Sequence[Dims], **kw: object) -> FactorRule:
        return FactorRule(
            tuple(self.sizes),
            tuple(self.kinds),
            tuple(operands),
            tuple(results),
            names=tuple(self.names),
            **kw,  # type: ignore[arg-type]
        )


def _one(f: int) -> tuple[int, ...]:
    return (f,)


def elementwise(op: LaxOp) -> FactorRule:
    """Pointwise ops. Operands may broadcast: a rank-0 operand, or a size-1
    dimension against a larger one, takes no factor (it stays replicated)."""
    ins, outs = _shapes(op)
    b = _Builder()
    out = outs[0]
    factors = [b.add(s, P, f"d{k}") for k, s in enumerate(out)]
    dims = tuple(_one(f) for f in factors)

    def operand_dims(shape: tuple[int, ...]) -> Dims:
        if len(shape) != len(out):
            return ((),) * len(shape)
        return tuple(_one(f) if shape[k] == out[k] else () for k, f in enumerate(factors))

    return b.rule([operand_dims(s) for s in ins], [dims] * len(outs))


def _per_dim(op: LaxOp, kind_of: Callable[[int], FactorKind]) -> FactorRule:
    """Ops whose operands and results all have the operand-0 shape, with a kind per dim."""
    ins, outs = _shapes(op)
    b = _Builder()
    dims = tuple(_one(b.add(s, kind_of(d), f"d{d}")) for d, s in enumerate(ins[0]))
    return b.rule(
        [dims if len(s) == len(ins[0]) else ((),) * len(s) for s in ins], [dims] * len(outs)
    )


def broadcast_in_dim(op: LaxOp) -> FactorRule:
    ins, outs = _shapes(op)
    b = _Builder()
    out_f = [b.add(s, P, f"d{k}") for k, s in enumerate(outs[0])]
    bdims = op.param("broadcast_dimensions")
    operand = tuple(
        _one(out_f[bdims[i]]) if ins[0][i] == outs[0][bdims[i]] else () for i in range(len(ins[0]))
    )
    return b.rule([operand, *[((),) * len(s) for s in ins[1:]]], [tuple(_one(f) for f in out_f)])


def reshape(op: LaxOp) -> FactorRule:
    """Splits and merges of dims share factors (a merged dim is made of the
    factors of the dims it merges, major first)."""
    ins, outs = _shapes(op)
    src, dst = [d for d in ins[0]], [d for d in outs[0]]
    b = _Builder()
    src_dims: list[tuple[int, ...]] = [() for _ in src]
    dst_dims: list[tuple[int, ...]] = [() for _ in dst]
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1:
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            j += 1
            continue
        # Grow the smallest block of dims with equal products.
        si, sj, pi, pj = i, j, src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi *= src[i]
                i += 1
            else:
                pj *= dst[j]
                j += 1
        block_src, block_dst = list(range(si, i)), list(range(sj, j))
        if len(block_src) == 1 or len(block_dst) == 1:
            many, one = (block_dst, block_src) if len(block_src) == 1 else (block_src, block_dst)
            many_shape = dst if len(block_src) == 1 else src
            factors = [b.add(many_shape[d], P) for d in many]
            many_dims = dst_dims if len(block_src) == 1 else src_dims
            one_dims = src_dims if len(block_src) == 1 else dst_dims
            for d, f in zip(many, factors, strict=True):
                many_dims[d] = (f,)
            one_dims[one[0]] = tuple(factors)
        else:
            # No dim boundary inside the block is shared, but its leading
            # dims share a major factor: a split of it keeps every device's
            # block of elements contiguous on both sides ((64, 16) ->
            # (32, 32): rows of a batch split stay the same groups). The
            # rest of the block cannot be split.
            major = math.gcd(src[si], dst[sj])
            first = b.add(major, P) if major > 1 else None
            rest = b.add(pi // major, N)
            lead = (rest,) if first is None else (first, rest)
            for d in block_src:
                src_dims[d] = lead if d == si else (rest,)
            for d in block_dst:
                dst_dims[d] = lead if d == sj else (rest,)
    return b.rule([tuple(src_dims)], [tuple(dst_dims)])


def transpose(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    b = _Builder()
    factors = [b.add(s, P, f"d{k}") for k, s in enumerate(ins[0])]
    perm = op.param("permutation")
    return b.rule([tuple(_one(f) for f in factors)], [tuple(_one(factors[p]) for p in perm)])


def squeeze(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    b = _Builder()
    dropped = set(op.param("dimensions"))
    factors = [None if k in dropped else b.add(s, P, f"d{k}") for k, s in enumerate(ins[0])]
    return b.rule(
        [tuple(() if f is None else _one(f) for f in factors)],
        [tuple(_one(f) for f in factors if f is not None)],
    )


def reduction(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    axes = set(op.param("axes"))
    name = op.primitive_name
    reduce = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}.get(name)
    kind = R if reduce else N
    b = _Builder()
    factors = [b.add(s, kind if k in axes else P, f"d{k}") for k, s in enumerate(ins[0])]
    return b.rule(
        [tuple(_one(f) for f in factors)],
        [tuple(_one(f) for k, f in enumerate(factors) if k not in axes)],
        reduce=reduce or "sum",
    )


def _replicate_dims(op: LaxOp, dims: set[int]) -> FactorRule:
    return _per_dim(op, lambda d: N if d in dims else P)


def argminmax(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    axes = set(op.param("axes"))
    b = _Builder()
    factors = [b.add(s, N if k in axes else P, f"d{k}") for k, s in enumerate(ins[0])]
    return b.rule(
        [tuple(_one(f) for f in factors)],
        [tuple(_one(f) for k, f in enumerate(factors) if k not in axes)],
    )


def along_axis(param: str) -> RuleFn:
    """Ops that mix values along one axis (cumsum, sort, top_k, split, ...)."""

    def rule(op: LaxOp) -> FactorRule:
        ins, outs = _shapes(op)
        axis = op.param(param) % len(ins[0])
        b = _Builder()
        factors = [b.add(s, N if k == axis else P, f"d{k}") for k, s in enumerate(ins[0])]
        dims = tuple(_one(f) for f in factors)
        out_dims = [
            tuple(_one(f) if k != axis else () for k, f in enumerate(factors))
            if s != ins[0]
            else dims
            for s in outs
        ]
        return b.rule([dims] * len(ins), out_dims)

    return rule


def dot_general(op: LaxOp) -> FactorRule:
    ins, _outs = _shapes(op)
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    lhs, rhs = ins
    b = _Builder()
    lhs_d: list[tuple[int, ...]] = [() for _ in lhs]
    rhs_d: list[tuple[int, ...]] = [() for _ in rhs]
    out_d: list[tuple[int, ...]] = []
    for k, (i, j) in enumerate(zip(lb, rb, strict=True)):
        f = b.add(lhs[i], P, f"b{k}")
        lhs_d[i] = rhs_d[j] = (f,)
        out_d.append((f,))
    for k, (i, j) in enumerate(zip(lc, rc, strict=True)):
        f = b.add(lhs[i], R, f"k{k}")
        lhs_d[i] = rhs_d[j] = (f,)
    for i in range(len(lhs)):
        if i not in lc and i not in lb:
            f = b.add(lhs[i], P, f"i{i}")
            lhs_d[i] = (f,)
            out_d.append((f,))
    for j in range(len(rhs)):
        if j not in rc and j not in rb:
            f = b.add(rhs[j], P, f"j{j}")
            rhs_d[j] = (f,)
            out_d.append((f,))
    return b.rule([tuple(lhs_d), tuple(rhs_d)], [tuple(out_d)], heavy=True)


def conv_general_dilated(op: LaxOp) -> FactorRule:
    """Batch and output features pass through, input features reduce; spatial
    dims need replication (a halo exchange is not modelled).

    A grouped convolution (``feature_group_count`` G > 1: a depthwise one, or
    ``batch_group_count`` G > 1: its weight gradient) is G independent
    convolutions, group ``g`` reading the ``g``-th block of the grouped
    dimension (input features, or the input batch) and writing the ``g``-th
    block of the output features. The group is a pass-through factor, the
    major one of the dims it blocks: splitting it splits the groups.
    """
    ins, outs = _shapes(op)
    dn = op.param("dimension_numbers")
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    lhs, rhs, out = ins[0], ins[1], outs[0]
    features, batches = op.param("feature_group_count"), op.param("batch_group_count")
    groups = features * batches
    b = _Builder()
    lhs_d: list[tuple[int, ...]] = [() for _ in lhs]
    rhs_d: list[tuple[int, ...]] = [() for _ in rhs]
    out_d: list[tuple[int, ...]] = [() for _ in out]
    g = (b.add(groups, P, "g"),) if groups > 1 else ()
    n = b.add(out[out_spec[0]], P, "n")
    lhs_d[lhs_spec[0]] = (*g, n) if batches > 1 else (n,)
    out_d[out_spec[0]] = (n,)
    o = b.add(out[out_spec[1]] // groups, P, "o")
    rhs_d[rhs_spec[0]] = out_d[out_spec[1]] = (*g, o)
    c = b.add(rhs[rhs_spec[1]], R, "c")
    lhs_d[lhs_spec[1]] = (*g, c) if features > 1 else (c,)
    rhs_d[rhs_spec[1]] = (c,)
    return b.rule([tuple(lhs_d), tuple(rhs_d)], [tuple(out_d)], heavy=True)


def windowed(op: LaxOp) -> FactorRule:
    """reduce_window_* / select_and_*: dims with a real window replicate."""
    ins, _ = _shapes(op)
    window, strides = op.param("window_dimensions"), op.param("window_strides")
    pads = op.param("padding")
    plain = {
        d
        for d in range(len(ins[0]))
        if window[d] == 1 and strides[d] == 1 and tuple(pads[d]) == (0, 0)
    }
    params = op.jax_params()
    for extra in ("base_dilation", "window_dilation"):
        if params.get(extra) is not None:
            plain &= {d for d in plain if params[extra][d] == 1}
    return _per_dim(op, lambda d: P if d in plain else N)


def pad(op: LaxOp) -> FactorRule:
    config = op.param("padding_config")
    return _replicate_dims(op, {d for d, c in enumerate(config) if tuple(c) != (0, 0, 0)})


def slice_(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    start, limit, strides = (
        op.param("start_indices"),
        op.param("limit_indices"),
        op.param("strides"),
    )
    cut = {
        d
        for d in range(len(ins[0]))
        if start[d] != 0 or limit[d] != ins[0][d] or (strides is not None and strides[d] != 1)
    }
    b = _Builder()
    factors = [b.add(s, N if k in cut else P, f"d{k}") for k, s in enumerate(ins[0])]
    return b.rule(
        [tuple(_one(f) for f in factors)],
        [tuple(() if k in cut else _one(f) for k, f in enumerate(factors))],
    )


def concatenate(op: LaxOp) -> FactorRule:
    ins, outs = _shapes(op)
    axis = op.param("dimension")
    b = _Builder()
    factors = [None if k == axis else b.add(s, P, f"d{k}") for k, s in enumerate(outs[0])]
    dims = tuple(() if f is None else _one(f) for f in factors)
    return b.rule([dims] * len(ins), [dims])


def iota(op: LaxOp) -> FactorRule:
    _, outs = _shapes(op)
    b = _Builder()
    return b.rule([], [tuple(_one(b.add(s, P, f"d{k}")) for k, s in enumerate(outs[0]))])


def replicated(op: LaxOp) -> FactorRule:
    """No dimension is ever split (the ops on PRNG keys: a key is one value)."""
    ins, outs = _shapes(op)
    return _Builder().rule(
        [tuple(() for _ in shape) for shape in ins], [tuple(() for _ in shape) for shape in outs]
    )


def random_bits(op: LaxOp) -> FactorRule:
    """Bits drawn from one threefry key may be split like any new tensor (a
    device draws its block from the global indices, see
    :mod:`alpa_ir.frontend.local_random`); the dims of a key array, bits of
    another implementation and 64-bit bits stay whole."""
    from alpa_ir.dialects.key_type import KeyType

    ins, outs = _shapes(op)
    key_elem = op.operand_types[0].element_type  # type: ignore[attr-defined]
    splittable = (
        not ins[0]
        and isinstance(key_elem, KeyType)
        and key_elem.tag == "fry"
        and op.param("bit_width") <= 32
    )
    b = _Builder()
    kind = P if splittable else N
    dims = tuple(_one(b.add(s, kind, f"d{k}")) for k, s in enumerate(outs[0]))
    return b.rule([tuple(() for _ in shape) for shape in ins], [dims])


def dynamic_slice(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    sizes = op.param("slice_sizes")
    b = _Builder()
    factors = [b.add(s, P if sizes[k] == s else N, f"d{k}") for k, s in enumerate(ins[0])]
    dims = tuple(_one(f) for f in factors)
    out = tuple(_one(f) if sizes[k] == ins[0][k] else () for k, f in enumerate(factors))
    return b.rule([dims, *[() for _ in ins[1:]]], [out])


def dynamic_update_slice(op: LaxOp) -> FactorRule:
    ins, _ = _shapes(op)
    operand, update = ins[0], ins[1]
    b = _Builder()
    factors = [b.add(s, P if update[k] == s else N, f"d{k}") for k, s in enumerate(operand)]
    dims = tuple(_one(f) for f in factors)
    upd = tuple(_one(f) if update[k] == operand[k] else () for k, f in enumerate(factors))
    return b.rule([dims, upd, *[() for _ in ins[2:]]], [dims])


def gather(op: LaxOp) -> FactorRule:
    """Offset dims taken whole pass through; indexed dims taken one index at a
    time (an embedding lookup's rows) are a sum, see below, other indexed
    dims replicate; the batch
    dims of the indices pass through to the output's batch dims, and with them
    the operand's batching dims paired with them (``take_along_axis``: row
    ``i`` of the indices reads row ``i`` of the operand)."""
    ins, outs = _shapes(op)
    operand, indices, out = ins[0], ins[1], outs[0]
    dn = op.param("dimension_numbers")
    sizes = op.param("slice_sizes")
    b = _Builder()
    op_d: list[tuple[int, ...]] = [() for _ in operand]
    out_d: list[tuple[int, ...]] = [() for _ in out]
    batching = dict(zip(dn.start_indices_batching_dims, dn.operand_batching_dims, strict=True))
    offset_operand_dims = [
        d
        for d in range(len(operand))
        if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
    ]
    for out_dim, d in zip(dn.offset_dims, offset_operand_dims, strict=True):
        whole = sizes[d] == operand[d] and out[out_dim] == operand[d]
        f = b.add(operand[d], P if whole else N, f"o{d}")
        op_d[d] = (f,)
        out_d[out_dim] = (f,) if whole else ()
    # An indexed dim split over devices (a vocabulary-split embedding table,
    # as Megatron and Alpa split it): every device looks up the rows of its
    # block and zeros elsewhere, so the results are partial sums.
    split = R if set(dn.start_index_map) <= set(dn.collapsed_slice_dims) else N
    for d in dn.collapsed_slice_dims:
        op_d[d] = (b.add(operand[d], split if d in dn.start_index_map else N, f"x{d}"),)
    batch_out = [d for d in range(len(out)) if d not in dn.offset_dims]
    idx_d: list[tuple[int, ...]] = [() for _ in indices]
    idx_batch = list(range(len(indices) - 1))  # index_vector_dim is the last
    for out_dim, d in zip(batch_out, idx_batch, strict=True):
        f = b.add(indices[d], P, f"b{d}")
        idx_d[d] = out_d[out_dim] = (f,)
        if d in batching:
            op_d[batching[d]] = (f,)
    return b.rule([tuple(op_d), tuple(idx_d)], [tuple(out_d)])


def scatter(op: LaxOp) -> FactorRule:
    """Window dims taken whole pass through, and so do indexed dims written one
    index at a time (each device keeps the updates of its block). For
    scatter-add the update batch dims are a sum: sharding them leaves partial
    results (the operand then arrives partial too)."""
    ins, _outs = _shapes(op)
    operand, indices, updates = ins[0], ins[1], ins[2]
    dn = op.param("dimension_numbers")
    additive = op.primitive_name == "scatter-add"
    b = _Builder()
    op_d: list[tuple[int, ...]] = [() for _ in operand]
    upd_d: list[tuple[int, ...]] = [() for _ in updates]
    batching = dict(zip(dn.scatter_indices_batching_dims, dn.operand_batching_dims, strict=True))
    window_operand_dims = [
        d
        for d in range(len(operand))
        if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims
    ]
    for upd_dim, d in zip(dn.update_window_dims, window_operand_dims, strict=True):
        whole = updates[upd_dim] == operand[d]
        f = b.add(operand[d], P if whole else N, f"w{d}")
        op_d[d] = (f,)
        upd_d[upd_dim] = (f,) if whole else ()
    # An indexed dim split over devices: every device writes the updates that
    # fall in its block and drops the others.
    indexed = set(dn.scatter_dims_to_operand_dims)
    split = P if indexed <= set(dn.inserted_window_dims) else N
    for d in dn.inserted_window_dims:
        op_d[d] = (b.add(operand[d], split if d in indexed else N, f"x{d}"),)
    scatter_upd = [d for d in range(len(updates)) if d not in dn.update_window_dims]
    idx_d: list[tuple[int, ...]] = [() for _ in indices]
    for upd_dim, d in zip(scatter_upd, range(len(indices) - 1), strict=True):
        if d in batching:  # row i of the updates writes row i of the operand only
            f = b.add(indices[d], P, f"b{d}")
            op_d[batching[d]] = (f,)
        else:
            f = b.add(indices[d], R if additive else N, f"s{d}")
        idx_d[d] = upd_d[upd_dim] = (f,)
    return b.rule(
        [tuple(op_d), tuple(idx_d), tuple(upd_d)],
        [tuple(op_d)],
        partial_operands=(0,) if additive else (),
    )


def linear(rule_fn: RuleFn) -> RuleFn:
    """``rule_fn`` for an op linear in every operand (an addition, a transpose, a
    float conversion): a pending sum may pass through it."""

    def rule(op: LaxOp) -> FactorRule:
        base = rule_fn(op)
        if op.primitive_name == "convert_element_type" and not all(
            jnp.issubdtype(dtype_of(t), jnp.floating) for t in (*op.operand_types, *op.result_types)
        ):
            return base
        return replace(base, linear_operands=tuple(range(len(base.operands))))

    return rule


LINEAR_PRIMITIVES = frozenset(
    {
        "add_any",
        "add",
        "sub",
        "neg",
        "copy",
        "convert_element_type",
        "transpose",
        "reshape",
        "broadcast_in_dim",
    }
)
"""Primitives whose rule lets a pending sum pass (see :func:`linear`)."""


def _default_rules() -> dict[str, RuleFn]:
    rules: dict[str, RuleFn] = {}
    for name, spec in PRIMITIVES.items():
        if spec.kind is OpKind.ELEMENTWISE:
            rules[name] = elementwise
    rules.update(
        {
            "broadcast_in_dim": broadcast_in_dim,
            "reshape": reshape,
            "transpose": transpose,
            "squeeze": squeeze,
            "rev": lambda op: _replicate_dims(op, set(op.param("dimensions"))),
            "pad": pad,
            "slice": slice_,
            "concatenate": concatenate,
            "split": along_axis("axis"),
            "iota": iota,
            "random_bits": random_bits,
            "random_bits_rows": random_bits,
            **{
                n: replicated
                for n in (
                    "random_seed",
                    "random_wrap",
                    "random_unwrap",
                    "random_split",
                    "random_split_rows",
                    "random_fold_in",
                    "random_clone",
                    "threefry2x32",
                )
            },
            "dot_general": dot_general,
            "conv_general_dilated": conv_general_dilated,
            "argmax": argminmax,
            "argmin": argminmax,
            "sort": along_axis("dimension"),
            "top_k": along_axis("axis"),
            "dynamic_slice": dynamic_slice,
            "dynamic_update_slice": dynamic_update_slice,
            "gather": gather,
            **{
                n: scatter
                for n in (
                    "scatter",
                    "scatter-add",
                    "scatter-mul",
                    "scatter-min",
                    "scatter-max",
                    "scatter-sub",
                )
            },
            **{
                n: reduction
                for n in (
                    "reduce_sum",
                    "reduce_max",
                    "reduce_min",
                    "reduce_prod",
                    "reduce_and",
                    "reduce_or",
                    "reduce_xor",
                )
            },
            **{
                n: along_axis("axis")
                for n in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
            },
            **{
                n: windowed
                for n in (
                    "reduce_window_sum",
                    "reduce_window_max",
                    "reduce_window_min",
                    "select_and_scatter_add",
                    "select_and_gather_add",
                )
            },
        }
    )
    for name in LINEAR_PRIMITIVES:
        rules[name] = linear(rules[name])
    return rules


RULES: Mapping[str, RuleFn] = MappingProxyType(_default_rules())
"""Primitive name -> rule, for the built-in primitives."""

# Ops that are the identity on their operands (values flow through unchanged).
TRANSPARENT_PRIMITIVES = frozenset({"pipeline_marker", "optimization_barrier"})
