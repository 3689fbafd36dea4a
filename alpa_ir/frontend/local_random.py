"""One device's block of ``random_bits``, equal to that block of the whole draw.

JAX's partitionable threefry (``jax_threefry_partitionable``, on by default)
draws element ``i`` of ``random_bits(key, shape)`` as
``threefry2x32(key, hi(i), lo(i))``, where ``(hi, lo)`` are the two 32-bit
words of ``i``'s row-major index in the whole shape (a 64-bit counter). A
device holding a block of the result therefore computes its elements from
their global indices: the block's offset plus the local position, each
dimension times its global stride, in 64-bit arithmetic on pairs of uint32
words (so without ``jax_enable_x64``). Every plan then draws exactly the
numbers one device draws: the same dropout mask whatever the sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

U32 = np.uint32
_MASK16 = U32(0xFFFF)


def _add64(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    hi_a, lo_a = a
    hi_b, lo_b = b
    lo = lo_a + lo_b
    carry = (lo < lo_a).astype(U32)
    return hi_a + hi_b + carry, lo


def _mul32(x: Any, c: int) -> tuple[Any, Any]:
    """``x * c`` as (hi, lo) words, for a uint32 array ``x`` and ``0 <= c < 2**32``."""
    x1, x0 = x >> U32(16), x & _MASK16
    c1, c0 = U32(c >> 16), U32(c & 0xFFFF)
    low = x0 * c0
    mid1 = x1 * c0
    mid2 = x0 * c1
    high = x1 * c1
    # x*c = high<<32 + (mid1 + mid2)<<16 + low; the middle terms can carry.
    lo = low
    hi = high
    for mid in (mid1, mid2):
        hi, lo = _add64((hi, lo), (mid >> U32(16), (mid & _MASK16) << U32(16)))
    return hi, lo


def _mul64(x: Any, c: int) -> tuple[Any, Any]:
    """``x * c mod 2**64`` as (hi, lo) words, for a uint32 array ``x`` and ``0 <= c < 2**64``."""
    hi, lo = _mul32(x, c & 0xFFFFFFFF)
    return hi + x * U32((c >> 32) & 0xFFFFFFFF), lo


def global_counters(
    global_shape: Sequence[int], local_shape: Sequence[int], offsets: Sequence[Any]
) -> tuple[Any, Any]:
    """The (hi, lo) words of every local element's row-major index in ``global_shape``;
    ``offsets`` are the block's start per dimension (uint32 scalars)."""
    strides = [int(np.prod(global_shape[d + 1 :], dtype=object)) for d in range(len(global_shape))]
    zero = jnp.zeros(tuple(local_shape), U32)
    total = (zero, zero)
    for d, (stride, offset) in enumerate(zip(strides, offsets, strict=True)):
        index = lax.broadcasted_iota(U32, tuple(local_shape), d) + jnp.asarray(offset, U32)
        total = _add64(total, _mul64(index, stride))
    return total


def local_random_bits(
    key: Any,
    bit_width: int,
    global_shape: Sequence[int],
    local_shape: Sequence[int],
    offsets: Sequence[Any],
) -> Any:
    """The block at ``offsets`` (of ``local_shape``) of ``random_bits(key, bit_width,
    global_shape)`` for one threefry key (a 0-d typed key array); ``bit_width``
    is 8, 16 or 32 (64-bit draws need ``jax_enable_x64`` and stay replicated)."""
    from jax.extend.random import threefry2x32_p

    words = jax.random.key_data(key)
    k1 = jnp.broadcast_to(words[0], tuple(local_shape))
    k2 = jnp.broadcast_to(words[1], tuple(local_shape))
    hi, lo = global_counters(global_shape, local_shape, offsets)
    bits1, bits2 = threefry2x32_p.bind(k1, k2, hi, lo)
    dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}[bit_width]
    if bit_width == 32:
        return bits1 ^ bits2
    return lax.convert_element_type(bits1 ^ bits2, dtype)
