"""The ``ray`` backend for a single-mesh (``ShardParallel``) module: one actor per host.

``RayHostsExecutable(module)`` takes the hosts of the connected Ray cluster in
order (each Ray node that offers devices: ``alpa_cpu_device`` or ``GPU``; in a
cluster that declares neither, its CPUs),
enough of them to hold the module's mesh, and starts one
:class:`~alpa_ir.runtime.host_worker.HostWorker` on each, owning all of that
node's devices. The workers join one JAX world (the coordinator on the first
host), compile the planned step as one SPMD program over the mesh's global
devices (device ids counted host by host) and run it together: XLA's
collectives cross hosts (gloo on CPU, NCCL on GPU). A mesh may thus span
hosts, as Alpa's ``(n, M)`` meshes do.

Failures never hang the driver: it waits in short slices, and a worker that
dies or fails stops all of them with an error naming the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.backends.ray_workers import RayWorkerGroup
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.module_trees import tree_texts
from alpa_ir.hardware.device_mesh import function_mesh
from alpa_ir.ir.module_utils import main_function
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
    """One :class:`HostWorker` per Ray host, enough hosts for ``num_devices``
    devices, joined in one JAX world (what both host runtimes share)."""

    group_name = "host workers"

    def start_hosts(self, num_devices: int, timeout_s: float) -> None:
        """Start the workers and join them; the hosts are in :attr:`hosts`."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.hosts = hosts_for(num_devices)
        actor = self.ray.remote(HostWorker)
        for host in self.hosts:
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
                runtime_env={"env_vars": env},
                scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False),
                **needs,
            ).remote(host.name, host.num_devices)
        first = next(iter(self.workers.values()))
        coordinator = self.wait({self.hosts[0].name: first.coordinator_address.remote()},
                                 timeout_s, "start (are its node's devices held by another "
                                 "executable? close it first)")[self.hosts[0].name]  # fmt: skip
        joins = {
            name: worker.connect.remote(coordinator, len(self.workers), k)
            for k, (name, worker) in enumerate(self.workers.items())
        }
        self.wait(joins, timeout_s, "join the JAX world")

    def host_devices(self) -> dict[str, range]:
        """The plan's device ids each host owns (ids counted host by host)."""
        out, start = {}, 0
        for host in self.hosts:
            out[host.name] = range(start, start + host.num_devices)
            start += host.num_devices
        return out


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
                name: w.load.remote(text, self.mesh.devices, options, compile_host_program)
                for name, w in self.workers.items()
            }
            self.wait(loads, start_timeout_s, "compile the step")
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
        host = [np.asarray(x) for x in flat]
        refs = {name: w.run_step.remote(host) for name, w in self.workers.items()}
        results = self.wait(refs, self.step_timeout_s, "finish the step")
        return list(results[self.hosts[0].name])
