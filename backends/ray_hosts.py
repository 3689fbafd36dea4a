"""The ``ray`` backend for a single-mesh (``ShardParallel``) module: one actor per host.

``RayHostsExecutable(module)`` runs on the hosts of the connected Ray cluster
(each Ray node that offers devices: ``alpa_cpu_device`` or ``GPU``; in a
cluster that declares neither, its CPUs), one
:class:`~alpa_ir.runtime.host_worker.HostWorker` on each, owning all of that
node's devices; the workers form one JAX world (the coordinator on the first
host) and are shared with the cluster's other executables
(:mod:`alpa_ir.backends.ray_host_pool`). The workers owning the mesh's
devices compile the planned step as one SPMD program over the mesh's global
devices (device ids counted host by host) and run it together: XLA's
collectives cross hosts (gloo on CPU, NCCL on GPU). A mesh may thus span
hosts, as Alpa's ``(n, M)`` meshes do; each returns its shards of the
outputs.

Failures never hang the driver: it waits in short slices, and a worker that
dies or fails stops all of them with an error naming the host.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.backends.ray_host_pool import find_world, stop_world, worker_name
from alpa_ir.backends.ray_workers import RayWorkerGroup
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.module_trees import tree_texts
from alpa_ir.hardware.device_mesh import function_mesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.runtime.host_pipeline import assemble_shards
from alpa_ir.runtime.host_worker import HostProgram, HostWorker
from alpa_ir.runtime.ray_cluster import Host, cluster_hosts, require_ray

DEFAULT_STEP_TIMEOUT_S = 300.0
DEFAULT_START_TIMEOUT_S = 120.0


def compile_host_program(
    module_text: str, devices: Sequence[Any], options: dict[str, Any]
) -> HostProgram:
    """The step of ``module_text`` as one SPMD program on ``devices`` (the mesh's,
    in mesh order), run by every host worker; ``options``: ``num_micro_batches``
    and ``batch_args`` (gradient accumulation, as on one host)."""
    from jax.sharding import Mesh

    from alpa_ir.backends.spmd import compile_spmd
    from alpa_ir.backends.xla import function_mesh
    from alpa_ir.ir.text import parse_module
    from alpa_ir.runtime.devices import mesh_axis_names

    module = parse_module(module_text)
    function = main_function(module)
    mesh_op = function_mesh(module, function)
    if mesh_op is None:
        raise AlpaError("the ray backend runs a planned module: @main has no mesh.mesh")
    jax_mesh = Mesh(np.array(devices, dtype=object).reshape(mesh_op.mesh_shape),
                    mesh_axis_names(mesh_op))  # fmt: skip
    return compile_spmd(
        module,
        function,
        jax_mesh,
        mesh_axis_names(mesh_op),
        num_micro_batches=int(options.get("num_micro_batches", 1)),
        batch_args=tuple(options.get("batch_args", ())),
    )


class RayHostGroup(RayWorkerGroup):
    """The cluster's host workers (one per Ray host, joined in one JAX world,
    shared by every executable: :mod:`alpa_ir.backends.ray_host_pool`), as
    one executable uses them: its programs are loaded under :attr:`key`;
    closing unloads them; a failure stops the whole world (a peer may be
    blocked in a collective), and the next executable starts it again."""

    group_name = "host workers"

    def __init__(self, ray: Any) -> None:
        super().__init__(ray)
        self.key = uuid.uuid4().hex
        """This executable's name on the workers."""
        self.hosts: list[Host] = []

    def start_hosts(self, num_devices: int, timeout_s: float) -> None:
        """The world's workers (all the cluster's hosts; started when no
        usable world runs), checked to hold ``num_devices`` devices; the
        hosts are in :attr:`hosts`, by process."""
        hosts_for(num_devices)  # a plan too big for the cluster names both numbers
        hosts = cluster_hosts()
        found = find_world(self.ray, hosts, timeout_s)
        if found is None:
            stop_world(self.ray, hosts)
            found = self._start_world(hosts, timeout_s)
        self.hosts, self.workers = hosts, found
        # an executable dropped without close() unloads its programs too
        self.release = weakref.finalize(self, unload, list(found.values()), self.key)
        self.release.atexit = False  # at exit the driver's Ray ends with the workers

    def _start_world(self, hosts: Sequence[Host], timeout_s: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = self.ray.remote(HostWorker)
        for host in hosts:
            env = {"JAX_PLATFORMS": "cuda" if host.resource == "GPU" else "cpu"}
            if host.resource != "GPU":
                env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={host.num_devices}"
            needs: dict[str, Any] = {"num_cpus": 0}
            if host.resource == "GPU":
                needs["num_gpus"] = host.num_devices
            elif host.resource == "CPU":
                needs["num_cpus"] = host.num_devices
            else:
                needs["resources"] = {host.resource: host.num_devices}
            self.workers[host.name] = actor.options(
                name=worker_name(host),
                runtime_env={"env_vars": env},
                scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False),
                **needs,
            ).remote(host.name, host.num_devices)
        kept = {name: worker.keep.remote(worker) for name, worker in self.workers.items()}
        first = next(iter(self.workers.values()))
        self.wait(kept, timeout_s, "start (are its node's devices held by another driver?)")
        coordinator = self.wait({hosts[0].name: first.coordinator_address.remote()},
                                 timeout_s, "start")[hosts[0].name]  # fmt: skip
        world = [h.node_id for h in hosts]
        joins = {
            name: worker.connect.remote(coordinator, len(self.workers), k, world)
            for k, (name, worker) in enumerate(self.workers.items())
        }
        self.wait(joins, timeout_s, "join the JAX world")
        return dict(self.workers)

    def close(self) -> None:
        """Done: the workers forget this executable's programs; they stay
        for the others (idempotent)."""
        release = getattr(self, "release", None)
        if release is not None:
            if self.broken:
                release.detach()  # the world is stopped: nothing to unload
            else:
                release()
        self.workers = {}

    def host_devices(self) -> dict[str, range]:
        """The plan's device ids each host owns (ids counted host by host)."""
        out, start = {}, 0
        for host in self.hosts:
            out[host.name] = range(start, start + host.num_devices)
            start += host.num_devices
        return out


