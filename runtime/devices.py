"""Local devices and JAX meshes for the plan's logical meshes: the one place
that maps device ids to JAX devices, mesh ops to ``jax.sharding.Mesh`` and
sharding specs to ``PartitionSpec`` (the backends and the runtime share it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError


def mesh_axis_names(mesh_op: LogicalMeshOp) -> tuple[str, ...]:
    if mesh_op.axis_names is not None:
        return tuple(a.data for a in mesh_op.axis_names.data)
    return tuple(f"m{k}" for k in range(len(mesh_op.mesh_shape)))


def local_devices_for(device_ids: Sequence[int], devices: Sequence[Any] | None = None) -> list[Any]:
    """The JAX devices with these ids: indices into ``devices`` (default
    ``jax.devices()``; a multi-process world passes its devices host by host)."""
    if devices is None:
        devices = jax.devices()
    needed = max(device_ids) + 1 if device_ids else 0
    if needed > len(devices):
        raise AlpaError(
            f"the plan needs {needed} devices but only {len(devices)} local devices exist"
        )
    return [devices[i] for i in device_ids]


def jax_mesh(mesh_op: LogicalMeshOp) -> Mesh:
    devices = np.array(local_devices_for(mesh_op.device_ids), dtype=object)
    return Mesh(devices.reshape(mesh_op.mesh_shape), mesh_axis_names(mesh_op))


def partition_spec(spec: ShardingSpec, names: Sequence[str]) -> PartitionSpec:
    if spec.partial:
        raise AlpaError(f"a partial value ({spec}) cannot be an input or output sharding")
    return PartitionSpec(
        *[
            None if not d else (names[d[0]] if len(d) == 1 else tuple(names[a] for a in d))
            for d in spec.dims
        ]
    )
