"""Alpa's data loaders: batches placed where the step reads them, loaded ahead.

- :class:`DataLoader` ``(input_iter, placement_specs, prefetch_size)``: the
  batches of an iterator, each leaf placed on its mesh as its placement spec
  says, ``prefetch_size`` batches loaded and placed ahead of the one in use.
- :class:`MeshDriverDataLoader` ``(batch_size, num_samples, input_iter_func,
  placement_specs, prefetch_size, repeat)``: Alpa's loader for a dataset read
  by ranges (``input_iter_func(start, end, batch_size)`` yields
  ``dataset[start:end]`` a batch at a time). Alpa gives each host of the mesh
  a contiguous range of the dataset, so an epoch is the dataset's samples in
  another order; the global mesh here is one host (the driver's devices,
  :func:`~alpa_ir.hardware.device_mesh.get_global_physical_mesh`), which
  reads the whole range ``[0, num_batches * batch_size)`` in order. With
  ``repeat`` the epochs never end. On the ray backend the arrays are the
  driver's: the ray runtime sends whole inputs to its host workers.

A placement spec is Alpa's :class:`~alpa_ir.api.parallel_plan.PlacementSpec`
(an aval, the mesh's id and a ``ShardingSpec`` of ``jax.interpreters.pxla``'s
form: per dimension ``NoSharding`` or ``Chunked``, per mesh axis
``ShardedAxis`` or ``Replicated``) or a ``jax.ShapeDtypeStruct`` with a
sharding.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpa_ir.errors import AlpaError


def spec_sharding(spec: Any, devices: Sequence[Any], where: str) -> NamedSharding:
    """The sharding that an Alpa ``ShardingSpec`` over ``devices`` (in mesh
    order) means: one mesh axis per entry of its ``mesh_mapping``
    (``ShardedAxis(k)``: the k-th chunk of the tensor's dimensions, in order;
    ``Replicated(r)``: r copies), the devices laid out row-major over them."""
    chunks = []  # (tensor dimension, chunk count) per sharded axis index
    for dim, entry in enumerate(spec.sharding):
        if hasattr(entry, "chunks"):
            chunks += [(dim, int(c)) for c in entry.chunks]
        elif hasattr(entry, "size"):
            raise AlpaError(f"{where}: dimension {dim} is Unstacked; only Chunked is placed")
    shape, names_of_dim = [], collections.defaultdict(list)
    order_of_dim: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    for k, entry in enumerate(spec.mesh_mapping):
        name = f"a{k}"
        if hasattr(entry, "axis"):
            if not 0 <= entry.axis < len(chunks):
                raise AlpaError(f"{where}: ShardedAxis({entry.axis}) names no chunked dimension")
            dim, count = chunks[entry.axis]
            shape.append(count)
            order_of_dim[dim].append((entry.axis, name))
        elif hasattr(entry, "replicas"):
            shape.append(int(entry.replicas))
        else:
            raise AlpaError(
                f"{where}: mesh mapping entry {entry!r} is neither ShardedAxis nor Replicated"
            )
    for dim, named in order_of_dim.items():
        names_of_dim[dim] = [name for _, name in sorted(named)]
    if math.prod(shape) != len(devices):
        raise AlpaError(
            f"{where}: the sharding spec's mesh {shape} holds {math.prod(shape)} devices, the "
            f"mesh has {len(devices)}"
        )
    mesh = Mesh(
        np.array(devices, dtype=object).reshape(shape), tuple(f"a{k}" for k in range(len(shape)))
    )
    dims = [
        tuple(names_of_dim[d]) if names_of_dim.get(d) else None for d in range(len(spec.sharding))
    ]
    return NamedSharding(mesh, PartitionSpec(*dims))


def leaf_sharding(placement: Any, where: str) -> tuple[tuple[int, ...], Any, Any]:
    """(shape, dtype, sharding) of one placement spec (module docstring)."""
    from alpa_ir.hardware.device_mesh import get_global_physical_mesh

    if isinstance(placement, jax.ShapeDtypeStruct):
        if placement.sharding is None:
            raise AlpaError(f"{where}: the ShapeDtypeStruct has no sharding")
        return tuple(placement.shape), placement.dtype, placement.sharding
    if not all(hasattr(placement, f) for f in ("aval", "mesh_ids", "sharding_specs")):
        raise AlpaError(
            f"{where}: a placement spec is a PlacementSpec or a jax.ShapeDtypeStruct with a "
            f"sharding, got {type(placement).__name__}"
        )
    mesh = get_global_physical_mesh()
    assert mesh is not None
    if tuple(placement.mesh_ids) != (mesh.mesh_id,):
        raise AlpaError(
            f"{where}: the data loaders place on the global mesh (id {mesh.mesh_id}), got mesh "
            f"ids {list(placement.mesh_ids)}"
        )
    aval = placement.aval
    sharding = spec_sharding(placement.sharding_specs[0], mesh.devices, where)
    return tuple(aval.shape), aval.dtype, sharding


class DataLoader:
    """The batches of ``input_iter``, each leaf placed as ``placement_specs``
    says, ``prefetch_size`` batches ahead (module docstring)."""

    def __init__(
        self, input_iter: Iterable[Any], placement_specs: Any, prefetch_size: int = 1
    ) -> None:
        if (
            isinstance(prefetch_size, bool)
            or not isinstance(prefetch_size, int)
            or prefetch_size < 0
        ):
            raise AlpaError(f"prefetch_size must be a non-negative integer, got {prefetch_size!r}")
        self.placements = placements_of(placement_specs)
        self.input_iter = iter(input_iter)
        self.prefetch_size = prefetch_size
        self.queue: collections.deque[Any] = collections.deque()

    def place(self, batch: Any) -> Any:
        """One batch as global arrays placed by the specs."""
        leaves, tree = jax.tree.flatten(batch)
        if len(leaves) != len(self.placements):
            raise AlpaError(
                f"a batch has {len(leaves)} arrays; the placement specs give {len(self.placements)}"
            )
        placed = []
        for k, (x, (shape, dtype, sharding)) in enumerate(
            zip(leaves, self.placements, strict=True)
        ):
            x = np.asarray(x)
            if x.shape != shape:
                raise AlpaError(
                    f"batch array {k} has shape {list(x.shape)}, its spec {list(shape)}"
                )
            placed.append(jax.device_put(x.astype(dtype, copy=False), sharding))
        return jax.tree.unflatten(tree, placed)

    def enqueue(self, count: int) -> None:
        for batch in itertools.islice(self.input_iter, count):
            self.queue.append(self.place(batch))

    def __iter__(self) -> Iterator[Any]:
        self.enqueue(max(self.prefetch_size, 1))
        while self.queue:
            batch = self.queue.popleft()
            self.enqueue(1)
            yield batch


class MeshDriverDataLoader:
    """Alpa's loader of a dataset read by ranges (module docstring)."""

    def __init__(
        self,
        batch_size: int,
        num_samples: int,
        input_iter_func: Callable[[int, int, int], Iterable[Any]],
        placement_specs: Any,
        prefetch_size: int = 1,
        repeat: bool = False,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("num_samples", num_samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AlpaError(
                    f"MeshDriverDataLoader: {name} must be a positive integer, got {value!r}"
                )
        self.num_batches = num_samples // batch_size
        if self.num_batches == 0:
            raise AlpaError(
                f"MeshDriverDataLoader: {num_samples} samples make no batch of {batch_size}"
            )
        self.batch_size = batch_size
        self.input_iter_func = input_iter_func
        placements_of(placement_specs)  # a bad spec is named now, not at the first batch
        self.placement_specs = placement_specs
        self.prefetch_size = prefetch_size
        self.repeat = repeat

    def __iter__(self) -> Iterator[Any]:
        while True:
            epoch = self.input_iter_func(0, self.num_batches * self.batch_size, self.batch_size)
            loader = DataLoader(epoch, self.placement_specs, self.prefetch_size)
            yield from itertools.islice(loader, self.num_batches)
            if not self.repeat:
                return


def placements_of(placement_specs: Any) -> list[tuple[tuple[int, ...], Any, Any]]:
    """(shape, dtype, sharding) of every leaf of ``placement_specs``."""
    leaves = jax.tree.leaves(placement_specs, is_leaf=_is_placement)
    return [leaf_sharding(p, f"placement spec {k}") for k, p in enumerate(leaves)]


def _is_placement(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct) or hasattr(x, "sharding_specs")


__all__ = ["DataLoader", "MeshDriverDataLoader", "spec_sharding"]
