"""Compile a training step with :class:`~alpa_ir.pipeshard.PipeshardParallel` and run it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.device_mesh import LogicalDeviceMesh
from alpa_ir.dialects.pipeline import PlanOp, StageOp
from alpa_ir.frontend.arguments import CompiledSignature, StaticArgnums, compiled_signature
from alpa_ir.frontend.jaxpr_import import import_step
from alpa_ir.micro_batch_random import draw_micro_batch_rows
from alpa_ir.module_utils import main_function, symbol_op
from alpa_ir.pipeshard import (
    AutoLayerOption,
    AutoStageOption,
    ManualStageOption,
    PipeshardParallel,
    StagePlacement,
    _device_ids,
    manual_placements,
    shard_stage_function,
    uniform_placements,
)
from alpa_ir.plugins.registry import PluginRegistry, default_registry
from alpa_ir.runtime.interpreter import (
    CompiledFunction,
    MeshInterpreter,
    gather_outputs,
    run_interleaved,
    split_inputs,
)
from alpa_ir.runtime.program import StepProgram, step_program
from alpa_ir.runtime.transfers import TilePlanTransport
from alpa_ir.stage_specs import shard_in_call_order
from alpa_ir.step_partition import batch_leaves_of, warn_micro_batch_statistics


class PipeshardExecutable:
    """A step compiled into pipeline stages on submeshes of the local devices.

    ``module`` carries the plan after ``cross-mesh-resharding`` and
    ``emit-instructions``; ``program`` is its per-mesh instruction lists. On
    the xla backend one :class:`~alpa_ir.runtime.interpreter.MeshInterpreter`
    per mesh runs them in this process (round-robin, each until it waits for
    a transfer), moving tensors by their tile plans
    (:class:`~alpa_ir.runtime.transfers.TilePlanTransport`); on the ray
    backend ``remote`` runs them on one actor per mesh.
    """

    def __init__(
        self,
        module: ModuleOp,
        placements: Sequence[StagePlacement],
        program: StepProgram,
        functions: dict[str, CompiledFunction],
        signature: CompiledSignature,
    ) -> None:
        from alpa_ir.runtime.devices import local_devices_for

        self.module = module
        self.placements = tuple(placements)
        self.program = program
        self.signature = signature
        self.in_tree, self.out_tree = signature.in_tree, signature.out_tree
        self.functions = functions
        self.transport = TilePlanTransport(program)
        self.interpreters = []
        for name, info in program.meshes.items():
            devices = np.array(local_devices_for(info.device_ids), dtype=object)
            mesh = Mesh(devices.reshape(info.shape), info.axis_names)
            names = {i.target for i in program.instructions[name] if i.kind == "run"}
            mesh_functions = {f: functions[f] for f in names}
            self.interpreters.append(
                MeshInterpreter(program, name, mesh, mesh_functions, self.transport)
            )
        self.remote: Any = None
        """The Ray executable when the step runs on the ray backend."""
        self.record_timeline = False
        """When true, each in-process step records when every instruction ran
        (each RUN waits for its results) into :attr:`last_timeline`."""
        self.last_timeline: Any = None
        """The measured timeline of the last recorded step (a ``SimResult``);
        ``plot("timeline", ...)`` draws it beside the simulated one."""

    @property
    def num_micro_batches(self) -> int:
        return self.program.num_micro_batches

    @property
    def num_instructions(self) -> int:
        return sum(len(v) for v in self.program.instructions.values())

    def __call__(self, *args: Any) -> Any:
        flat = self.signature.flatten(args)
        if self.remote is not None:
            return self.signature.unflatten_outputs(self.remote.run_flat(flat))
        inputs = {m: split_inputs(self.program, flat, m) for m in self.program.meshes}
        for it in self.interpreters:
            it.events = [] if self.record_timeline else None
        values = run_interleaved(self.interpreters, inputs)
        if self.record_timeline:
            self.last_timeline = self._measured_timeline()
        return self.signature.unflatten_outputs(gather_outputs(self.program, flat, values))

    def _measured_timeline(self) -> Any:
        from alpa_ir.plots.measured import measured_timeline

        stage_of_function: dict[str, tuple[int, str]] = {}
        stage_of_mesh: dict[str, int] = {}
        plan = next(op for op in self.module.ops if isinstance(op, PlanOp))
        for k, ref in enumerate(plan.stages.data):
            stage = symbol_op(self.module, ref.root_reference.data, StageOp)
            assert isinstance(stage, StageOp)
            stage_of_mesh.setdefault(stage.mesh.root_reference.data, k)
            for phase, name in stage.phase_functions():
                stage_of_function[name] = (k, phase)
        events = [e for it in self.interpreters for e in it.events or ()]
        return measured_timeline(events, self.program, stage_of_function, stage_of_mesh)

    def get_input_shardings(self) -> Any:
        """Where each input array lives, as a pytree like the arguments: the
        ``NamedSharding`` of the first stage function that reads it (the
        whole batch, not a micro-batch); an input no stage reads stays on the
        first device. ``restore_checkpoint(path, target=executable)`` places
        the state (argument 0) by it."""
        from jax.sharding import SingleDeviceSharding

        first: dict[str, Any] = {}
        for call in self.program.calls.values():
            shardings = self.functions[call.function].in_shardings
            for value, sharding in zip(call.operands, shardings, strict=True):
                if value.startswith("main:"):
                    first.setdefault(value, sharding)
        default = SingleDeviceSharding(jax.devices()[0])
        leaves = [first.get(f"main:{k}", default) for k in range(len(self.signature.avals))]
        return jax.tree.unflatten(self.in_tree, leaves)

    def get_input_avals(self) -> Any:
        """A ``jax.ShapeDtypeStruct`` (shape, dtype and sharding) per input
        array, as a pytree like the arguments."""
        shardings = jax.tree.leaves(
            self.get_input_shardings(), is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
        )
        avals = [
            jax.ShapeDtypeStruct(shape, dtype, sharding=s)
            for (shape, dtype), s in zip(self.signature.avals, shardings, strict=True)
        ]
        return jax.tree.unflatten(self.in_tree, avals)

    def close(self) -> None:
        """Stop the Ray workers of a step on the ray backend."""
        if self.remote is not None:
            self.remote.close()

    input_module: ModuleOp | None = None
    """The step's module as imported, before any pass."""

    def stage_function_names(self) -> list[str]:
        """Every stage program's function, in stage order (forward, backward,
        apply-grad rounds within a stage)."""
        from alpa_ir.dialects.pipeline import PlanOp, StageOp
        from alpa_ir.module_utils import top_level_ops

        plan = next(op for op in top_level_ops(self.module, PlanOp) if isinstance(op, PlanOp))
        names: list[str] = []
        for ref in plan.stages.data:
            stage = symbol_op(self.module, ref.root_reference.data, StageOp)
            assert isinstance(stage, StageOp)
            names += [name for _, name in stage.phase_functions() if name in self.functions]
        return names

    def get_hlo_text(self) -> list[str]:
        """The HLO XLA compiled for each stage program, in stage order (see
        :meth:`stage_function_names`)."""
        from alpa_ir.ir_types import dtype_of, shape_of

        texts = []
        for name in self.stage_function_names():
            function = symbol_op(self.module, name, func.FuncOp)
            assert isinstance(function, func.FuncOp)
            compiled = self.functions[name]
            avals = [
                jax.ShapeDtypeStruct(shape_of(t), dtype_of(t), sharding=s)
                for t, s in zip(
                    function.function_type.inputs.data, compiled.in_shardings, strict=True
                )
            ]
            texts.append(compiled.run.lower(*avals).compile().as_text())  # type: ignore[attr-defined]
        return texts

    def dump_debug_info(self, folder: str) -> Any:
        """Write the imported module, the planned module, the plan and each stage
        program's HLO under ``folder`` (see :mod:`alpa_ir.debug_info`)."""
        from alpa_ir.debug_info import write_debug_info

        files = {"module.mlir": str(self.module), "plan.txt": self.plan_text()}
        if self.input_module is not None:
            files["input_module.mlir"] = str(self.input_module)
        for name, text in zip(self.stage_function_names(), self.get_hlo_text(), strict=True):
            files[f"hlo/{name}.hlo"] = text
        return write_debug_info(folder, files)

    def why_text(self, top: int = 3) -> str:
        """Per stage program, its ``top`` largest communication terms, each with
        the op whose value it moves (and the user's line)."""
        from alpa_ir.device_mesh import function_mesh
        from alpa_ir.why_plan import sharding_terms

        lines = []
        for name in self.stage_function_names():
            function = symbol_op(self.module, name, func.FuncOp)
            assert isinstance(function, func.FuncOp)
            mesh = function_mesh(self.module, function)
            assert mesh is not None
            terms = sharding_terms(function, tuple(mesh.shape), top)
            lines.append(f"{name} on mesh {list(mesh.shape)}:")
            lines += [f"  {t.text()}" for t in terms] or ["  no communication"]
        return "\n".join(lines)

    def plot(self, kind: str, path: str | os.PathLike[str]) -> Any:
        """Draw the plan into ``path`` (.png or .svg): ``timeline`` (the simulated
        schedule: a bar per run and per transfer), ``memory`` (per device over the
        schedule), ``devices`` (the stages' meshes on the local devices) or
        ``shardings`` (each stage's largest inputs as tiles over its mesh) or
        ``communication`` (per stage program, bytes per collective kind predicted
        by the plan beside those XLA compiled)."""
        if kind == "communication":
            from alpa_ir.plots.communication import draw_communication, pipeshard_rows

            return draw_communication(pipeshard_rows(self), path)
        from alpa_ir.plots.views import plot_module

        measured = self.last_timeline if kind == "timeline" else None
        return plot_module(self.module, kind, path, measured=measured)

    def plan_text(self, max_specs: int = 4) -> str:
        """The plan: stages, their layers, meshes and devices, and the
        shardings of each stage's largest forward inputs."""
        from alpa_ir.dialects.sharding import spec_of_value
        from alpa_ir.ir_types import nbytes_of, shape_of

        lines = [f"pipeline: {len(self.placements)} stages, {self.num_micro_batches} micro-batches"]
        for k, p in enumerate(self.placements):
            lines.append(
                f"  stage {k}: layers {p.first}..{p.last} on mesh {list(p.mesh.shape)} "
                f"devices {list(p.mesh.devices or ())}"
            )
            forward = symbol_op(self.module, f"stage{k}_forward", func.FuncOp)
            assert isinstance(forward, func.FuncOp)
            args = sorted(forward.args, key=lambda a: -nbytes_of(a.type))[:max_specs]
            for a in args:
                spec = spec_of_value(a, forward)
                lines.append(f"    input {list(shape_of(a.type))}: {spec}")
        return "\n".join(lines)


