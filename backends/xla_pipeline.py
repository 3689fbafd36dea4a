"""Outlined pipeline modules on the local devices, in this process.

``compile(module)`` reads the module's step
(:func:`~alpa_ir.runtime.program.step_program`: the instruction lists of
``emit-instructions``), compiles every mesh's stage functions as SPMD
programs on the mesh's local devices (:func:`~alpa_ir.backends.spmd.compile_mesh_functions`)
and gives each mesh a :class:`~alpa_ir.runtime.interpreter.MeshInterpreter`.
Calling the executable runs one step: the interpreters advance round-robin,
each until it waits for a transfer, and tensors move between meshes by
their tile plans (:class:`~alpa_ir.runtime.transfers.TilePlanTransport`).
The ``xla`` backend hands an outlined module (one with a ``pipeline.plan``)
to this executable; the ``ray`` backend runs the same lists on one actor per
mesh.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.backends.spmd import compile_mesh_functions
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.micro_batch_random import ROWS_NAME
from alpa_ir.runtime.devices import local_devices_for
from alpa_ir.runtime.interpreter import (
    CompiledFunction,
    MeshInterpreter,
    RuntimeEvent,
    gather_outputs,
    run_interleaved,
    split_inputs,
)
from alpa_ir.runtime.program import step_program
from alpa_ir.runtime.transfers import TilePlanTransport


class LocalPipelineExecutable:
    """An outlined pipeline step compiled for the local devices."""

    def __init__(self, module: ModuleOp) -> None:
        from alpa_ir.frontend.module_trees import tree_texts

        self.module = module
        self.program = step_program(module)
        main = main_function(module)
        self.trees = tree_texts(main)
        args = main.body.block.args
        self.rows_argument = bool(args) and args[-1].name_hint == ROWS_NAME
        """Whether ``@main`` takes the batch's row numbers (``draw-micro-batch-rows``)
        as its last argument, which the caller does not pass."""
        self.transport = TilePlanTransport(self.program)
        self.functions: dict[str, CompiledFunction] = {}
        self.interpreters: list[MeshInterpreter] = []
        for name, info in self.program.meshes.items():
            devices = local_devices_for(info.device_ids)
            jax_mesh, functions = compile_mesh_functions(module, self.program, name, devices)
            self.functions.update(functions)
            self.interpreters.append(
                MeshInterpreter(self.program, name, jax_mesh, functions, self.transport)
            )
        self.record_events = False
        """When true, each step records when every instruction ran into :attr:`events`."""
        self.events: list[RuntimeEvent] = []

    def __call__(self, *args: Any) -> Any:
        flat, _, _ = self.trees.flatten(args)
        return self.trees.outputs(args, self.run_flat(self.with_rows(flat)))

    def with_rows(self, flat: list[Any]) -> list[Any]:
        """``flat`` with the row numbers of the batch appended when ``@main`` takes them."""
        if not self.rows_argument or len(flat) == self.program.num_inputs:
            return flat
        batch = sorted(k for k in self.program.batch_args if k < len(flat))
        if not batch:
            raise AlpaError("@main takes micro_batch_rows but has no batch argument")
        return [*flat, np.arange(np.shape(flat[batch[0]])[0], dtype=np.int32)]

    def run_flat(self, flat: list[Any]) -> list[Any]:
        """Run one step on the flat inputs of ``@main``; returns its flat outputs."""
        if len(flat) != self.program.num_inputs:
            raise AlpaError(f"the step takes {self.program.num_inputs} arrays, got {len(flat)}")
        inputs = {m: split_inputs(self.program, flat, m) for m in self.program.meshes}
        for it in self.interpreters:
            it.events = [] if self.record_events else None
        values = run_interleaved(self.interpreters, inputs)
        if self.record_events:
            self.events = [e for it in self.interpreters for e in it.events or ()]
        return gather_outputs(self.program, flat, values)


class XlaPipelineBackend:
    """Runs outlined pipeline modules on the local devices (module docstring)."""

    name = "xla-pipeline"

    def compile(self, module: ModuleOp) -> LocalPipelineExecutable:
        return LocalPipelineExecutable(module)

    def execute(self, module: ModuleOp, *args: Any) -> Any:
        return self.compile(module)(*args)
