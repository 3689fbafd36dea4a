"""α/β of the link between Ray hosts, measured: ``alpa_ir.init(cluster="ray", probe=True)``.

On the cluster's host workers in one JAX world (those every executable
shares: :mod:`alpa_ir.backends.ray_host_pool`), runs the pipeline runtime's transfer program
(:mod:`alpa_ir.runtime.collective_transfers`) from a device of host0 to a
device of host1 for a small and a large tensor, and fits ``time = α +
bytes/bandwidth`` to the receiver's median times. The result is kept in
the cluster's key-value store (:func:`~alpa_ir.runtime.ray_cluster.record_link`),
where the automatic stage construction of a ``PipeshardParallel`` on the
ray backend finds it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from alpa_ir.backends.ray_hosts import DEFAULT_START_TIMEOUT_S, RayHostGroup
from alpa_ir.errors import AlpaError
from alpa_ir.runtime.ray_cluster import HostLink, cluster_hosts, record_link, require_ray

SMALL_BYTES = 4
LARGE_BYTES = 16 * 2**20
REPEAT = 5


def _time_transfers(worker: Any, sizes: list[int], repeat: int) -> list[float]:
    """Inside a host worker: the median seconds of moving ``sizes`` bytes from
    the first device of host0 to the first device of host1."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.pipeline.cross_mesh import MeshLayout, plan_transfer
    from alpa_ir.runtime.collective_transfers import collective_transfer
    from alpa_ir.runtime.host_worker import world_devices

    devices = world_devices()
    src = next(k for k, d in enumerate(devices) if d.process_index == 0)
    dst = next(k for k, d in enumerate(devices) if d.process_index == 1)
    whole = ShardingSpec(((),))
    medians = []
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        plan = plan_transfer(
            (n,), 4, MeshLayout(whole, (1,), (src,)), MeshLayout(whole, (1,), (dst,))
        )
        move = collective_transfer(plan, dict(enumerate(devices)), ("m0",), ("m0",), np.float32)
        x = None
        if jax.process_index() == 0:
            x = jax.device_put(jnp.ones(n, jnp.float32), move.src_sharding)
        times = []
        for _ in range(repeat + 1):  # the first compiles
            start = time.perf_counter()
            out = move(x)
            if out is not None:
                out.block_until_ready()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times[1:]))
    return medians


class _Probe(RayHostGroup):
    pass


def probe_hosts(timeout_s: float = DEFAULT_START_TIMEOUT_S) -> HostLink:
    """Measure the link between the first two hosts and record it (module docstring)."""
    ray = require_ray()
    hosts = cluster_hosts()
    if len(hosts) < 2:
        raise AlpaError(
            f"probing the link between hosts needs two hosts; the cluster has {len(hosts)}"
        )
    group = _Probe(ray)
    try:
        group.start_hosts(hosts[0].num_devices + 1, timeout_s)
        refs = {
            name: worker.__ray_call__.remote(_time_transfers, [SMALL_BYTES, LARGE_BYTES], REPEAT)
            for name, worker in group.workers.items()
        }
        times = group.wait(refs, timeout_s, "time the probe")[group.hosts[1].name]
    finally:
        group.close()
    small, large = times
    bandwidth = (LARGE_BYTES - SMALL_BYTES) / max(large - small, 1e-9)
    link = HostLink(bandwidth, small, True)
    record_link(link)
    return link
