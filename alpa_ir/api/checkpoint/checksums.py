"""Checksums of a leaf's values and positions that every sharding of it gives alike."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each element (uint64, wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _bits(data: np.ndarray) -> np.ndarray:
    """Each element's bits as uint64."""
    flat = np.ascontiguousarray(data).reshape(-1)
    width = flat.dtype.itemsize
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width)
    if unsigned is None:  # complex128 & co: fold the words
        words = flat.view(np.uint64).reshape(flat.size, -1)
        return np.bitwise_xor.reduce(words, axis=1)
    return flat.view(unsigned).astype(np.uint64)


def _block_sum(data: np.ndarray, index: tuple[slice, ...], shape: tuple[int, ...]) -> int:
    """Σ mix(global flat index, bits) over one block of a global array."""
    if data.size == 0:
        return 0
    ranges = [
        np.arange(s.start or 0, (s.start or 0) + n) for s, n in zip(index, data.shape, strict=True)
    ]
    grids = np.meshgrid(*ranges, indexing="ij") if ranges else []
    flat = (
        np.ravel_multi_index([g.reshape(-1) for g in grids], shape).astype(np.uint64)
        if ranges
        else np.zeros(1, np.uint64)
    )
    with np.errstate(over="ignore"):
        mixed = _mix(flat * np.uint64(0x100000001B3) + _bits(data))
    return int(mixed.sum(dtype=np.uint64))


def checksum(value: Any) -> int:
    """A checksum of an array's values and positions that every sharding of it
    gives alike: the sum, over elements, of a 64-bit mix of (index, bits); each
    process adds its replica-0 shards, the processes' sums are added."""
    if isinstance(value, jax.Array):
        shape = tuple(value.shape)
        total = 0
        for shard in value.addressable_shards:
            if shard.replica_id == 0:
                index = tuple(shard.index) or ()
                total += _block_sum(np.asarray(shard.data), index, shape)
        total &= _MASK
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            # as two 32-bit halves: without x64, JAX would cut a uint64 to 32 bits
            halves = np.array([total >> 32, total & 0xFFFFFFFF], np.uint32)
            parts = np.asarray(multihost_utils.process_allgather(halves), np.uint64).reshape(-1, 2)
            with np.errstate(over="ignore"):
                total = int(((parts[:, 0] << np.uint64(32)) | parts[:, 1]).sum(dtype=np.uint64))
        return total & _MASK
    data = np.asarray(value)
    return _block_sum(data, tuple(slice(0, n) for n in data.shape), tuple(data.shape)) & _MASK


def hex_checksum(value: Any) -> str:
    """:func:`checksum` as the manifest writes it (16 hex digits)."""
    return f"{checksum(value):016x}"
