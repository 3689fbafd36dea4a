"""The computation each device runs for an op of a sharded plan.

Most primitives run unchanged on their local blocks: their parameters do not
mention shapes (element-wise ops, dot_general, reductions, transposes, ...).
The few whose parameters carry sizes get them replaced by the local sizes;
``iota`` along a split dimension adds the block's offset. The rules only let
a dimension be split where this is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import jax.numpy as jnp
from jax import lax

from alpa_ir.dialects.sharding import ShardingSpec

Localizer = Callable[[dict[str, Any], "LocalContext"], dict[str, Any]]


class LocalContext:
    """Global and local shapes of an op's operands and results, and the specs."""

    def __init__(
        self,
        operand_shapes: Sequence[tuple[int, ...]],
        result_shapes: Sequence[tuple[int, ...]],
        operand_specs: Sequence[ShardingSpec],
        result_specs: Sequence[ShardingSpec],
        mesh_shape: Sequence[int],
    ) -> None:
        self.operand_shapes = list(operand_shapes)
        self.result_shapes = list(result_shapes)
        self.operand_specs = list(operand_specs)
        self.result_specs = list(result_specs)
        self.mesh_shape = tuple(mesh_shape)

    def local_operand(self, k: int) -> tuple[int, ...]:
        return self.operand_specs[k].local_shape(self.operand_shapes[k], self.mesh_shape)

    def local_result(self, k: int) -> tuple[int, ...]:
        return self.result_specs[k].local_shape(self.result_shapes[k], self.mesh_shape)


def _result_shape_param(name: str) -> Localizer:
    def localize(params: dict[str, Any], ctx: LocalContext) -> dict[str, Any]:
        return {**params, name: ctx.local_result(0)}

    return localize


def _random_bits_shape(params: dict[str, Any], ctx: LocalContext) -> dict[str, Any]:
    """``random_bits``' shape is per key: the result's dims after the key array's."""
    keys = len(ctx.operand_shapes[0])
    return {**params, "shape": ctx.local_result(0)[keys:]}


def _slice(params: dict[str, Any], ctx: LocalContext) -> dict[str, Any]:
    local = ctx.local_operand(0)
    spec = ctx.operand_specs[0]
    limits = tuple(
        local[d] if spec.dims[d] else lim for d, lim in enumerate(params["limit_indices"])
    )
    return {**params, "limit_indices": limits}


def _slice_sizes(params: dict[str, Any], ctx: LocalContext) -> dict[str, Any]:
    local, full = ctx.local_operand(0), ctx.operand_shapes[0]
    sizes = tuple(local[d] if s == full[d] else s for d, s in enumerate(params["slice_sizes"]))
    return {**params, "slice_sizes": sizes}


def _conv_groups(params: dict[str, Any], ctx: LocalContext) -> dict[str, Any]:
    """A grouped convolution keeps the groups of its block: the grouped dim of
    the input (features or batch) is split only along its group factor."""
    dn = params["dimension_numbers"]
    full, local = ctx.operand_shapes[0], ctx.local_operand(0)
    out = dict(params)
    for name, dim in (
        ("feature_group_count", dn.lhs_spec[1]),
        ("batch_group_count", dn.lhs_spec[0]),
    ):
        if params[name] > 1:
            out[name] = params[name] // (full[dim] // local[dim])
    return out


LOCALIZERS: Mapping[str, Localizer] = MappingProxyType(
    {
        "conv_general_dilated": _conv_groups,
        "broadcast_in_dim": _result_shape_param("shape"),
        "reshape": _result_shape_param("new_sizes"),
        "iota": _result_shape_param("shape"),
        "random_bits": _random_bits_shape,
        "random_bits_rows": _result_shape_param("shape"),
        "slice": _slice,
        "gather": _slice_sizes,
        "dynamic_slice": _slice_sizes,
    }
)


def linear_axis_index(axes: Sequence[int], mesh_shape: Sequence[int], names: Sequence[str]) -> Any:
    """This device's block index along a dimension split over ``axes`` (major first)."""
    index = jnp.int32(0)
    for a in axes:
        index = index * mesh_shape[a] + lax.axis_index(names[a])
    return index


