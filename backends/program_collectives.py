"""Run a synthesized all-reduce program (``sharding.all_reduce_program``) inside ``shard_map``.

Each step is one XLA collective over explicit replica groups (``axis_index_groups`` over all
mesh axes; a device in no group of a step is a group of its own). The buffer is the local
block flattened and zero-padded to a multiple of the reduction group size, so that every
ReduceScatter divides it. XLA has no Reduce or Broadcast collective on CPU: Reduce is an
all-reduce whose result only the root keeps (the others keep their buffer, as a reduce leaves
it), Broadcast an all-reduce of the root's buffer (the others contribute zeros); both move
what their groups say, over the same replica groups. After the last step, a buffer whose
chunks ended permuted (``chunk_order``) is put back in order locally.

Programs whose ReduceScatter or AllGather steps leave devices out, or use groups of
different sizes, give devices buffers of different sizes, which one SPMD program cannot
hold. Those run in a *full-size* representation (``_run_full_size``): every device keeps a
buffer of the padded length, seen as ``k`` chunks (``k`` the reduction group size), in
which each chunk stays at its original position. Which chunks a device's buffer holds, and
in which order, is known statically from the steps; the chunks it does not hold are zero.
A ReduceScatter is then a psum over the group masked to each member's part of the group's
common chunks, an AllGather a psum over the group of the zero-masked buffers (the members'
chunks are disjoint). Every step is thus an all-reduce of the full padded buffer: this path
moves more bytes than the program's real traffic (a ReduceScatter or AllGather moves the
whole buffer, not its part), so it is for correctness, not speed. Programs whose steps keep
every device at one size take the fast path of real reduce-scatters and all-gathers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from alpa_ir.dialects.sharding import AllReduceProgramOp, steps_keep_one_size
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


def full_size_masks(
    steps: list[tuple[str, list[list[int]]]], position: dict[int, int], k: int
) -> list[np.ndarray | None]:
    """Per step of the full-size path: a (mesh positions, ``k``) table of the chunks each
    device holds after the step, or None when the step needs no masking (AllReduce, Reduce,
    Broadcast). Follows each device's ordered chunk list as real collectives would move its
    buffer; raises AlpaError if a step cannot run on position-preserving buffers (members
    combining different chunks, gathering the same chunk twice, a part that does not
    divide) or if a device does not end holding every chunk."""
    size = len(position)
    held: list[tuple[int, ...]] = [tuple(range(k))] * size
    tables: list[np.ndarray | None] = []
    for index, (name, groups) in enumerate(steps):
        placed = _mesh_groups(groups, position)
        where = f"sharding.all_reduce_program: step {index} ({name})"
        for g in placed:
            lists = [held[i] for i in g]
            if name in ("AllReduce", "ReduceScatter", "Reduce") and any(
                x != lists[0] for x in lists
            ):
                raise AlpaError(f"{where} combines buffers holding different chunks")
            if name == "ReduceScatter":
                if len(lists[0]) % len(g):
                    raise AlpaError(f"{where}: {len(lists[0])} chunks do not divide by {len(g)}")
                part = len(lists[0]) // len(g)
                for m, i in enumerate(g):
                    held[i] = lists[0][m * part : (m + 1) * part]
            elif name == "AllGather":
                joined = tuple(c for x in lists for c in x)
                if len(set(joined)) != len(joined):
                    raise AlpaError(f"{where} gathers a chunk twice")
                for i in g:
                    held[i] = joined
            elif name == "Broadcast":
                for i in g:
                    held[i] = lists[0]
        if name in ("ReduceScatter", "AllGather"):
            table = np.zeros((size, k), dtype=bool)
            for i, chunks in enumerate(held):
                table[i, list(chunks)] = True
            tables.append(table)
        else:
            tables.append(None)
    if any(sorted(x) != list(range(k)) for x in held):
        raise AlpaError("sharding.all_reduce_program: a device does not end with every chunk")
    return tables


def _run_full_size(
    buf: Any,
    steps: list[tuple[str, list[list[int]]]],
    names: tuple[str, ...],
    position: dict[int, int],
    k: int,
) -> Any:
    """The steps on full-size buffers (see the module doc); chunks end in place."""
    size = len(position)
    me = lax.axis_index(names)
    chunks = buf.reshape(k, -1)
    masks = full_size_masks(steps, position, k)
    for (name, groups), table in zip(steps, masks, strict=True):
        placed = _mesh_groups(groups, position)
        if table is not None:  # ReduceScatter, AllGather: chunks outside are zero
            total = lax.psum(chunks, names, axis_index_groups=placed)
            chunks = jnp.where(jnp.asarray(table)[me][:, None], total, jnp.zeros_like(total))
        else:
            chunks = _combine(chunks, name, names, placed, size, me)
    return chunks.reshape(-1)


def _combine(
    buf: Any, name: str, names: tuple[str, ...], placed: list[list[int]], size: int, me: Any
) -> Any:
    """An AllReduce, Reduce or Broadcast step over the mesh groups ``placed``."""
    if name == "AllReduce":
        return lax.psum(buf, names, axis_index_groups=placed)
    root, member = (jnp.asarray(m)[me] for m in _roots(placed, size))
    if name == "Reduce":
        return jnp.where(root, lax.psum(buf, names, axis_index_groups=placed), buf)
    sent = jnp.where(root, buf, jnp.zeros_like(buf))  # Broadcast
    return jnp.where(member, lax.psum(sent, names, axis_index_groups=placed), buf)


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
    steps = op.step_list
    if not steps_keep_one_size(steps, size):
        buf = _run_full_size(buf, steps, names, position, group_size)
        return buf[: flat.shape[0]].reshape(x.shape)
    for name, groups in steps:
        placed = _mesh_groups(groups, position)
        if name == "ReduceScatter":
            buf = lax.psum_scatter(
                buf, names, scatter_dimension=0, axis_index_groups=placed, tiled=True
            )
        elif name == "AllGather":
            buf = lax.all_gather(buf, names, axis=0, axis_index_groups=placed, tiled=True)
        else:
            buf = _combine(buf, name, names, placed, size, me)
    orders = op.chunk_orders
    if orders is not None:
        inverse = np.empty((size, len(orders[0])), dtype=np.int32)
        for device, pos in position.items():
            inverse[pos, list(orders[device])] = np.arange(len(orders[device]))
        chunks = buf.reshape(len(orders[0]), -1)
        buf = jnp.take(chunks, jnp.asarray(inverse)[me], axis=0).reshape(-1)
    return buf[: flat.shape[0]].reshape(x.shape)
