"""The ``ray`` backend for an outlined pipeline module: one actor per host.

``RayHostsPipelineExecutable(module)`` reads the module's step
(:func:`~alpa_ir.runtime.program.step_program`), takes enough hosts of the
connected Ray cluster for the plan's devices (device ids counted host by
host, so a mesh may span hosts, as Alpa's ``(n, M)`` submeshes do), on the
cluster's :class:`~alpa_ir.runtime.host_worker.HostWorker` per host, one JAX
world shared with the cluster's other executables
(:mod:`alpa_ir.backends.ray_host_pool`), and sends each, once, the module, the instruction lists and their
global order (:func:`~alpa_ir.runtime.host_pipeline.global_order`). Each
worker compiles the stage functions and transfers that touch its devices;
a step then runs as XLA programs only: stage programs over each mesh's
devices, and each cross-mesh transfer as one program over both meshes
(:mod:`alpa_ir.runtime.collective_transfers`: gloo between processes on
CPU, NCCL on GPU), never through the driver or Ray's object store.

Calling the executable runs one step: the driver splits the batch arguments
into micro-batches, hands each host the arguments its meshes read, and puts
the outputs together from the shards the hosts return. A worker that dies or
fails stops all of them with an error naming its host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.backends.ray_hosts import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STEP_TIMEOUT_S,
    RayHostGroup,
)
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.module_trees import tree_texts
from alpa_ir.ir.module_utils import main_function
from alpa_ir.runtime.host_pipeline import KeyData, assemble_shards, global_order
from alpa_ir.runtime.interpreter import gather_outputs, split_inputs
from alpa_ir.runtime.program import StepProgram, step_program
from alpa_ir.runtime.ray_cluster import require_ray


def check_batch(program: StepProgram, host: list[Any]) -> None:
    """An error naming the argument whose batch does not split into micro-batches."""
    b = program.num_micro_batches
    for k in sorted(program.batch_args):
        if (
            b > 1
            and isinstance(host[k], np.ndarray)
            and (host[k].ndim == 0 or host[k].shape[0] % b)
        ):
            raise AlpaError(
                f"argument {k} has shape {list(host[k].shape)}: its batch dimension must "
                f"split into {b} micro-batches"
            )


class RayHostsPipelineExecutable(RayHostGroup):
    """A pipeline step on one Ray actor per host (module docstring)."""

    def __init__(
        self,
        module: ModuleOp,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        super().__init__(require_ray())
        self.module = module
        self.program = step_program(module)
        self.order = global_order(self.program)
        self.step_timeout_s = step_timeout_s
        self.trees = tree_texts(main_function(module))
        self.record_events = False
        """When true, each step records when every instruction ran on every
        host into :attr:`events` (wall-clock times)."""
        self.events: list[Any] = []
        needed = 1 + max(d for info in self.program.meshes.values() for d in info.device_ids)
        try:
            self.start_hosts(needed, start_timeout_s)
            self.meshes_of = self._load(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _load(self, timeout_s: float) -> dict[str, list[str]]:
        from alpa_ir.backends.spmd import compile_mesh_functions

        text = str(self.module)
        loads = {
            name: w.load_pipeline.remote(
                self.key, text, self.program, self.order, compile_mesh_functions
            )
            for name, w in self.workers.items()
        }
        return self.wait(loads, timeout_s, "compile its stages")

    def mesh_hosts(self) -> dict[str, list[str]]:
        """The hosts that run each mesh."""
        out: dict[str, list[str]] = {m: [] for m in self.program.meshes}
        for host in self.hosts:  # in host order
            for mesh in self.meshes_of[host.name]:
                out[mesh].append(host.name)
        return out

    def __call__(self, *args: Any) -> Any:
        flat, _, _ = self.trees.flatten(args)
        return self.trees.outputs(args, self.run_flat(flat))

    def run_flat(self, flat: list[Any]) -> list[Any]:
        """Run one step on the flat inputs of ``@main``; returns its flat outputs."""
        self.check_usable()
        if not self.workers:
            raise AlpaError("this executable is closed")
        if len(flat) != self.program.num_inputs:
            raise AlpaError(f"the step takes {self.program.num_inputs} arrays, got {len(flat)}")
        host = [KeyData.of(x) for x in flat]
        check_batch(self.program, host)
        inputs = {m: split_inputs(self.program, host, m) for m in self.program.meshes}
        refs = {
            name: worker.run_pipeline_step.remote(
                self.key, {m: inputs[m] for m in self.meshes_of[name]}, self.record_events
            )
            for name, worker in self.workers.items()
        }
        per_host = self.wait(refs, self.step_timeout_s, "finish the step")
        shards: dict[str, list[Any]] = {}
        events: list[Any] = []
        first_host = {mesh: hosts[0] for mesh, hosts in self.mesh_hosts().items()}
        for name, (outputs, recorded) in per_host.items():
            for value, parts in outputs.items():
                shards.setdefault(value, []).append(parts)
            # a mesh that spans hosts is timed by each: keep its first host's
            events.extend(e for e in recorded if first_host[e.mesh] == name)
        if self.record_events:
            self.events = events
        values = {v: assemble_shards(parts) for v, parts in shards.items()}
        return gather_outputs(
            self.program, flat, values
        )  # an argument returned as the caller gave it

    def write_checkpoint(
        self, path: str, number: int, arrays: dict[str, Any], manifest: Any, write: Any
    ) -> None:
        """Every host writes the checkpoint's ``arrays`` (numpy, split over all
        the hosts' devices) with ``write`` (orbax: each process its own shards)."""
        self.check_usable()
        refs = {
            name: w.write_checkpoint.remote(path, number, arrays, manifest, write)
            for name, w in self.workers.items()
        }
        self.wait(refs, self.step_timeout_s, "write its shards of the checkpoint")
