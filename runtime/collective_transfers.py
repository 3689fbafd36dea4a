"""A cross-mesh transfer as one XLA program over both meshes' devices.

Across hosts a tensor cannot be ``jax.device_put`` from one process's devices
to another's. Instead the tile plan of the transfer
(:class:`~alpa_ir.pipeline.cross_mesh.TransferPlan`) becomes one jitted
``shard_map`` over the union of the source and destination devices (a 1-D
mesh, axis ``u``), which every process owning one of those devices calls:

- each device enters with one slot: its source tile (a source device) or
  zeros of that shape (a destination device);
- the plan's point-to-point sends are packed into rounds, each round one
  ``lax.ppermute`` of equal-shaped pieces in which a device sends at most
  once and receives at most once; the sender cuts its piece out of its tile
  and the receiver writes it into its tile of the plan's receive spec, at
  offsets looked up by ``lax.axis_index``;
- each device leaves with its receive tile (zeros on a source device), and
  the destination processes make the array on the destination mesh from
  their tiles.

So the bytes that cross are exactly the plan's (Alpa's send-once, then
local all-gather rewrite: the destination mesh's BROADCAST all-gathers), and
XLA runs them as collectives between processes: gloo on CPU, NCCL on GPU.
A PRNG key moves as its key data (the plan with the data's trailing
dimensions whole).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.cross_mesh import Box, MeshLayout, Send, TransferPlan, device_tiles
from alpa_ir.runtime.devices import partition_spec

AXIS = "u"

Pair = tuple[int, int, Box]
"""(source device id, destination device id, box of the tensor)."""


def pack_rounds(plan: TransferPlan) -> list[list[Pair]]:
    """The plan's sends as rounds of equal-shaped pieces, each device sending
    and receiving at most once per round (greedy, in plan order)."""
    rounds: list[list[Pair]] = []

    def fits(pairs: list[Pair], src: int, dst: int, box: Box) -> bool:
        same_shape = _box_shape(pairs[0][2]) == _box_shape(box)
        return same_shape and all(s != src and d != dst for s, d, _ in pairs)

    for send in plan.sends:
        for dst in send.dsts:
            pair = (send.src, dst, send.box)
            home = next((r for r in rounds if fits(r, *pair)), None)
            if home is None:
                rounds.append([pair])
            else:
                home.append(pair)
    return rounds


def _box_shape(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


@dataclass(frozen=True)
class CollectiveTransfer:
    """The compiled program of one transfer and how to enter and leave it."""

    plan: TransferPlan
    union: tuple[int, ...]
    """Device ids of the program's 1-D mesh: the source devices, then the
    destination devices that are not source devices."""
    devices: Mapping[int, Any]
    src_tile: tuple[int, ...]
    recv_tile: tuple[int, ...]
    src_sharding: NamedSharding
    """The plan's source spec on the source mesh: what the program reads."""
    dst_sharding: NamedSharding
    """The plan's receive spec on the destination mesh: what it delivers."""
    program: Callable[[jax.Array], jax.Array]
    dtype: Any
    """The element type that moves (a key's data type for PRNG keys)."""
    key_impl: Any = None
    """The PRNG implementation when the value is a key array."""
    placeholders: dict[int, jax.Array] = dataclasses.field(default_factory=dict, compare=False)
    """Per destination device, the zeros it enters with (made once; the program
    never writes its input)."""

    def __call__(self, x: jax.Array | None) -> jax.Array | None:
        """Move ``x`` (on the source mesh; None on a process that owns no
        source device). Returns the array in the plan's receive spec on a
        process that owns destination devices, else None."""
        if x is not None:
            if self.key_impl is not None:
                x = jax.random.key_data(x)
            x = jax.device_put(x, self.src_sharding)  # a no-op when it is laid out so
        got = self._move(x)
        if got is not None and self.key_impl is not None:
            got = jax.random.wrap_key_data(got, impl=self.key_impl)
        return got

    def _move(self, x: jax.Array | None) -> jax.Array | None:
        me = jax.process_index()
        slots = []
        for k, device_id in enumerate(self.union):
            device = self.devices[device_id]
            if device.process_index != me:
                continue
            slots.append(self._slot(x, k, device))
        union_mesh = Mesh(np.array([self.devices[d] for d in self.union]), (AXIS,))
        entered = jax.make_array_from_single_device_arrays(
            (len(self.union), *self.src_tile), NamedSharding(union_mesh, PartitionSpec(AXIS)), slots
        )
        # Wait for it: XLA's CPU runtime may otherwise start a later program's
        # collective on some of these devices first, and gloo waits forever.
        left = jax.block_until_ready(self.program(entered))
        dst = set(self.plan.dst.devices)
        tiles = [
            s.data.reshape(self.recv_tile)
            for s in left.addressable_shards
            if self.union[s.index[0].start or 0] in dst
        ]
        if not tiles:
            return None
        return jax.make_array_from_single_device_arrays(self.plan.shape, self.dst_sharding, tiles)

    def _slot(self, x: jax.Array | None, k: int, device: Any) -> jax.Array:
        if k < len(self.plan.src.devices):
            if x is None:
                raise AlpaError(f"this process owns source device {self.union[k]} but has no value")
            for shard in x.addressable_shards:
                if shard.device == device:
                    return shard.data.reshape((1, *self.src_tile))
            raise AlpaError(f"the transfer input has no shard on device {self.union[k]}")
        zeros = self.placeholders.get(k)
        if zeros is None:
            zeros = jax.device_put(jnp.zeros((1, *self.src_tile), self.dtype), device)
            self.placeholders[k] = zeros
        return zeros