def _placements(
    method: PipeshardParallel, num_layers: int, devices: tuple[int, ...]
) -> list[StagePlacement]:
    option = method.stage_option
    if isinstance(option, ManualStageOption):
        return manual_placements(num_layers, devices, option)
    assert not isinstance(option, AutoStageOption)  # planned by _auto_placements
    return uniform_placements(num_layers, devices, option)


def _auto_placements(
    module: ModuleOp,
    method: PipeshardParallel,
    devices: tuple[int, ...],
    registry: PluginRegistry,
) -> list[StagePlacement]:
    """Run ``construct-stages`` on the ``local-cpu`` cluster (restricted to
    ``devices``' count), outline the module, and map its meshes to ``devices``."""
    import dataclasses

    from alpa_ir.clusters import ClusterLevel, local_cpu
    from alpa_ir.passes.construct_stages import construct_stages

    option = method.stage_option
    assert isinstance(option, AutoStageOption)
    base = local_cpu()
    level = base.levels[-1]
    cluster = dataclasses.replace(
        base,
        levels=(ClusterLevel(level.name, len(devices), level.bandwidth, level.latency),),
    )
    space = option.submesh_logical_shape_space.replace("_", "-")
    model = registry.get("stage_cost_models", option.stage_cost_model)()
    plan = construct_stages(
        module,
        cluster,
        num_micro_batches=method.num_micro_batches,
        schedule=method.pipeline_schedule,
        submesh_space=space,
        model=model,
        progress=False,
        remat=method.remat_layer,
    )
    _map_mesh_devices(module, devices)
    return [
        StagePlacement(
            s.first,
            s.last,
            LogicalDeviceMesh(
                s.mesh.shape,
                s.mesh.alpha,
                s.mesh.beta,
                tuple(devices[d] for d in s.mesh.devices or ()),
                s.mesh.axis_names,
            ),
        )
        for s in plan.stages
    ]


