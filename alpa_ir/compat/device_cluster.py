"""Alpa's ``DeviceCluster``: the Ray cluster's hosts and their devices, and
meshes cut from them (``get_physical_mesh``, ``get_virtual_physical_mesh``).

Nothing is kept between calls: a ``DeviceCluster`` reads the hosts Ray has
now (:func:`~alpa_ir.runtime.ray_cluster.cluster_hosts`: the nodes that offer
devices, ordered by address), and ``get_global_cluster()`` makes one when
this process is connected to Ray (after ``init(cluster="ray")``), as Alpa's
returns the one its ``init`` made. The cluster's device ids are counted host
by host, as the ray backend counts them, so a mesh cut here is the ``devices``
of a method (``ShardParallel(devices=cluster.get_physical_mesh())``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from alpa_ir.api.session_meshes import (
    SessionMesh,
    session_physical_mesh,
    session_virtual_mesh,
    set_global_physical_mesh,
    set_global_virtual_physical_mesh,
)
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import PhysicalDeviceMesh
from alpa_ir.hardware.device_mesh import get_global_physical_mesh as _local_physical_mesh
from alpa_ir.runtime.ray_cluster import Host, cluster_hosts, require_ray

LocalPhysicalDeviceMesh = PhysicalDeviceMesh
"""Alpa's name of a mesh of this process's devices."""

DistributedArray = jax.Array
"""Alpa's array split over a mesh's devices: here a sharded ``jax.Array``
(what a parallelized step returns and ``preshard_dynamic_args`` places)."""


class ClusterMesh(PhysicalDeviceMesh):
    """Devices of some hosts of a :class:`DeviceCluster`: ``num_devices_per_host``
    on each of ``host_ids``, as a (hosts, devices per host) mesh; a method
    takes it as ``devices``. A virtual mesh (Alpa's ``VirtualPhysicalMesh``)
    is the same here: no mesh holds cluster resources until a step runs."""

    def __init__(
        self, cluster: DeviceCluster, host_ids: Sequence[int], num_devices_per_host: int
    ) -> None:
        self.host_ids = tuple(int(h) for h in host_ids)
        self.host_info = [cluster.host_info[h] for h in self.host_ids]
        self.num_devices_per_host = num_devices_per_host
        starts = [sum(cluster.all_host_num_devices[:h]) for h in range(cluster.num_hosts)]
        self.device_ids = tuple(
            starts[h] + d for h in self.host_ids for d in range(num_devices_per_host)
        )

    @property
    def num_hosts(self) -> int:
        return len(self.host_ids)

    @property
    def shape(self) -> tuple[int, int]:
        """Alpa's (hosts, devices per host)."""
        return (self.num_hosts, self.num_devices_per_host)

    @property
    def devices(self) -> list[object]:
        raise AlpaError(
            "a mesh of the Ray cluster's devices has no JAX devices in this process; "
            "give it to a method as devices="
        )

    def __repr__(self) -> str:
        return f"ClusterMesh(hosts={list(self.host_ids)}, devices={list(self.device_ids)})"


class DeviceCluster:
    """The Ray cluster's hosts that offer devices (Alpa's ``DeviceCluster``):
    ``num_nodes`` of them (default all), each counted with
    ``num_devices_per_node`` devices (default its own). ``namespace`` is
    Alpa's placement-group namespace; there are no placement groups here."""

    def __init__(
        self,
        num_nodes: int | None = None,
        num_devices_per_node: int | None = None,
        namespace: str | None = None,
    ) -> None:
        ray = require_ray()
        hosts = cluster_hosts()
        if not hosts:
            raise AlpaError("DeviceCluster: the Ray cluster has no host that offers devices")
        if num_nodes is not None:
            if num_nodes < 1:
                raise AlpaError(f"DeviceCluster: num_nodes must be at least 1, got {num_nodes}")
            hosts = hosts[:num_nodes]
        self.hosts: list[Host] = hosts
        self.all_host_num_devices = [h.num_devices for h in hosts]
        if num_devices_per_node is not None:
            short = [h.name for h in hosts if h.num_devices < num_devices_per_node]
            if short:
                raise AlpaError(
                    f"DeviceCluster: {', '.join(short)} have fewer than "
                    f"{num_devices_per_node} devices"
                )
            self.host_num_devices = [num_devices_per_node] * len(hosts)
        else:
            self.host_num_devices = list(self.all_host_num_devices)
        by_id = {n["NodeID"]: n for n in ray.nodes()}
        self.host_info: list[dict[str, Any]] = [by_id[h.node_id] for h in hosts]
        self.host_ips = [h.address for h in hosts]
        self.namespace = namespace

    @property
    def num_cpus(self) -> int:
        return sum(int(info.get("Resources", {}).get("CPU", 0)) for info in self.host_info)

    @property
    def num_devices(self) -> int:
        return sum(self.host_num_devices)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    def get_physical_mesh(
        self, host_ids: Sequence[int] | None = None, num_devices_per_host: int | None = None
    ) -> ClusterMesh:
        """``num_devices_per_host`` devices (default: those of the first host
        chosen) on each of ``host_ids`` (default: every host)."""
        ids = list(range(self.num_hosts)) if host_ids is None else [int(h) for h in host_ids]
        if not ids:
            raise AlpaError("get_physical_mesh: no hosts given")
        bad = [h for h in ids if not 0 <= h < self.num_hosts]
        if bad:
            raise AlpaError(f"get_physical_mesh: host ids {bad} not in 0..{self.num_hosts - 1}")
        per_host = num_devices_per_host or self.host_num_devices[ids[0]]
        short = [h for h in ids if self.host_num_devices[h] < per_host]
        if short:
            raise AlpaError(f"get_physical_mesh: hosts {short} have fewer than {per_host} devices")
        return ClusterMesh(self, ids, per_host)

    def get_virtual_physical_mesh(
        self, host_ids: Sequence[int] | None = None, num_devices_per_host: int | None = None
    ) -> ClusterMesh:
        """As :meth:`get_physical_mesh` (no mesh holds resources here until a step runs)."""
        return self.get_physical_mesh(host_ids, num_devices_per_host)

    def __repr__(self) -> str:
        return f"DeviceCluster(hosts={self.host_ips}, devices={self.host_num_devices})"


def get_global_cluster() -> DeviceCluster | None:
    """The connected Ray cluster as a :class:`DeviceCluster` (Alpa's
    ``get_global_cluster``), None when this process is not connected."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return DeviceCluster()


def get_global_virtual_physical_mesh() -> PhysicalDeviceMesh | None:
    """The mesh ``set_global_virtual_physical_mesh`` gave this Ray session;
    else all the connected cluster's devices as one mesh; None without Ray."""
    cluster = get_global_cluster()
    if cluster is None:
        return None
    kept = session_virtual_mesh()
    return cluster.get_virtual_physical_mesh() if kept is None else _kept_mesh(kept)


def _kept_mesh(kept: SessionMesh) -> PhysicalDeviceMesh:
    """A mesh the session keeps, as the user gave it: of the cluster's hosts,
    or of this process's devices."""
    if kept.host_ids is not None:
        return DeviceCluster().get_physical_mesh(kept.host_ids, kept.shape[1])
    return PhysicalDeviceMesh([jax.devices()[d] for d in kept.device_ids])


def get_global_physical_mesh(create_if_not_exist: bool = True) -> PhysicalDeviceMesh | None:
    """The mesh ``set_global_physical_mesh`` gave this Ray session (a
    :class:`ClusterMesh` of the same hosts, or the local devices it named);
    else all local devices (None with ``create_if_not_exist=False``)."""
    kept = session_physical_mesh()
    if kept is None:
        return _local_physical_mesh(create_if_not_exist)
    return _kept_mesh(kept)


def prefetch(dis_arrays: Any) -> None:
    """Alpa's ``prefetch``: start copying every array of the pytree
    ``dis_arrays`` to host memory, all at once, so that reading them later
    (``np.asarray``) does not wait for each in turn. A leaf that is not an
    array a step returned is a one-line error, as in Alpa."""
    leaves = jax.tree.leaves(dis_arrays)
    for k, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array):
            raise AlpaError(
                f"prefetch: leaf {k} is a {type(leaf).__name__}, not an array a step returned"
            )
    for leaf in leaves:
        leaf.copy_to_host_async()


def get_global_num_devices() -> int:
    """The devices steps run on: the Ray cluster's when connected, else this process's."""
    cluster = get_global_cluster()
    if cluster is not None:
        return cluster.num_devices
    import jax

    return len(jax.devices())


__all__ = [
    "ClusterMesh",
    "DeviceCluster",
    "DistributedArray",
    "LocalPhysicalDeviceMesh",
    "get_global_cluster",
    "get_global_num_devices",
    "get_global_physical_mesh",
    "get_global_virtual_physical_mesh",
    "prefetch",
    "set_global_physical_mesh",
    "set_global_virtual_physical_mesh",
]
