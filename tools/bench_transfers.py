"""Benchmark: moving one tensor between two hosts, three ways.

On two Ray nodes of this machine (``ray.cluster_utils.Cluster``, every node
on 127.0.0.1, one device each) it times moving a ``--mib`` MiB float32
tensor from the first host's device to the second's:

- ``xla-collective``: the two host workers (:class:`~alpa_ir.runtime.host_worker.HostWorker`)
  in one JAX world run the pipeline runtime's transfer program
  (:mod:`alpa_ir.runtime.collective_transfers`: one jitted ``shard_map``
  whose ``ppermute`` sends the first process's tile to the second; gloo on
  CPU, NCCL on GPU);
- ``object-store``: the first worker returns the array as a Ray object and
  the second fetches it (the path the per-mesh pipeline runtime took before
  transfers became XLA programs);
- ``device-put``: ``jax.device_put`` between two devices of one process (no
  host boundary: the floor).

Prints bytes/s per way (median of ``--repeat`` runs after one warm-up).
Run: ``python -m alpa_ir.tools.bench_transfers --mib 64``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.tools.cli_args import OneLineParser, positive_int


def _median_seconds(run: Callable[[], Any], repeat: int) -> float:
    run()  # warm-up: compiles, connects
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _collective_program(worker: Any, elements: int) -> str:
    """Inside a host worker: the pipeline runtime's transfer program
    (:func:`~alpa_ir.runtime.collective_transfers.collective_transfer`) of a
    replicated tensor from device 0 (host0) to device 1 (host1), and its input."""
    import jax
    import jax.numpy as jnp

    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.pipeline.cross_mesh import MeshLayout, plan_transfer
    from alpa_ir.runtime.collective_transfers import collective_transfer
    from alpa_ir.runtime.host_worker import world_devices

    whole = ShardingSpec(((),))
    plan = plan_transfer(
        (elements,), 4, MeshLayout(whole, (1,), (0,)), MeshLayout(whole, (1,), (1,))
    )
    worker.move = collective_transfer(
        plan, dict(enumerate(world_devices())), ("m0",), ("m0",), np.float32
    )
    worker.x = None
    if jax.process_index() == 0:
        worker.x = jax.device_put(jnp.ones(elements, jnp.float32), worker.move.src_sharding)
    return "ready"


def _collective_step(worker: Any) -> int:
    out = worker.move(worker.x)
    if out is not None:
        out.block_until_ready()
    return 0


def bench(mib: int, repeat: int) -> dict[str, float]:
    """Bytes per second of each way (module docstring)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import jax
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from alpa_ir.runtime.host_worker import HostWorker

    nbytes = mib * 2**20
    elements = nbytes // 4
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
        actor = ray.remote(HostWorker)
        workers = [
            actor.options(
                runtime_env={"env_vars": env}, num_cpus=1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(f"host{k}", 1)
            for k, node in enumerate(nodes)
        ]  # fmt: skip
        coordinator = ray.get(workers[0].coordinator_address.remote())
        ray.get([w.connect.remote(coordinator, 2, k) for k, w in enumerate(workers)])
        ray.get([w.__ray_call__.remote(_collective_program, elements) for w in workers])
        collective = _median_seconds(
            lambda: ray.get([w.__ray_call__.remote(_collective_step) for w in workers]), repeat
        )

        def produce(worker: Any) -> np.ndarray:
            return np.ones(elements, np.float32)

        def consume(worker: Any, x: np.ndarray) -> int:
            return int(x.shape[0])

        def fetch_seconds() -> float:
            ref = workers[0].__ray_call__.remote(produce)
            ray.wait([ref])  # made and stored on the first host: not timed
            start = time.perf_counter()
            ray.get(workers[1].__ray_call__.remote(consume, ref))
            return time.perf_counter() - start

        fetch_seconds()  # warm-up
        store = statistics.median(fetch_seconds() for _ in range(repeat))
    finally:
        ray.shutdown()
        cluster.shutdown()
    local = jax.devices()
    x = jax.device_put(np.ones(elements, np.float32), local[0])
    if len(local) < 2:
        raise AlpaError("the device-put floor needs two devices in this process (XLA_FLAGS)")
    target = local[1]
    put = _median_seconds(
        lambda: jax.device_put(x, target, may_alias=False).block_until_ready(), repeat
    )
    return {
        "xla-collective": nbytes / collective,
        "object-store": nbytes / store,
        "device-put": nbytes / put,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_transfers", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--mib", type=positive_int, default=64, help="tensor size in MiB")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed runs per way")
    args = parser.parse_args(argv)
    # two devices in this process for the device-put floor (before jax starts)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    rates = bench(args.mib, args.repeat)
    print(f"moving {args.mib} MiB from one host to another (median of {args.repeat}):")
    for way, rate in rates.items():
        print(f"  {way:15s} {rate / 2**30:8.2f} GiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
