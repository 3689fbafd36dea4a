"""Run a synthesized all-reduce program (``sharding.all_reduce_program``) inside ``shard_map``.

Each step is one XLA collective over explicit replica groups (``axis_index_groups`` over all
mesh axes; a device in no group of a step is a group of its own). The buffer is the local
block flattened and zero-padded to a multiple of the reduction group size, so that every
ReduceScatter divides it. XLA has no Reduce or Broadcast collective on CPU: Reduce is an
all-reduce whose result only the root keeps (the others keep their buffer, as a reduce leaves
it), Broadcast an all-reduce of the root's buffer (the others contribute zeros); both move
what their groups say, over the same replica groups. After the last step, a buffer whose
chunks ended permuted (``chunk_order``) is put back in order locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from alpa_ir.dialects.sharding import AllReduceProgramOp
from alpa_ir.errors import AlpaError


def _mesh_groups(groups: list[list[int]], position: dict[int, int]) -> list[list[int]]:
    """Replica groups in mesh positions, every mesh device in exactly one group."""
    try:
        placed = [[position[d] for d in g] for g in groups]
    except KeyError as missing:
        raise AlpaError(
            f"sharding.all_reduce_program: device {missing} is not in the mesh"
        ) from None
    covered = {i for g in placed for i in g}
    return placed + [[i] for i in range(len(position)) if i not in covered]


def _roots(groups: list[list[int]], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per mesh position: whether it is a root (member 0) of a real group, and in one."""
    root, member = np.zeros(size, bool), np.zeros(size, bool)
    for g in groups:
        if len(g) > 1:
            root[g[0]] = True
            member[g] = True
    return root, member


def run_program(
    x: Any,
    op: AllReduceProgramOp,
    axis_names: Sequence[str],
    position: dict[int, int],
    group_size: int,
) -> Any:
    """The all-reduce of the local block ``x`` by the op's steps; ``position`` maps a
    device id of the program to its position in the mesh (row-major)."""
    names = tuple(axis_names)
    size = len(position)
    me = lax.axis_index(names)
    flat = x.reshape(-1)
    length = -(-flat.shape[0] // group_size) * group_size
    buf = jnp.pad(flat, (0, length - flat.shape[0]))
    for name, groups in op.step_list:
        placed = _mesh_groups(groups, position)
        if name == "AllReduce":
            buf = lax.psum(buf, names, axis_index_groups=placed)
        elif name == "ReduceScatter":
            buf = lax.psum_scatter(
                buf, names, scatter_dimension=0, axis_index_groups=placed, tiled=True
            )
        elif name == "AllGather":
            buf = lax.all_gather(buf, names, axis=0, axis_index_groups=placed, tiled=True)
        else:
            root, member = (jnp.asarray(m)[me] for m in _roots(placed, size))
            if name == "Reduce":
                buf = jnp.where(root, lax.psum(buf, names, axis_index_groups=placed), buf)
            else:  # Broadcast
                sent = jnp.where(root, buf, jnp.zeros_like(buf))
                buf = jnp.where(member, lax.psum(sent, names, axis_index_groups=placed), buf)
    orders = op.chunk_orders
    if orders is not None:
        inverse = np.empty((size, len(orders[0])), dtype=np.int32)
        for device, pos in position.items():
            inverse[pos, list(orders[device])] = np.arange(len(orders[device]))
        chunks = buf.reshape(len(orders[0]), -1)
        buf = jnp.take(chunks, jnp.asarray(inverse)[me], axis=0).reshape(-1)
    return buf[: flat.shape[0]].reshape(x.shape)