def _map_mesh_devices(module: ModuleOp, devices: tuple[int, ...]) -> None:
    """Rewrite the device ids of the module's meshes (planned on a cluster of
    ``len(devices)`` devices, ids 0..n-1) to the ids of ``devices``."""
    from alpa_ir.dialects.lax_params import ints_attr
    from alpa_ir.dialects.mesh import LogicalMeshOp
    from alpa_ir.module_utils import top_level_ops

    for op in top_level_ops(module, LogicalMeshOp):
        assert isinstance(op, LogicalMeshOp)
        op.properties["devices"] = ints_attr(tuple(devices[d] for d in op.device_ids))


def _draw_layers(module: ModuleOp, method: PipeshardParallel, registry: PluginRegistry) -> None:
    """Draw the imported step's layers: with :class:`AutoLayerOption` the
    ``cluster-operators`` pass cuts its forward pass; the user's boundaries
    (``mark_pipeline_boundary``) otherwise. Boundaries JAX did not mirror into
    the backward pass are mirrored (:mod:`alpa_ir.layer_mirroring`)."""
    from alpa_ir.layer_mirroring import merge_runs, mirror_layers, needs_mirroring
    from alpa_ir.pass_manager import PassManager
    from alpa_ir.pipeshard import ManualLayerOption
    from alpa_ir.stage_outline import is_layer_marker

    option = method.layer_option
    main = main_function(module)
    merge_runs(main)
    if option is None:  # the step's own boundaries, else Alpa's default
        marked = any(is_layer_marker(op) for op in main.body.block.ops)
        option = ManualLayerOption() if marked else AutoLayerOption(layer_num=2)
    passes = ["split-conditionals"]
    if isinstance(option, AutoLayerOption):
        passes.append(f"cluster-operators{{layers={option.layer_num} delta={option.eps}}}")
    PassManager(registry, f"builtin.module({','.join(passes)})").run(module)
    if needs_mirroring(main):
        mirror_layers(main)


