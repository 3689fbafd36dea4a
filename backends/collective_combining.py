"""Combine independent reduce-scatters (all-gathers) over the same mesh axes
into one collective inside a ``shard_map`` program, as XLA's reduce-scatter
and all-gather combiners do on GPU (XLA on CPU combines all-reduces only).

Each operand's split dimension is moved to the front and the operand flattened
to ``[group, -1]`` (row k is the block device k owns, or receives), the rows
are concatenated, one collective runs on the ``[group, total]`` buffer and the
result is cut back into the operands' blocks: the same values as one
collective per operand, with one launch (one latency) instead of many. This is
the flat buffer of ZeRO implementations (DeepSpeed), built per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax


def _rows(x: Any, dim: int, group: int) -> Any:
    """``x`` as ``[group, -1]``: row k is the k-th block of ``x`` along ``dim``."""
    return jnp.moveaxis(x, dim, 0).reshape(group, -1)


def _unrows(flat: Any, shape: Sequence[int], dim: int) -> Any:
    """The inverse of :func:`_rows` for one block: ``flat`` back to ``shape``."""
    moved = (shape[dim], *(s for d, s in enumerate(shape) if d != dim))
    return jnp.moveaxis(flat.reshape(moved), 0, dim)


def _split(buffer: Any, widths: Sequence[int]) -> list[Any]:
    out, start = [], 0
    for width in widths:
        out.append(buffer[:, start : start + width])
        start += width
    return out


def combined_reduce_scatter(
    xs: Sequence[Any], dims: Sequence[int], axes: Any, group: int
) -> list[Any]:
    """``psum_scatter(x, axes, scatter_dimension=d, tiled=True)`` of every
    ``(x, d)`` as one reduce-scatter (the operands share a dtype)."""
    if len(xs) == 1:
        return [lax.psum_scatter(xs[0], axes, scatter_dimension=dims[0], tiled=True)]
    rows = [_rows(x, d, group) for x, d in zip(xs, dims, strict=True)]
    summed = lax.psum_scatter(jnp.concatenate(rows, axis=1), axes, scatter_dimension=0, tiled=True)
    out = []
    for x, d, part in zip(xs, dims, _split(summed, [r.shape[1] for r in rows]), strict=True):
        block = list(x.shape)
        block[d] //= group
        out.append(_unrows(part, block, d))
    return out


def combined_all_gather(xs: Sequence[Any], dims: Sequence[int], axes: Any, group: int) -> list[Any]:
    """``all_gather(x, axes, axis=d, tiled=True)`` of every ``(x, d)`` as one
    all-gather (the operands share a dtype)."""
    if len(xs) == 1:
        return [lax.all_gather(xs[0], axes, axis=dims[0], tiled=True)]
    rows = [_rows(x, d, 1) for x, d in zip(xs, dims, strict=True)]
    gathered = lax.all_gather(jnp.concatenate(rows, axis=1), axes, axis=0, tiled=True)
    out = []
    for x, d, part in zip(xs, dims, _split(gathered, [r.shape[1] for r in rows]), strict=True):
        # row k of ``part`` is device k's block: the blocks follow each other along ``d``
        whole = list(x.shape)
        whole[d] *= group
        out.append(_unrows(part, whole, d))
    return out
