"""What a failed step lost: the Ray hosts of its plan that left the cluster.

A step on the ray backend fails within seconds when one of its host workers
dies (:class:`~alpa_ir.backends.ray_workers.RayWorkerGroup` stops the
others and raises an :class:`~alpa_ir.errors.AlpaError` whose context is
Ray's ``RayActorError``). Whether the worker's node went with it is Ray's
view, which lags: the GCS marks a node dead after its health checks fail
(about 15 s with Ray's defaults). :func:`wait_for_lost_hosts` polls that view
until a host of the plan is gone, so that planning again counts only the
devices that remain.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from alpa_ir.runtime.ray_cluster import Host, cluster_hosts

POLL_S = 0.2


def plan_hosts(executable: Any) -> list[Host]:
    """The Ray hosts an executable runs on; none on a local backend."""
    remote = getattr(executable, "remote", None)
    return list(getattr(remote, "hosts", None) or [])


def session_hosts(method: Any) -> list[Host]:
    """The Ray hosts a plan of ``method`` would run on now; none when it runs
    on the local devices."""
    from alpa_ir.api.runtime_api import session_backend

    if session_backend(getattr(method, "backend", None)) != "ray":
        return []
    return cluster_hosts()


def worker_died(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from or during) is Ray's
    report of a dead actor."""
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, RayActorError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def wait_for_lost_hosts(hosts: Sequence[Host], timeout_s: float) -> list[Host]:
    """The hosts among ``hosts`` that are no longer alive in the cluster,
    waiting up to ``timeout_s`` for at least one to be reported gone; empty
    when all of them are still alive then (a worker died on a live host)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {h.node_id for h in cluster_hosts()}
        lost = [h for h in hosts if h.node_id not in alive]
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(POLL_S)


def plan_devices(executable: Any) -> int:
    """How many devices an executable's plan uses (its mesh, or the union of
    its stage meshes)."""
    mesh = getattr(executable, "mesh", None)
    if mesh is not None and getattr(mesh, "devices", None) is not None:
        return len(mesh.devices)
    program = getattr(executable, "program", None)
    meshes = getattr(program, "meshes", None)
    if meshes:
        return len({d for info in meshes.values() for d in info.device_ids})
    return 0