def _tile_shape(tiles: Mapping[int, Box]) -> tuple[int, ...]:
    shapes = {_box_shape(box) for box in tiles.values()}
    if len(shapes) != 1:
        raise AlpaError(f"a layout with unequal tiles {sorted(shapes)} cannot move as one program")
    return shapes.pop()


def collective_transfer(
    plan: TransferPlan,
    devices: Mapping[int, Any],
    src_axis_names: Sequence[str],
    dst_axis_names: Sequence[str],
    dtype: Any,
) -> CollectiveTransfer:
    """The program of ``plan`` over its devices (``devices``: id -> JAX device
    of the whole world) for elements of ``dtype``, the meshes' axes named as given."""
    key_impl = None
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        key = jax.ShapeDtypeStruct(plan.shape, dtype)
        data = jax.eval_shape(jax.random.key_data, key)
        key_impl, dtype = dtype._impl, data.dtype  # the key dtype's PRNG implementation
        plan = _with_trailing(plan, tuple(data.shape[len(plan.shape) :]))
    src_tiles = device_tiles(plan.shape, plan.src)
    recv_tiles = plan.recv_tiles()
    union = tuple(dict.fromkeys((*plan.src.devices, *plan.dst.devices)))
    position = {d: k for k, d in enumerate(union)}
    src_tile, recv_tile = _tile_shape(src_tiles), _tile_shape(recv_tiles)
    rank = len(plan.shape)
    steps = []  # (piece shape, perm, send offsets, receive offsets, receives)
    for pairs in pack_rounds(plan):
        send_at = np.zeros((len(union), rank), np.int32)
        recv_at = np.zeros((len(union), rank), np.int32)
        receives = np.zeros(len(union), bool)
        for src, dst, box in pairs:
            send_at[position[src]] = [
                lo - o for (lo, _), (o, _) in zip(box, src_tiles[src], strict=True)
            ]
            recv_at[position[dst]] = [
                lo - o for (lo, _), (o, _) in zip(box, recv_tiles[dst], strict=True)
            ]
            receives[position[dst]] = True
        perm = [(position[s], position[d]) for s, d, _ in pairs]
        steps.append((_box_shape(pairs[0][2]), perm, send_at, recv_at, receives))

    def body(slot: jax.Array) -> jax.Array:
        tile = slot[0]
        me = jax.lax.axis_index(AXIS)
        if len(steps) == 1 and steps[0][0] == recv_tile == src_tile:
            # tile to whole tile: one ppermute is the transfer (a device that
            # receives nothing gets zeros, and its result is not read)
            return jax.lax.ppermute(slot, AXIS, steps[0][1])
        out = jnp.zeros(recv_tile, slot.dtype)
        for shape, perm, send_at, recv_at, receives in steps:
            piece = jax.lax.dynamic_slice(tile, tuple(jnp.asarray(send_at)[me]), shape)
            got = jax.lax.ppermute(piece, AXIS, perm)
            at = tuple(jnp.asarray(recv_at)[me])
            # a device that receives nothing this round keeps what is there
            got = jnp.where(jnp.asarray(receives)[me], got, jax.lax.dynamic_slice(out, at, shape))
            out = jax.lax.dynamic_update_slice(out, got, at)
        return out[None]

    union_mesh = Mesh(np.array([devices[d] for d in union]), (AXIS,))
    program = jax.jit(
        jax.shard_map(
            body,
            mesh=union_mesh,
            in_specs=PartitionSpec(AXIS),
            out_specs=PartitionSpec(AXIS),
            check_vma=False,
        )
    )
    src_sharding = _sharding(
        plan.src.devices, plan.src.mesh_shape, plan.src.spec, src_axis_names, devices
    )
    dst_sharding = _sharding(
        plan.dst.devices, plan.dst.mesh_shape, plan.recv_spec, dst_axis_names, devices
    )
    return CollectiveTransfer(
        plan, union, devices, src_tile, recv_tile, src_sharding, dst_sharding, program, dtype,
        key_impl,
    )  # fmt: skip


def _with_trailing(plan: TransferPlan, trailing: tuple[int, ...]) -> TransferPlan:
    """The plan of a key array's data: the key's plan with whole trailing dims."""
    whole = tuple((0, n) for n in trailing)
    more = ((),) * len(trailing)

    def layout(lay: MeshLayout) -> MeshLayout:
        spec = dataclasses.replace(lay.spec, dims=lay.spec.dims + more)
        return MeshLayout(spec, lay.mesh_shape, lay.devices)

    size = int(np.prod(trailing))
    return dataclasses.replace(
        plan,
        shape=plan.shape + trailing,
        src=layout(plan.src),
        dst=layout(plan.dst),
        recv_spec=dataclasses.replace(plan.recv_spec, dims=plan.recv_spec.dims + more),
        sends=tuple(Send(s.src, s.dsts, s.box + whole, s.nbytes * size) for s in plan.sends),
    )


def _sharding(
    ids: Sequence[int],
    shape: Sequence[int],
    spec: Any,
    names: Sequence[str],
    devices: Mapping[int, Any],
) -> NamedSharding:
    mesh = Mesh(np.array([devices[d] for d in ids]).reshape(tuple(shape)), tuple(names))
    return NamedSharding(mesh, partition_spec(spec, mesh.axis_names))