def iota_offset(value: Any, params: dict[str, Any], ctx: LocalContext, names: Sequence[str]) -> Any:
    """Shift a local iota by its block's start along the split dimension."""
    dim = params["dimension"]
    axes = ctx.result_specs[0].dims[dim]
    if not axes:
        return value
    start = linear_axis_index(axes, ctx.mesh_shape, names) * ctx.local_result(0)[dim]
    return value + start.astype(value.dtype)


def block_offsets(ctx: LocalContext, result: int, names: Sequence[str]) -> list[Any]:
    """The start of this device's block of result ``result`` along every dimension."""
    spec, local = ctx.result_specs[result], ctx.local_result(result)
    return [
        linear_axis_index(axes, ctx.mesh_shape, names).astype(jnp.uint32) * local[d]
        if axes
        else jnp.uint32(0)
        for d, axes in enumerate(spec.dims)
    ]


def _indexing(name: str, params: dict[str, Any]) -> tuple[Sequence[int], Sequence[int]] | None:
    """(operand dim of each index component, the dims indexed one at a time)
    of a gather or scatter, or None for other primitives."""
    dn = params.get("dimension_numbers")
    if name == "gather":
        return dn.start_index_map, dn.collapsed_slice_dims
    if name.startswith("scatter"):
        return dn.scatter_dims_to_operand_dims, dn.inserted_window_dims
    return None


def split_indexed_dims(name: str, params: dict[str, Any], ctx: LocalContext) -> list[int]:
    """The index components of a gather or scatter whose operand dim the plan
    splits (the rules split an indexed dim only where every indexed dim is
    taken one index at a time)."""
    indexing = _indexing(name, params)
    if indexing is None:
        return []
    index_map, single = indexing
    spec = ctx.operand_specs[0]
    return [k for k, d in enumerate(index_map) if d in single and spec.dims[d]]


def _fill(dtype: Any, fill_value: Any) -> Any:
    """What a gather in ``FILL_OR_DROP`` mode returns out of bounds (JAX's default)."""
    if fill_value is not None:
        return fill_value
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.nan
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return jnp.iinfo(dtype).min
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return jnp.iinfo(dtype).max
    return True


def indexed_block_op(
    name: str,
    xs: Sequence[Any],
    params: dict[str, Any],
    ctx: LocalContext,
    names: Sequence[str],
    bind: Callable[[Sequence[Any], dict[str, Any]], Any],
) -> Any:
    """A gather or scatter whose operand is split along indexed dims: each
    device reads or writes the indices of its block, shifted to local
    positions, and drops the rest (``FILL_OR_DROP`` with zeros: a gather's
    results are then partial sums). Indices are clamped first where the op's
    mode clamps; an index out of the whole operand in ``FILL_OR_DROP`` mode
    gets the op's fill value, added once (on the devices of block 0)."""
    index_map, _ = _indexing(name, params)  # type: ignore[misc]
    split = split_indexed_dims(name, params, ctx)
    full, local, spec = ctx.operand_shapes[0], ctx.local_operand(0), ctx.operand_specs[0]
    indices = jnp.asarray(xs[1])
    dropping = params["mode"] == lax.GatherScatterMode.FILL_OR_DROP
    outside = jnp.zeros(indices.shape[:-1], bool)
    first = jnp.bool_(True)
    parts = []
    for k in range(indices.shape[-1]):
        part, d = indices[..., k], index_map[k]
        if k in split:
            if dropping:
                outside = outside | (part < 0) | (part >= full[d])
            else:  # CLIP, PROMISE_IN_BOUNDS: the whole operand's clamp
                part = jnp.clip(part, 0, full[d] - 1)
            block = linear_axis_index(spec.dims[d], ctx.mesh_shape, names)
            first = first & (block == 0)
            part = part - (block * local[d]).astype(part.dtype)
        parts.append(part)
    local_params = {**params, "mode": lax.GatherScatterMode.FILL_OR_DROP}
    if name == "gather":
        local_params["fill_value"] = 0
    out = bind([xs[0], jnp.stack(parts, axis=-1), *xs[2:]], local_params)
    if name == "gather" and dropping:
        mask = jnp.expand_dims(outside & first, params["dimension_numbers"].offset_dims)
        out = jnp.where(mask, jnp.asarray(_fill(out.dtype, params["fill_value"]), out.dtype), out)
    return out
