"""The ``ray`` backend: a planned module on the connected Ray cluster, one
actor per host.

Every Ray node that offers devices is a host; one
:class:`~alpa_ir.runtime.host_worker.HostWorker` per host owns all of its
devices, and the workers of an executable form one JAX world, so a mesh
may span hosts. A single-mesh module (``ShardParallel``) runs as one SPMD
program over its mesh (:mod:`alpa_ir.backends.ray_hosts`); an outlined
pipeline module runs its instruction lists on the hosts of each mesh, every
cross-mesh transfer one XLA program over both meshes
(:mod:`alpa_ir.backends.ray_host_pipeline`).

Needs ``alpa_ir.init(cluster="ray")`` first.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects.builtin import ModuleOp


class RayBackend:
    """Runs planned modules on the connected Ray cluster."""

    name = "ray"

    def compile(self, module: ModuleOp) -> Any:
        """An outlined pipeline module: :class:`~alpa_ir.backends.ray_host_pipeline.RayHostsPipelineExecutable`;
        a single-mesh module: :class:`~alpa_ir.backends.ray_hosts.RayHostsExecutable`."""
        from alpa_ir.dialects.pipeline import PlanOp
        from alpa_ir.ir.module_utils import top_level_ops

        if any(True for _ in top_level_ops(module, PlanOp)):
            from alpa_ir.backends.ray_host_pipeline import RayHostsPipelineExecutable

            return RayHostsPipelineExecutable(module)
        from alpa_ir.backends.ray_hosts import RayHostsExecutable

        return RayHostsExecutable(module)

    def execute(self, module: ModuleOp, *args: Any) -> Any:
        executable = self.compile(module)
        try:
            return executable(*args)
        finally:
            executable.close()
