"""The host workers of the connected Ray cluster, shared by every executable.

Alpa's users compile several functions on one cluster (a train step, an eval
step, ``create_state``), and Alpa keeps one set of mesh workers per cluster
for all of them. Here too: one :class:`~alpa_ir.runtime.host_worker.HostWorker`
per host of the cluster, all in one JAX world, started by the first
executable that needs them and found again by the next. They are Ray named
actors, named after their node (:func:`worker_name`), so the state is Ray's
own and ends with the driver (``alpa_ir.shutdown()``).

:func:`find_world` answers the running world when it is usable: a worker on
every host of the cluster, alive, and all joined to the world of exactly
these hosts. Otherwise (the first executable, a host lost or added, a worker
that died, a world stopped after a failure) the caller stops what is left
(:func:`stop_world`) and starts the world again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from alpa_ir.runtime.ray_cluster import Host

NAME_PREFIX = "alpa_ir.host_worker."
RELEASE_TIMEOUT_S = 30.0


def worker_name(host: Host) -> str:
    """The Ray actor name of ``host``'s worker (in the driver's namespace)."""
    return NAME_PREFIX + host.node_id


def named_worker(ray: Any, host: Host) -> Any | None:
    """The actor named for ``host``, when Ray knows one."""
    try:
        return ray.get_actor(worker_name(host))
    except ValueError:  # no such actor (never started, or dead)
        return None


def find_world(ray: Any, hosts: Sequence[Host], timeout_s: float) -> dict[str, Any] | None:
    """The workers of the running world by host name, when it is exactly
    ``hosts`` and every worker answers within ``timeout_s``; else None."""
    found = {}
    for host in hosts:
        worker = named_worker(ray, host)
        if worker is None:
            return None
        found[host.name] = worker
    want = tuple(h.node_id for h in hosts)
    refs = [w.world_nodes.remote() for w in found.values()]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        return None
    try:
        worlds = ray.get(refs)
    except Exception:  # a dead worker: the world is gone
        return None
    return found if all(tuple(w) == want for w in worlds) else None


def stop_world(ray: Any, hosts: Sequence[Host], workers: Sequence[Any] = ()) -> None:
    """Kill ``workers`` and every worker named for ``hosts``, and wait until
    their names are free again (a new world takes them)."""
    for worker in [*workers, *(named_worker(ray, h) for h in hosts)]:
        if worker is None:
            continue
        try:
            ray.kill(worker, no_restart=True)
        except Exception:  # already gone
            pass
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while any(named_worker(ray, h) is not None for h in hosts):
        if time.monotonic() > deadline:
            break  # starting the new world names the late one
        time.sleep(0.05)
