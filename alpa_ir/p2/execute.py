"""Numerical reference execution of lowered reduction programs with numpy.

This follows what real collectives do with device buffers, not the boolean semantics:
AllReduce sums the members' buffers; ReduceScatter sums them and gives member ``i`` the
``i``-th contiguous part; AllGather concatenates the members' buffers in member order; Reduce
puts the sum on the first member and leaves the others' buffers untouched; Broadcast copies
the first member's buffer to all. It is the oracle that synthesized programs compute a real
all-reduce, and the reference for running them on real devices.
"""

from __future__ import annotations

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.p2.semantics import Collective

Steps = list[tuple[str, list[list[int]]]]


def run_steps(steps: Steps, buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Execute ``(collective name, groups)`` steps on per-device 1-d buffers (a new list)."""
    bufs = [np.array(b, copy=True) for b in buffers]
    for name, groups in steps:
        coll = Collective(name)
        for group in groups:
            data = [bufs[d] for d in group]
            if coll in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE):
                if any(x.shape != data[0].shape for x in data):
                    raise AlpaError(f"{name} over {group}: buffers of different sizes")
                total = np.sum(data, axis=0)
                if coll is Collective.ALL_REDUCE:
                    for d in group:
                        bufs[d] = total.copy()
                elif coll is Collective.REDUCE:
                    bufs[group[0]] = total
                else:
                    if total.shape[0] % len(group):
                        raise AlpaError(f"{name} over {group}: size does not divide by the group")
                    for d, part in zip(group, np.split(total, len(group)), strict=True):
                        bufs[d] = part.copy()
            elif coll is Collective.ALL_GATHER:
                joined = np.concatenate(data)
                for d in group:
                    bufs[d] = joined.copy()
            else:
                for d in group:
                    bufs[d] = data[0].copy()
    return bufs


def restore_chunk_order(
    buffers: list[np.ndarray], chunk_order: dict[int, tuple[int, ...]] | None
) -> list[np.ndarray]:
    """Undo a program's final chunk permutation (``LoweredProgram.device_chunk_order()``)."""
    if chunk_order is None:
        return buffers
    out = list(buffers)
    for device, order in chunk_order.items():
        chunks = buffers[device].reshape(len(order), -1)
        natural = np.empty_like(chunks)
        natural[list(order)] = chunks
        out[device] = natural.reshape(-1)
    return out


def reference_allreduce(groups: list[list[int]], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """What a plain all-reduce over ``groups`` leaves on every device."""
    out = list(buffers)
    for group in groups:
        total = np.sum([buffers[d] for d in group], axis=0)
        for d in group:
            out[d] = total
    return out
