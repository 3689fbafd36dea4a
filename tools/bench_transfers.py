"""Benchmark: moving one tensor between two hosts, three ways.

On two Ray nodes of this machine (``ray.cluster_utils.Cluster``, every node
on 127.0.0.1, one device each) it times moving a ``--mib`` MiB float32
tensor from the first host's device (the head node) to the second's:

- ``xla-collective``: the two host workers (:class:`~alpa_ir.runtime.host_worker.HostWorker`)
  in one JAX world run the pipeline runtime's transfer program
  (:mod:`alpa_ir.runtime.collective_transfers`: one jitted ``shard_map``
  whose ``ppermute`` sends the first process's tile to the second; gloo on
  CPU, NCCL on GPU);
- ``object-store``: one worker returns the array as a Ray object and the
  other fetches it (the path the per-mesh pipeline runtime took before
  transfers became XLA programs), each way: from the head node's store and
  from the other's (on one machine the two differ by an order of magnitude);
- ``device-put``: ``jax.device_put`` between two devices of one process (no
  host boundary: the floor).

Prints bytes/s per way (median of ``--repeat`` runs after one warm-up) and
the collectives of the compiled transfer program. With ``--gpus`` each node
declares one GPU and its worker runs there (``JAX_PLATFORMS=cuda``), so the
transfer runs on NCCL; a transfer that fails or hangs (NCCL refuses two
ranks on one GPU, as on a machine with a single GPU) is reported with its
error and the other ways are still measured.
Run: ``python -m alpa_ir.tools.bench_transfers --mib 64``.
"""

from __future__ import annotations

import argparse
import os
import re
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
    shape = jax.ShapeDtypeStruct((2, elements), jnp.float32)
    hlo = worker.move.program.trace(shape).lower().compile().as_text()
    ops = sorted({m for m in _COLLECTIVE.findall(hlo)})
    return f"{jax.devices()[0].platform}: {', '.join(ops) or 'no collective'}"


_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)"
                         r"(?:-start|-done)?\(")  # fmt: skip


def _collective_step(worker: Any) -> int:
    out = worker.move(worker.x)
    if out is not None:
        out.block_until_ready()
    return 0


def _collective_seconds(
    group: Any, elements: int, repeat: int, timeout_s: float
) -> tuple[float | None, str]:
    """Median seconds of the transfer program on the group's two host
    workers, and its platform and collectives, or why it did not run (a
    failure or a deadline stops the workers: ``RayWorkerGroup.wait``)."""
    workers = dict(group.workers)
    try:
        first = group.wait({"host0": workers["host0"].coordinator_address.remote()},
                           timeout_s, "start")["host0"]  # fmt: skip
        joins = {k: w.connect.remote(first, 2, i) for i, (k, w) in enumerate(workers.items())}
        group.wait(joins, timeout_s, "join the JAX world")
        programs = {k: w.__ray_call__.remote(_collective_program, elements)
                    for k, w in workers.items()}  # fmt: skip
        what = group.wait(programs, timeout_s, "compile the transfer")["host0"]

        def step() -> None:
            refs = {k: w.__ray_call__.remote(_collective_step) for k, w in workers.items()}
            group.wait(refs, timeout_s, "run the transfer")

        return _median_seconds(step, repeat), what
    except AlpaError as err:
        return None, f"failed: {err}"


def bench(mib: int, repeat: int, gpus: bool = False, timeout_s: float = 120.0) -> dict[str, Any]:
    """Bytes per second of each way (module docstring; None for a way that
    failed) and, under ``program``, what the transfer program ran on."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import jax
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from alpa_ir.backends.ray_workers import RayWorkerGroup
    from alpa_ir.runtime.host_worker import HostWorker

    nbytes = mib * 2**20
    elements = nbytes // 4
    node = {"num_cpus": 2, "num_gpus": 1 if gpus else 0}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    cluster.add_node(**node)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        head = cluster.head_node.node_id  # host0: the head node, host1 the other
        nodes = sorted((n["NodeID"] for n in ray.nodes() if n["Alive"]), key=lambda n: n != head)
        env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
        if gpus:
            env = {"JAX_PLATFORMS": "cuda"}
        actor = ray.remote(HostWorker)

        def start_workers() -> dict[str, Any]:
            return {
                f"host{k}": actor.options(
                    runtime_env={"env_vars": env}, num_cpus=1, num_gpus=1 if gpus else 0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(f"host{k}", 1)
                for k, node in enumerate(nodes)
            }  # fmt: skip

        group = RayWorkerGroup(ray)
        group.workers = start_workers()
        collective, program = _collective_seconds(group, elements, repeat, timeout_s)
        if collective is None:  # the failure stopped the workers: new ones for the store
            group.workers = start_workers()
        workers = list(group.workers.values())

        def produce(worker: Any) -> np.ndarray:
            return np.ones(elements, np.float32)

        def consume(worker: Any, x: np.ndarray) -> int:
            return int(x.shape[0])

        def fetch_seconds(src: Any, dst: Any) -> float:
            ref = src.__ray_call__.remote(produce)
            ray.wait([ref])  # made and stored on the source host: not timed
            start = time.perf_counter()
            ray.get(dst.__ray_call__.remote(consume, ref))
            return time.perf_counter() - start

        stores = {}  # two local nodes differ by direction (the head's store serves slowly)
        for name, (src, dst) in {"head->worker": workers, "worker->head": workers[::-1]}.items():
            fetch_seconds(src, dst)  # warm-up
            stores[name] = statistics.median(fetch_seconds(src, dst) for _ in range(repeat))
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
        "xla-collective": None if collective is None else nbytes / collective,
        **{f"object-store {k}": nbytes / v for k, v in stores.items()},
        "device-put": nbytes / put,
        "program": program,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_transfers", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--mib", type=positive_int, default=64, help="tensor size in MiB")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed runs per way")
    parser.add_argument(
        "--gpus", action="store_true",
        help="each node declares one GPU and its worker runs on it (NCCL); the device-put "
        "floor stays on this process's CPU devices",
    )  # fmt: skip
    parser.add_argument(
        "--timeout-s", type=positive_int, default=120,
        help="give up on the transfer after this many seconds (a refused NCCL rank's peer waits)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    # two devices in this process for the device-put floor (before jax starts)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    rates = bench(args.mib, args.repeat, args.gpus, args.timeout_s)
    program = rates.pop("program")
    print(f"moving {args.mib} MiB from one host to another (median of {args.repeat}):")
    for way, rate in rates.items():
        shown = f"{rate / 2**30:8.2f} GiB/s" if rate is not None else "     n/a"
        print(f"  {way:26s} {shown}" + (f"   ({program})" if way == "xla-collective" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