def unload(workers: Sequence[Any], key: str) -> None:
    """Ask ``workers`` to forget the programs of the executable ``key``; nothing
    once the driver has left Ray (a call on a handle would start a new local
    Ray instance, which later steps would then take for the session's)."""
    import ray

    if not ray.is_initialized():
        return
    for worker in workers:
        try:
            worker.unload.remote(key)
        except Exception:  # the world or the driver's Ray stopped meanwhile
            pass


def hosts_for(num_devices: int) -> list[Host]:
    """The first hosts of the cluster that hold ``num_devices`` devices."""
    hosts = cluster_hosts()
    chosen, held = [], 0
    for host in hosts:
        if held >= num_devices:
            break
        chosen.append(host)
        held += host.num_devices
    if held < num_devices:
        total = sum(h.num_devices for h in hosts)
        raise AlpaError(
            f"the plan needs {num_devices} devices but the Ray cluster's {len(hosts)} hosts "
            f"have {total}"
        )
    return chosen


class RayHostsExecutable(RayHostGroup):
    """A single-mesh step on one Ray actor per host (module docstring)."""

    def __init__(
        self,
        module: ModuleOp,
        *,
        num_micro_batches: int = 1,
        batch_args: Sequence[int] = (),
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        super().__init__(require_ray())
        self.module = module
        self.trees = tree_texts(main_function(module))
        mesh = function_mesh(module, main_function(module))
        if mesh is None or mesh.devices is None:
            raise AlpaError("the ray backend runs a planned module: @main has no mesh")
        self.mesh = mesh
        self.num_micro_batches = num_micro_batches
        self.batch_args = tuple(batch_args)
        self.step_timeout_s = step_timeout_s
        try:
            self.start_hosts(max(mesh.devices) + 1, start_timeout_s)
            text = str(self.module)
            options = {"num_micro_batches": self.num_micro_batches, "batch_args": self.batch_args}
            loads = {
                name: w.load.remote(self.key, text, self.mesh.devices, options,
                                    compile_host_program)
                for name, w in self.workers.items()
            }  # fmt: skip
            here = self.wait(loads, start_timeout_s, "compile the step")
            self.mesh_workers = {name: w for name, w in self.workers.items() if here[name]}
            """The workers that own devices of the mesh: they run its steps."""
        except BaseException:
            self.close()
            raise

    def __call__(self, *args: Any) -> Any:
        flat, _, _ = self.trees.flatten(args)
        return self.trees.outputs(args, self.run_flat(flat))

    def run_flat(self, flat: Sequence[Any]) -> list[Any]:
        """One step on the flat inputs of ``@main`` (batch inputs as
        ``[micro-batches, ...]`` when accumulating); its flat outputs."""
        self.check_usable()
        if not self.workers:
            raise AlpaError("this executable is closed")
        host = [np.asarray(x) for x in flat]
        refs = {name: w.run_step.remote(self.key, host) for name, w in self.mesh_workers.items()}
        results = self.wait(refs, self.step_timeout_s, "finish the step")
        per_output = zip(*(results[name] for name in self.mesh_workers), strict=True)
        return [assemble_shards(list(parts)) for parts in per_output]
