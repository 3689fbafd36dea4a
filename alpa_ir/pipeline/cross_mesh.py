"""Cross-mesh resharding plans (Alpa §6), pure numpy.

A tensor produced on one logical mesh under one sharding spec is needed on
another mesh under another spec. Alpa plans this in two iterations:

1. *Tile correspondence*: each destination device's tile is cut into pieces,
   one per source tile it overlaps; a piece can be sent by any source device
   holding that tile (the source replicas). The plain plan sends every
   destination device its whole tile point-to-point.
2. *Local all-gather rewrite*: where the destination spec replicates a tile
   over some mesh axes, the tile crosses meshes once, split over those
   replicas, and the destination mesh all-gathers it over its fast local
   links. As in Alpa's implementation (``_rewrite_allgather_spec``) this is a
   rewrite of the destination spec: a replicated mesh axis is added to a
   tensor dimension it divides (the *receive spec*); the plan sends to the
   receive spec, and ``gather`` lists the (tensor dim, mesh axes) all-gathers
   that turn it into the destination spec. A replicated axis that divides no
   dimension stays replicated (its replicas each receive the piece).

Tiles are boxes of global indices, ``((start, stop), ...)`` per tensor axis.
Device ids are the ids of the meshes' ``devices`` (row-major mesh order).
Senders are balanced: among the source replicas of a piece, the one that has
sent the fewest bytes so far, ties broken round-robin; a destination device
that already holds the piece (overlapping meshes) takes it from itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError

Box = tuple[tuple[int, int], ...]
T = TypeVar("T")
"""A tile: ``(start, stop)`` of global indices per tensor axis."""


@dataclass(frozen=True)
class MeshLayout:
    """A tensor's layout on one logical mesh: its spec, the mesh shape and the
    device ids in row-major mesh order."""

    spec: ShardingSpec
    mesh_shape: tuple[int, ...]
    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh_shape", tuple(int(s) for s in self.mesh_shape))
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        if len(self.devices) != math.prod(self.mesh_shape):
            raise AlpaError(
                f"a mesh of shape {list(self.mesh_shape)} needs {math.prod(self.mesh_shape)} "
                f"devices, got {len(self.devices)}"
            )
        if len(set(self.devices)) != len(self.devices):
            raise AlpaError(f"mesh devices {list(self.devices)} repeat a device")
        if self.spec.partial:
            raise AlpaError(f"spec {self.spec} is a pending partial sum; it cannot cross meshes")
        try:
            self.spec.validate(mesh_rank=len(self.mesh_shape))
        except ValueError as exc:
            raise AlpaError(str(exc)) from None

    def replicated_axes(self) -> tuple[int, ...]:
        """Mesh axes (of size > 1) the spec does not use: the tile is replicated over them."""
        used = set(self.spec.used_axes())
        return tuple(a for a, n in enumerate(self.mesh_shape) if a not in used and n > 1)

    def replication(self) -> int:
        """How many devices hold each element."""
        return math.prod(self.mesh_shape[a] for a in self.replicated_axes())


def check_shape(shape: Sequence[int], layout: MeshLayout, what: str = "tensor") -> None:
    """Raise AlpaError unless ``layout.spec`` evenly tiles a tensor of ``shape``."""
    spec = layout.spec
    if spec.rank != len(shape):
        raise AlpaError(f"{what}: spec {spec} has rank {spec.rank}, the shape {list(shape)} not")
    for dim, size in enumerate(shape):
        n = spec.num_shards(layout.mesh_shape, dim)
        if size % n:
            raise AlpaError(
                f"{what}: spec {spec} splits axis {dim} of size {size} into {n} parts on mesh "
                f"{list(layout.mesh_shape)}, which does not divide it"
            )


def device_tiles(shape: Sequence[int], layout: MeshLayout) -> dict[int, Box]:
    """The tile each device of ``layout`` holds, by device id."""
    check_shape(shape, layout)
    tiles: dict[int, Box] = {}
    for flat, coord in enumerate(np.ndindex(*layout.mesh_shape)):
        box = []
        for dim, size in enumerate(shape):
            axes = layout.spec.dims[dim]
            index = 0
            for a in axes:  # major to minor
                index = index * layout.mesh_shape[a] + coord[a]
            step = size // layout.spec.num_shards(layout.mesh_shape, dim)
            box.append((index * step, (index + 1) * step))
        tiles[layout.devices[flat]] = tuple(box)
    return tiles


def intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return box if all(lo < hi for lo, hi in box) else None


def box_size(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def contains(outer: Box, inner: Box) -> bool:
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in zip(outer, inner, strict=True))


def relative(box: Box, origin: Box) -> tuple[slice, ...]:
    """``box`` as index slices into the tile ``origin``."""
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(box, origin, strict=True))


@dataclass(frozen=True)
class Piece:
    """A part of a destination tile lying in one source tile, and the source
    devices holding that tile (its replicas, in mesh order)."""

    box: Box
    sources: tuple[int, ...]


def tile_correspondence(
    shape: Sequence[int], src: MeshLayout, dst: MeshLayout
) -> dict[int, tuple[Piece, ...]]:
    """Each destination device's tile as pieces of source tiles (a partition of
    the tile; pieces in row-major order of their start)."""
    src_tiles = device_tiles(shape, src)
    holders: dict[Box, list[int]] = {}
    for device, box in src_tiles.items():
        holders.setdefault(box, []).append(device)
    result: dict[int, tuple[Piece, ...]] = {}
    for device, tile in device_tiles(shape, dst).items():
        pieces = []
        for box, devices in holders.items():
            part = intersect(tile, box)
            if part is not None:
                pieces.append(Piece(part, tuple(devices)))
        result[device] = tuple(sorted(pieces, key=lambda p: tuple(lo for lo, _ in p.box)))
    return result


@dataclass(frozen=True)
class Send:
    """One point-to-point send: the ``box`` of the tensor from source device
    ``src`` to destination devices ``dsts``; ``nbytes`` per destination."""

    src: int
    dsts: tuple[int, ...]
    box: Box
    nbytes: int


@dataclass(frozen=True)
class TransferPlan:
    """A cross-mesh resharding plan.

    The destination devices receive their tiles of ``recv_spec`` (pieces sent
    by ``sends``, concatenated in row-major order), then all-gather over
    ``gather`` — ``(tensor dim, mesh axes)`` pairs of the destination mesh —
    to reach ``dst.spec``. Without the local all-gather rewrite ``recv_spec``
    is ``dst.spec`` and ``gather`` is empty.
    """

    shape: tuple[int, ...]
    itemsize: int
    src: MeshLayout
    dst: MeshLayout
    recv_spec: ShardingSpec
    gather: tuple[tuple[int, tuple[int, ...]], ...]
    sends: tuple[Send, ...]

    @property
    def recv_layout(self) -> MeshLayout:
        return MeshLayout(self.recv_spec, self.dst.mesh_shape, self.dst.devices)

    def recv_tiles(self) -> dict[int, Box]:
        """The tile each destination device assembles from what it receives."""
        return device_tiles(self.shape, self.recv_layout)

    def received(self) -> dict[int, list[Send]]:
        """The sends each destination device receives, in plan order."""
        out: dict[int, list[Send]] = {d: [] for d in self.dst.devices}
        for send in self.sends:
            for d in send.dsts:
                out[d].append(send)
        return out

    def link_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes per (source device, destination device) link; a device
        sending to itself (overlapping meshes) moves nothing and is left out."""
        links: dict[tuple[int, int], int] = {}
        for send in self.sends:
            for d in send.dsts:
                if d != send.src:
                    links[(send.src, d)] = links.get((send.src, d), 0) + send.nbytes
        return links

    @property
    def cross_bytes(self) -> int:
        """Bytes crossing between the meshes in all."""
        return sum(self.link_bytes().values())

    def sent_bytes(self) -> dict[int, int]:
        """Bytes each source device sends to other devices."""
        out = {d: 0 for d in self.src.devices}
        for (s, _), n in self.link_bytes().items():
            out[s] += n
        return out

    @property
    def tensor_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


