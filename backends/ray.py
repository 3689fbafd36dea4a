"""The ``ray`` backend: an outlined pipeline module on Ray, one actor per mesh.

``compile(module)`` reads the module's step (:func:`~alpa_ir.runtime.program.step_program`:
the ``pipeline.program`` instruction lists of ``emit-instructions``, or a
derived GPipe schedule), checks that the Ray cluster has the devices the
plan needs, starts one :class:`~alpa_ir.runtime.mesh_worker.MeshWorker` per
mesh with exactly that mesh's devices, and sends each its program once.
Calling the executable runs one step: the driver splits the batch arguments
into micro-batches, hands each worker the arguments its mesh reads, and
collects the outputs as numpy arrays.

Failures never hang the driver: it waits for the workers with ``ray.wait``
in short slices, so a worker that dies (``RayActorError``) or fails is
reported at once as an :class:`~alpa_ir.errors.AlpaError` naming its mesh,
and a step that outlives ``step_timeout_s`` is an error too. After a failure
the executable stops all its workers (a peer may be waiting for a transfer
that never comes) and refuses further calls.

Needs ``alpa_ir.init(cluster="ray")`` first.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.backends.ray_workers import RayWorkerGroup
from alpa_ir.errors import AlpaError
from alpa_ir.runtime.program import StepProgram, step_program

DEFAULT_STEP_TIMEOUT_S = 300.0
DEFAULT_START_TIMEOUT_S = 120.0


def check_devices(program: StepProgram, available: int, where: str) -> int:
    """The devices the plan needs; an error naming both numbers when ``where`` has fewer."""
    needed = len({d for info in program.meshes.values() for d in info.device_ids})
    if needed > available:
        raise AlpaError(f"the plan needs {needed} devices but {where} has {available}")
    return needed


class RayExecutable(RayWorkerGroup):
    """A pipeline step placed on Ray workers; call it with the step's arguments."""

    group_name = "mesh workers"

    def __init__(
        self,
        module: ModuleOp,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        from alpa_ir.frontend.module_trees import tree_texts
        from alpa_ir.ir.module_utils import main_function
        from alpa_ir.runtime.ray_cluster import device_resource, require_ray

        super().__init__(require_ray())
        self.module = module
        self.program = step_program(module)
        self.step_timeout_s = step_timeout_s
        self.trees = tree_texts(main_function(module))
        resource = device_resource()
        check_devices(self.program, resource.total, f"the Ray cluster ({resource.name})")
        self.record_events = False
        """When true, each step records when every instruction ran on every
        worker into :attr:`events` (wall-clock times)."""
        self.events: list[Any] = []
        self.steps = itertools.count()
        try:
            self._start(resource, start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, resource: Any, start_timeout_s: float) -> None:
        from alpa_ir.runtime.mesh_worker import MAX_CONCURRENCY, MeshWorker

        actor = self.ray.remote(MeshWorker)
        for name, info in self.program.meshes.items():
            env = {
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={info.size}",
                "JAX_PLATFORMS": "cpu",
            }
            self.workers[name] = actor.options(
                max_concurrency=MAX_CONCURRENCY,
                runtime_env={"env_vars": env},
                **resource.actor_options(info.size),
            ).remote(name, info.size)
        self.wait({m: w.ready.remote() for m, w in self.workers.items()}, start_timeout_s, "start")
        text = str(self.module)
        from alpa_ir.backends.spmd import compile_mesh_functions

        loads = {
            m: w.load.remote(
                text, self.program, self.workers, self.step_timeout_s, compile_mesh_functions
            )
            for m, w in self.workers.items()
        }
        self.wait(loads, start_timeout_s, "load its program")

    def short_name(self, key: str) -> str:
        return f"@{key}"

    def worker_name(self, key: str) -> str:
        return f"mesh worker of @{key}"

    def __call__(self, *args: Any) -> Any:

        flat, _, _ = self.trees.flatten(args)
        return self.trees.outputs(args, self.run_flat(flat))

    def run_flat(self, flat: list[Any]) -> list[Any]:
        """Run one step on the flat inputs of ``@main``; returns its flat outputs."""
        from alpa_ir.runtime.interpreter import gather_outputs, split_inputs

        self.check_usable()
        if len(flat) != self.program.num_inputs:
            raise AlpaError(f"the step takes {self.program.num_inputs} arrays, got {len(flat)}")
        host = [np.asarray(x) for x in flat]
        self._check_batch(host)
        step = next(self.steps)
        refs = {
            mesh: worker.run_step.remote(
                step, split_inputs(self.program, host, mesh), self.record_events
            )
            for mesh, worker in self.workers.items()
        }
        per_mesh = self.wait(refs, self.step_timeout_s, "finish the step")
        if self.record_events:
            recorded = {m: w.events.remote() for m, w in self.workers.items()}
            got = self.wait(recorded, self.step_timeout_s, "report its timeline")
            self.events = [e for events in got.values() for e in events]
        values = {k: v for outputs in per_mesh.values() for k, v in outputs.items()}
        return gather_outputs(self.program, host, values)

    def _check_batch(self, host: list[np.ndarray]) -> None:
        b = self.program.num_micro_batches
        for k in sorted(self.program.batch_args):
            if b > 1 and (host[k].ndim == 0 or host[k].shape[0] % b):
                raise AlpaError(
                    f"argument {k} has shape {list(host[k].shape)}: its batch dimension must "
                    f"split into {b} micro-batches"
                )


class RayBackend:
    """Runs outlined pipeline modules on the connected Ray cluster."""

    name = "ray"

    def compile(self, module: ModuleOp) -> Any:
        """An outlined pipeline module: one actor per mesh (:class:`RayExecutable`);
        a single-mesh module: one actor per host, the mesh may span hosts
        (:class:`~alpa_ir.backends.ray_hosts.RayHostsExecutable`)."""
        from alpa_ir.dialects.pipeline import PlanOp
        from alpa_ir.ir.module_utils import top_level_ops

        if any(True for _ in top_level_ops(module, PlanOp)):
            return RayExecutable(module)
        from alpa_ir.backends.ray_hosts import RayHostsExecutable

        return RayHostsExecutable(module)

    def execute(self, module: ModuleOp, *args: Any) -> Any:
        executable = self.compile(module)
        try:
            return executable(*args)
        finally:
            executable.close()