def compile_pipeshard(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: PipeshardParallel,
    *,
    donate_argnums: Sequence[int],
    batch_argnums: Sequence[int],
    static_argnums: StaticArgnums = (),
    registry: PluginRegistry | None = None,
) -> PipeshardExecutable:
    """Plan and compile ``fn`` for ``args`` with ``method``."""
    from alpa_ir.parallel import check_micro_batches, trace_arguments
    from alpa_ir.pass_manager import PassManager
    from alpa_ir.stage_outline import StageSlice, count_layers, outline_stages

    del donate_argnums  # buffers of a pipeline step are not donated yet
    registry = registry or default_registry()
    devices = _device_ids(method.devices)
    b = check_micro_batches(method.num_micro_batches)
    arguments, traced = trace_arguments(fn, args, static_argnums, batch_argnums, b)
    imported = import_step(
        fn,
        *traced,
        static_argnums=arguments.static_argnums,
        batch_argnums=batch_argnums,
        unroll_differentiated_loops=True,
    )
    module = imported.module
    input_module = module.clone()
    rows = draw_micro_batch_rows(main_function(module), b)
    _draw_layers(module, method, registry)
    main = main_function(module)
    warn_micro_batch_statistics(main, batch_leaves_of(main), b)
    if isinstance(method.stage_option, AutoStageOption):
        placements = _auto_placements(module, method, devices, registry)
    else:
        placements = _placements(method, count_layers(main), devices)
        for k, p in enumerate(placements):
            module.body.block.insert_op_before(p.mesh.to_op(f"mesh{k}"), main)
        slices = [StageSlice(p.first, p.last, f"mesh{k}") for k, p in enumerate(placements)]
        outline_stages(module, slices, b, method.pipeline_schedule, method.remat_layer)
    compiled: dict[str, Any] = {}

    def shard(name: str) -> None:
        stage = int(name.split("_", 1)[0].removeprefix("stage"))
        mesh: LogicalDeviceMesh = placements[stage].mesh
        compiled[name] = shard_stage_function(
            module, name, mesh, method.auto_sharding_option, registry
        )

    shard_in_call_order(module, shard)
    PassManager(registry, "builtin.module(cross-mesh-resharding,emit-instructions)").run(module)
    functions = {name: CompiledFunction(c.run, c.in_shardings) for name, c in compiled.items()}
    signature = compiled_signature(arguments, imported.in_tree, imported.out_tree, imported.outputs)
    if rows:
        batch = arguments.dynamic_positions(batch_argnums)
        first = jax.tree.leaves(arguments.arrays[batch[0]])[0]
        signature = replace(signature, micro_batch_rows=int(np.shape(first)[0]))
    executable = PipeshardExecutable(module, placements, step_program(module), functions, signature)
    if method.backend == "ray":
        from alpa_ir.backends.ray import RayExecutable

        executable.remote = RayExecutable(module)
    executable.input_module = input_module
    return executable