def all_gather_rewrite(
    shape: Sequence[int], dst: MeshLayout
) -> tuple[ShardingSpec, tuple[tuple[int, tuple[int, ...]], ...]]:
    """The receive spec of the local all-gather rewrite and its all-gathers.

    Each mesh axis over which ``dst.spec`` replicates (largest first) is
    appended, as the most minor axis, to the tensor dimension whose current
    tile extent it divides and that is largest (first such dimension on ties),
    so that the replicas of a tile each receive a distinct part of it. Axes
    that divide no dimension stay replicated.
    """
    check_shape(shape, dst)
    dims = [list(d) for d in dst.spec.dims]
    extent = [size // dst.spec.num_shards(dst.mesh_shape, i) for i, size in enumerate(shape)]
    for axis in sorted(dst.replicated_axes(), key=lambda a: (-dst.mesh_shape[a], a)):
        n = dst.mesh_shape[axis]
        fits = [i for i, e in enumerate(extent) if e % n == 0]
        if not fits:
            continue
        dim = max(fits, key=lambda i: (extent[i], -i))
        dims[dim].append(axis)
        extent[dim] //= n
    spec = ShardingSpec(tuple(tuple(d) for d in dims))
    return spec, gather_steps(spec, dst.spec)


def gather_steps(
    recv_spec: ShardingSpec, dst_spec: ShardingSpec
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The all-gathers taking ``recv_spec`` to ``dst_spec``: per tensor dim,
    the mesh axes ``recv_spec`` splits it over beyond ``dst_spec`` (which
    must be a prefix of them)."""
    steps = []
    for dim, (got, want) in enumerate(zip(recv_spec.dims, dst_spec.dims, strict=True)):
        if got[: len(want)] != want:
            raise AlpaError(f"receive spec {recv_spec} does not refine {dst_spec} on axis {dim}")
        if len(got) > len(want):
            steps.append((dim, got[len(want) :]))
    return tuple(steps)


class _SenderChooser:
    """Least-loaded choice among source replicas, ties broken round-robin."""

    def __init__(self, devices: Sequence[int]) -> None:
        self.load = {d: 0 for d in devices}
        self.turn: dict[tuple[int, ...], int] = {}

    def choose(self, candidates: tuple[int, ...], dst: int, nbytes: int) -> int:
        if dst in candidates:  # already there (overlapping meshes): a local copy
            return dst
        start = self.turn.get(candidates, 0)
        n = len(candidates)
        order = [candidates[(start + k) % n] for k in range(n)]
        best = min(order, key=lambda d: self.load[d])  # min keeps the first on ties
        self.turn[candidates] = (candidates.index(best) + 1) % n
        self.load[best] += nbytes
        return best


def plan_transfer(
    shape: Sequence[int],
    itemsize: int,
    src: MeshLayout,
    dst: MeshLayout,
    *,
    local_all_gather: bool = True,
) -> TransferPlan:
    """The plan moving a tensor of ``shape`` from ``src`` to ``dst``."""
    shape = tuple(int(s) for s in shape)
    check_shape(shape, src, "source")
    check_shape(shape, dst, "destination")
    if itemsize < 1:
        raise AlpaError(f"element size must be positive, got {itemsize}")
    if local_all_gather:
        recv_spec, gather = all_gather_rewrite(shape, dst)
    else:
        recv_spec, gather = dst.spec, ()
    recv = MeshLayout(recv_spec, dst.mesh_shape, dst.devices)
    chooser = _SenderChooser(src.devices)
    sends = []
    for device, pieces in tile_correspondence(shape, src, recv).items():
        for piece in pieces:
            nbytes = box_size(piece.box) * itemsize
            sender = chooser.choose(piece.sources, device, nbytes)
            sends.append(Send(sender, (device,), piece.box, nbytes))
    return TransferPlan(shape, itemsize, src, dst, recv_spec, gather, tuple(sends))


def coverage(shape: Sequence[int], boxes: Iterable[Box]) -> np.ndarray:
    """How many of ``boxes`` cover each element of a tensor of ``shape``."""
    count = np.zeros(tuple(shape), dtype=np.int64)
    for box in boxes:
        count[tuple(slice(lo, hi) for lo, hi in box)] += 1
    return count


def assemble(
    tile: Box,
    parts: Sequence[tuple[Box, T]],
    concatenate: Callable[[list[T], int], T],
) -> T:
    """The tile ``tile`` from ``parts`` (boxes with their arrays) that tile it
    as a product grid, as the pieces of a tile correspondence do: nested
    concatenation, outer axis first. Works for numpy and jax arrays alike."""
    if sum(box_size(b) for b, _ in parts) != box_size(tile) or not all(
        contains(tile, b) for b, _ in parts
    ):
        raise AlpaError(f"pieces {[b for b, _ in parts]} do not tile {tile}")

    def build(items: list[tuple[Box, T]], axis: int) -> T:
        if axis == len(tile) or len(items) == 1:
            if len(items) != 1:
                raise AlpaError(f"pieces overlap in tile {tile}")
            return items[0][1]
        groups: dict[int, list[tuple[Box, T]]] = {}
        for item in items:
            groups.setdefault(item[0][axis][0], []).append(item)
        blocks = [build(groups[start], axis + 1) for start in sorted(groups)]
        return blocks[0] if len(blocks) == 1 else concatenate(blocks, axis)

    return build(list(parts), 0)
