"""Cross-mesh transfers on the local JAX devices: run a
:class:`~alpa_ir.pipeline.cross_mesh.TransferPlan` (import name ``alpa_ir.runtime.transfers``).

Each send slices its piece out of the source device's shard and moves it with
``jax.device_put`` onto its destination device; each destination device
concatenates its pieces into its tile of the plan's receive spec, and
``jax.make_array_from_single_device_arrays`` makes the array on the
destination mesh. For the local all-gather rewrite the destination mesh then
runs the plan's all-gathers as XLA collectives: a jitted ``shard_map`` with
one ``lax.all_gather(tiled=True)`` per (tensor dim, mesh axes) of the plan.

Why ``shard_map`` rather than ``jax.device_put`` to the destination sharding:
the plan fixes which mesh axes gather which dimension, and ``shard_map`` runs
exactly those all-gathers over exactly those replica groups on the
destination devices (one collective per step, visible in the compiled HLO),
whereas ``device_put`` leaves the resharding method to JAX's transfer logic,
which need not be a collective over the fast local links the rewrite is for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.cross_mesh import MeshLayout, TransferPlan, assemble, device_tiles, relative
from alpa_ir.runtime.devices import local_devices_for, partition_spec
from alpa_ir.runtime.program import StepProgram, Transfer


def default_axis_names(rank: int) -> tuple[str, ...]:
    return tuple(f"m{k}" for k in range(rank))


def layout_mesh(
    layout: MeshLayout,
    axis_names: Sequence[str] | None = None,
    world: Sequence[Any] | None = None,
) -> Mesh:
    """The JAX mesh of a layout's devices (ids index ``world``, by default
    ``jax.devices()``)."""
    names = tuple(axis_names or default_axis_names(len(layout.mesh_shape)))
    devices = np.array(local_devices_for(layout.devices, world), dtype=object)
    return Mesh(devices.reshape(layout.mesh_shape), names)


def layout_sharding(
    layout: MeshLayout,
    axis_names: Sequence[str] | None = None,
    world: Sequence[Any] | None = None,
) -> NamedSharding:
    mesh = layout_mesh(layout, axis_names, world)
    return NamedSharding(mesh, partition_spec(layout.spec, mesh.axis_names))


def all_gather_program(
    mesh: Mesh,
    recv_spec: ShardingSpec,
    dst_spec: ShardingSpec,
    gather: Sequence[tuple[int, tuple[int, ...]]],
) -> Callable[[jax.Array], jax.Array]:
    """A jitted program on ``mesh`` all-gathering an array of ``recv_spec``
    into ``dst_spec``: one tiled ``lax.all_gather`` per (dim, mesh axes)."""
    names = mesh.axis_names
    steps = [(dim, tuple(names[a] for a in axes)) for dim, axes in gather]

    def body(x: jax.Array) -> jax.Array:
        for dim, axes in steps:
            x = jax.lax.all_gather(x, axes, axis=dim, tiled=True)
        return x

    program = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=partition_spec(recv_spec, names),
        out_specs=partition_spec(dst_spec, names),
        # lax.all_gather's result is typed as still varying over the gathered
        # axes, though it is replicated over them by construction.
        check_vma=False,
    )
    # The result carries exactly the destination NamedSharding.
    return jax.jit(program, out_shardings=NamedSharding(mesh, partition_spec(dst_spec, names)))


def _source_shards(
    x: jax.Array, plan: TransferPlan, world: Sequence[Any] | None
) -> dict[int, jax.Array]:
    """The source shard of each source device, checked against the plan."""
    if tuple(x.shape) != plan.shape or x.dtype.itemsize != plan.itemsize:
        raise AlpaError(
            f"transfer input is {x.dtype}{list(x.shape)}, the plan moves "
            f"{plan.itemsize}-byte elements of shape {list(plan.shape)}"
        )
    ids = {
        dev: i
        for i, dev in zip(plan.src.devices, local_devices_for(plan.src.devices, world), strict=True)
    }
    tiles = device_tiles(plan.shape, plan.src)
    shards: dict[int, jax.Array] = {}
    for shard in x.addressable_shards:
        device = ids.get(shard.device)
        if device is None:
            continue
        want = tuple(slice(lo, hi) for lo, hi in tiles[device])
        got = tuple(
            slice(s.start or 0, size if s.stop is None else s.stop)
            for s, size in zip(shard.index, plan.shape, strict=True)
        )
        if got != want:
            raise AlpaError(
                f"device {device} holds {got} of the transfer input, the plan's source spec "
                f"{plan.src.spec} puts {want} there"
            )
        shards[device] = shard.data
    missing = [d for d in plan.src.devices if d not in shards]
    if missing:
        raise AlpaError(f"the transfer input has no shard on source devices {missing}")
    return shards


def execute_transfer(
    x: jax.Array,
    plan: TransferPlan,
    axis_names: Sequence[str] | None = None,
    gather_program: Callable[[jax.Array], jax.Array] | None = None,
    *,
    all_gather: bool = True,
    world: Sequence[Any] | None = None,
) -> jax.Array:
    """Move ``x`` (sharded on the plan's source mesh as its source spec says)
    to the destination mesh, returning an array with the destination
    ``NamedSharding``. ``gather_program`` may pass a compiled
    :func:`all_gather_program` to reuse across calls. With ``all_gather=False``
    the result stays in the plan's receive spec (a driver's BROADCAST does
    the all-gather). Device ids of the plan index ``world`` (default
    ``jax.devices()``)."""
    shards = _source_shards(x, plan, world)
    src_tiles = device_tiles(plan.shape, plan.src)
    recv = plan.recv_layout
    recv_tiles = device_tiles(plan.shape, recv)
    dst_devices = dict(
        zip(plan.dst.devices, local_devices_for(plan.dst.devices, world), strict=True)
    )
    parts: dict[int, list[tuple[Any, jax.Array]]] = {d: [] for d in plan.dst.devices}
    for send in plan.sends:
        piece = shards[send.src][relative(send.box, src_tiles[send.src])]
        for d in send.dsts:
            parts[d].append((send.box, jax.device_put(piece, dst_devices[d])))

    def concatenate(blocks: list[jax.Array], axis: int) -> jax.Array:
        return jnp.concatenate(blocks, axis=axis)

    tiles = [assemble(recv_tiles[d], parts[d], concatenate) for d in plan.dst.devices]
    received = jax.make_array_from_single_device_arrays(
        plan.shape, layout_sharding(recv, axis_names, world), tiles
    )
    if not plan.gather or not all_gather:
        return received
    if gather_program is None:
        mesh = layout_mesh(plan.dst, axis_names, world)
        gather_program = all_gather_program(mesh, plan.recv_spec, plan.dst.spec, plan.gather)
    return gather_program(received)


class TilePlanTransport:
    """The in-process transport of the instruction interpreter
    (:mod:`alpa_ir.runtime.interpreter`) that honours the tile plans: SEND
    moves the tiles of a transfer's plan point-to-point onto the destination
    devices (its receive spec; the interpreter's BROADCAST all-gathers);
    RECV takes the array from the mailbox (None until sent). A transfer
    without a plan moves whole. Device ids of the plans index ``world``
    (default ``jax.devices()``; the host runtime passes the world's devices
    host by host and moves by this transport the transfers that stay
    inside its process)."""

    def __init__(self, program: StepProgram, world: Sequence[Any] | None = None) -> None:
        self.program = program
        self.world = world
        self.mailbox: dict[tuple[str, int | None], Any] = {}
        self.bytes_moved = 0
        self.src_shardings: dict[str, NamedSharding] = {}
        """Per transfer, its source layout (built once, not on every send)."""

    def send(self, transfer: Transfer, micro_batch: int | None, value: Any) -> None:
        plan = transfer.plan
        if plan is not None and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            # a PRNG key is replicated on both meshes (auto-sharding keeps keys
            # whole): copy it to the destination devices as it is
            dst_names = self.program.meshes[transfer.dst_mesh].axis_names
            value = jax.device_put(value, layout_sharding(plan.dst, dst_names, self.world))
            self.bytes_moved += plan.cross_bytes
        elif plan is not None:
            dst_names = self.program.meshes[transfer.dst_mesh].axis_names
            src = self.src_shardings.get(transfer.name)
            if src is None:
                src_names = self.program.meshes[transfer.src_mesh].axis_names
                src = layout_sharding(plan.src, src_names, self.world)
                self.src_shardings[transfer.name] = src
            # a value computed with another layout on its own mesh is first
            # laid out as the plan's source spec there (a no-op when it is)
            value = jax.device_put(value, src)
            value = execute_transfer(value, plan, dst_names, all_gather=False, world=self.world)
            self.bytes_moved += plan.cross_bytes
        self.mailbox[(transfer.name, micro_batch)] = value

    def recv(self, transfer: Transfer, micro_batch: int | None) -> Any | None:
        return self.mailbox.pop((transfer.name, micro_batch), None)
