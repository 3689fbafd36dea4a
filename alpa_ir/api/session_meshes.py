"""The meshes a Ray session is given (Alpa's ``set_global_physical_mesh``).

Alpa keeps its global meshes in module globals; here they belong to the
session that ``alpa_ir.init(cluster="ray")`` starts or joins: they are kept
in that session's Ray key-value store under this driver's job
(:func:`~alpa_ir.runtime.ray_cluster.session_put`), so they end with
``shutdown()``, a second driver of the same cluster does not see them, and
nothing is held in this process. Without Ray there is no session to hold a
mesh: a method takes its mesh as ``devices=``.

A mesh is kept as its device ids, its (hosts, devices per host) shape and,
for a mesh of the cluster's hosts, the host ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh, PhysicalDeviceMesh
from alpa_ir.runtime.ray_cluster import session_get, session_put

PHYSICAL_MESH = "global_physical_mesh"
"""The session key of the mesh ``set_global_physical_mesh`` gave."""

VIRTUAL_MESH = "global_virtual_physical_mesh"
"""The session key of the mesh ``set_global_virtual_physical_mesh`` gave."""


@dataclass(frozen=True)
class SessionMesh:
    """A mesh as the session keeps it."""

    device_ids: tuple[int, ...]
    shape: tuple[int, int]
    host_ids: tuple[int, ...] | None = None
    """The cluster's hosts of a mesh cut by ``DeviceCluster.get_physical_mesh``;
    None for a mesh of this process's devices."""

    def logical_mesh(self) -> LogicalDeviceMesh:
        """The mesh as a method's default ``devices``: (hosts, devices per host)."""
        return LogicalDeviceMesh(self.shape, devices=self.device_ids)


def set_session_mesh(name: str, mesh: PhysicalDeviceMesh, where: str) -> None:
    """Keep ``mesh`` under ``name`` for this Ray session."""
    if not isinstance(mesh, PhysicalDeviceMesh):
        raise AlpaError(
            f"{where}: expected a physical mesh (DeviceCluster.get_physical_mesh() or "
            f"LocalPhysicalDeviceMesh), got {type(mesh).__name__}"
        )
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        raise AlpaError(
            f"{where}: the mesh is kept by the Ray session; call alpa_ir.init(cluster='ray') "
            "first (without Ray, give the mesh to the method as devices=)"
        )
    host_ids = getattr(mesh, "host_ids", None)
    record = {
        "device_ids": [int(d) for d in mesh.device_ids],
        "shape": [int(s) for s in mesh.shape],
        "host_ids": None if host_ids is None else [int(h) for h in host_ids],
    }
    session_put(name, json.dumps(record))


def session_mesh(name: str) -> SessionMesh | None:
    """The mesh kept under ``name`` in this Ray session, None when none is."""
    text = session_get(name)
    if text is None:
        return None
    record = json.loads(text)
    hosts = record.get("host_ids")
    return SessionMesh(
        tuple(int(d) for d in record["device_ids"]),
        (int(record["shape"][0]), int(record["shape"][1])),
        None if hosts is None else tuple(int(h) for h in hosts),
    )


def set_global_physical_mesh(mesh: PhysicalDeviceMesh) -> None:
    """Alpa's ``set_global_physical_mesh``: the mesh that methods given no
    ``devices`` plan on, and that ``get_global_physical_mesh`` returns, for the
    rest of this Ray session."""
    set_session_mesh(PHYSICAL_MESH, mesh, "set_global_physical_mesh")


def session_physical_mesh() -> SessionMesh | None:
    """The mesh ``set_global_physical_mesh`` gave this session, if any."""
    return session_mesh(PHYSICAL_MESH)


def set_global_virtual_physical_mesh(mesh: PhysicalDeviceMesh) -> None:
    """Alpa's ``set_global_virtual_physical_mesh``: the devices that pipelines
    (``PipeshardParallel``) given no ``devices`` cut their stages' submeshes
    from, and that ``get_global_virtual_physical_mesh`` returns, for the rest
    of this Ray session (a mesh is virtual here until a step runs on it)."""
    set_session_mesh(VIRTUAL_MESH, mesh, "set_global_virtual_physical_mesh")


def session_virtual_mesh() -> SessionMesh | None:
    """The mesh ``set_global_virtual_physical_mesh`` gave this session, if any."""
    return session_mesh(VIRTUAL_MESH)


__all__ = [
    "PHYSICAL_MESH",
    "VIRTUAL_MESH",
    "SessionMesh",
    "session_mesh",
    "session_physical_mesh",
    "session_virtual_mesh",
    "set_global_physical_mesh",
    "set_global_virtual_physical_mesh",
    "set_session_mesh",
]
