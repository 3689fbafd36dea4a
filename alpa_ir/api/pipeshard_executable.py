"""Compile a training step with :class:`~alpa_ir.api.pipeshard.PipeshardParallel` and run it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.api.executable import PlannedExecutable
from alpa_ir.api.memory_check import check_pipeline_memory, plan_memory_budget
from alpa_ir.api.pipeshard import (
    PipeshardParallel,
    StagePlacement,
)
from alpa_ir.api.pipeshard_pipeline import PipeshardPipeline
from alpa_ir.api.run_module import compile_module
from alpa_ir.backends.xla_pipeline import LocalPipelineExecutable
from alpa_ir.costs.costing_workers import StartedWorkers
from alpa_ir.dialects.pipeline import plan_stages
from alpa_ir.frontend.arguments import (
    CompiledSignature,
    StaticArgnums,
    StepArguments,
)
from alpa_ir.frontend.jaxpr_import import ImportedStep
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.hardware.memory_budget import MemoryBudget
from alpa_ir.ir.collection import rare_full_collections
from alpa_ir.ir.module_utils import main_function, num_ops, symbol_op
from alpa_ir.passmanager.pipeline_syntax import format_pipeline
from alpa_ir.pipeline.plan_memory import StagePeak
from alpa_ir.pipeline.step_partition import batch_leaves_of, warn_micro_batch_statistics
from alpa_ir.plugins.registry import PluginRegistry, default_registry
from alpa_ir.runtime.interpreter import CompiledFunction, RuntimeEvent
from alpa_ir.runtime.program import StepProgram


class PipeshardExecutable(PlannedExecutable):
    """A step compiled into pipeline stages on submeshes of the devices.

    ``module`` is the planned module: ``input_module`` (the step as imported)
    after every pass of ``pass_pipeline``, the last two being
    ``cross-mesh-resharding`` and ``emit-instructions``; ``program`` is its
    per-mesh instruction lists. A backend runs it (``runner``): on xla, one
    :class:`~alpa_ir.runtime.interpreter.MeshInterpreter` per mesh in this
    process (:mod:`alpa_ir.backends.xla_pipeline`); on ray, one actor per
    host, a mesh may span hosts (:mod:`alpa_ir.backends.ray_host_pipeline`).
    """

    def __init__(
        self,
        module: ModuleOp,
        signature: CompiledSignature,
        runner: Any,
        input_module: ModuleOp,
        pass_pipeline: str,
    ) -> None:
        super().__init__(module, signature, input_module, pass_pipeline)
        self.program: StepProgram = runner.program
        self.runner = runner
        self._local: LocalPipelineExecutable | None = (
            runner if isinstance(runner, LocalPipelineExecutable) else None
        )
        self.record_timeline = False
        """When true, each step records when every instruction ran (each RUN
        waits for its results), in this process or on the Ray workers, into
        :attr:`last_timeline`."""
        self.last_timeline: Any = None
        """The measured timeline of the last recorded step (a ``SimResult``);
        ``plot("timeline", ...)`` draws it beside the simulated one."""
        self.recorded_events: list[RuntimeEvent] = []
        """Every instruction of every step run with :attr:`record_timeline`
        (Alpa's trace, :meth:`get_stage_execution_info`)."""

    @property
    def remote(self) -> Any:
        """The Ray executable when the step runs on the ray backend, else None."""
        return None if self._local is self.runner else self.runner

    @property
    def functions(self) -> dict[str, CompiledFunction]:
        """Every stage function compiled for the local devices (on the ray
        backend compiled here on first use, for HLO text and input shardings)."""
        if self._local is None:
            self._local = LocalPipelineExecutable(self.module)
        return self._local.functions

    @property
    def placements(self) -> tuple[StagePlacement, ...]:
        """Each stage's layers and logical mesh, read from the module."""
        from alpa_ir.dialects.mesh import LogicalMeshOp

        out = []
        for stage in plan_stages(self.module):
            mesh = symbol_op(self.module, stage.mesh.root_reference.data, LogicalMeshOp)
            assert isinstance(mesh, LogicalMeshOp)
            first, last = (int(x) for x in stage.layers.get_values())
            out.append(StagePlacement(first, last, LogicalDeviceMesh.from_op(mesh)))
        return tuple(out)

    @property
    def num_micro_batches(self) -> int:
        return self.program.num_micro_batches

    @property
    def num_instructions(self) -> int:
        return sum(len(v) for v in self.program.instructions.values())

    def __call__(self, *args: Any) -> Any:
        flat = self.signature.flatten(args)
        runner = self.runner
        runner.record_events = self.record_timeline
        outputs = runner.run_flat(flat)
        if self.record_timeline:
            self.recorded_events.extend(runner.events)
            self.last_timeline = self._measured_timeline(runner.events)
        return self.signature.unflatten_outputs(outputs)

    def get_stage_execution_info(
        self,
    ) -> list[list[tuple[float, float, tuple[int, ...], tuple[int, ...]]]]:
        """Alpa's: per stage program (in :meth:`stage_function_names`' order),
        each run recorded since steps record their timeline
        (``global_config.collect_trace`` or :attr:`record_timeline`) as
        ``(start, stop, node_ids, devices)``: wall-clock seconds, the hosts
        and the device ids of its mesh."""
        names = self.stage_function_names()
        info: list[list[tuple[float, float, tuple[int, ...], tuple[int, ...]]]] = [
            [] for _ in names
        ]
        where = {name: self._run_place(name) for name in names}
        for event in self.recorded_events:
            if event.kind != "run" or event.target not in self.program.calls:
                continue
            name = self.program.calls[event.target].function
            if name in where:
                nodes, devices = where[name]
                info[names.index(name)].append((event.start, event.end, nodes, devices))
        return info

    def _run_place(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The hosts and device ids of the mesh stage program ``name`` runs on
        (one host, 0, on the local backend)."""
        from alpa_ir.hardware.device_mesh import function_mesh

        function = symbol_op(self.module, name, func.FuncOp)
        mesh = function_mesh(self.module, function)
        assert mesh is not None and mesh.devices is not None
        devices = tuple(mesh.devices)
        if self.remote is None:
            return (0,), devices
        from alpa_ir.runtime.ray_cluster import cluster_hosts

        host_of: list[int] = []
        for h, host in enumerate(cluster_hosts()):
            host_of += [h] * host.num_devices
        return tuple(sorted({host_of[d] for d in devices if d < len(host_of)})), devices

    def _measured_timeline(self, events: Sequence[RuntimeEvent]) -> Any:
        from alpa_ir.plots.measured import measured_timeline

        stage_of_function: dict[str, tuple[int, str]] = {}
        stage_of_mesh: dict[str, int] = {}
        meshes: list[str] = []
        for k, stage in enumerate(plan_stages(self.module)):
            meshes.append(stage.mesh.root_reference.data)
            stage_of_mesh.setdefault(stage.mesh.root_reference.data, k)
            for phase, name in stage.phase_functions():
                stage_of_function[name] = (k, phase)
        distinct = list(dict.fromkeys(meshes))
        mesh_of = [distinct.index(m) for m in meshes]
        return measured_timeline(events, self.program, stage_of_function, stage_of_mesh, mesh_of)

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

    def stage_mesh_names(self) -> list[str]:
        """The symbol of each stage's logical mesh, in stage order."""
        return [stage.mesh.root_reference.data for stage in plan_stages(self.module)]

    def stage_function_names(self) -> list[str]:
        """Every stage program's function in Alpa's order (that of its
        ``get_hlo_text``): the forward of each stage, then the backwards from
        the last stage to the first, then the apply-grad rounds of each stage
        (for two stages: forward 0, forward 1, backward 1, backward 0,
        apply-grad 0, apply-grad 1)."""
        run = {c.function for c in self.program.calls.values()}
        stages = [stage.phase_functions() for stage in plan_stages(self.module)]
        forward = [n for s in stages for phase, n in s if phase == "forward"]
        backward = [
            n
            for s in reversed(stages)
            for phase, n in s
            if phase in ("backward", "backward_weight")
        ]
        apply = [n for s in stages for phase, n in s if phase == "apply_grad"]
        return [n for n in forward + backward + apply if n in run]

    @property
    def stage_input_shard_specs(self) -> tuple[tuple[Any, ...], ...]:
        """Alpa's: per stage, the sharding spec the plan gave each of its inputs
        (the arguments of its forward, then of its apply-grad; None where none
        was given); ``PipeshardParallel(stage_input_shardings=...)`` takes them
        to plan another step with the same layouts."""
        from alpa_ir.pipeline.stage_specs import stage_input_specs

        return stage_input_specs(self.module)

    def get_hlo_text(self, status: Any = None) -> list[str]:
        """The HLO XLA compiled for each stage program, in Alpa's order (see
        :meth:`stage_function_names`); as lowered for ``HloStatus.UNOPTIMIZED``
        and ``SHARDING_ANNOTATED`` (Alpa's ``get_hlo_text(status)``)."""
        from alpa_ir.api.hlo_status import hlo_text, split_status

        _, which = split_status((), status)
        return [hlo_text(self._lowered(name), which) for name in self.stage_function_names()]

    def deferred_hlo_texts(self, name: str) -> list[str]:
        """The HLO of each program that completes a result of stage program
        ``name`` once per step (its sums over the mesh deferred past the
        micro-batches, :mod:`alpa_ir.pipeline.deferred_sums`), by result index."""
        compiled = self.functions[name]
        return [
            compiled.finish[k].lower(compiled.finish_inputs[k]).compile().as_text()  # type: ignore[attr-defined]
            for k in sorted(compiled.finish)
        ]

    def get_input_placement_specs(self) -> Any:
        """Alpa's name: where each input array lives (:meth:`get_input_shardings`,
        a ``NamedSharding`` on its stage's submesh per leaf)."""
        return self.get_input_shardings()

    def get_output_placement_specs(self) -> Any:
        """Where each output array comes back, as a pytree like the outputs: the
        ``NamedSharding`` (submesh and spec) the stage program that computes it
        returns it in; an input returned as it is stays where it lives."""
        inputs = jax.tree.leaves(
            self.get_input_shardings(), is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
        )
        produced: dict[str, Any] = {}
        leaves = []
        for value in self.program.outputs:
            if value.startswith("main:"):
                leaves.append(inputs[int(value.split(":")[1])])
                continue
            call = self.program.producer(value)
            assert call is not None
            index = call.results.index(value)
            finished = self.functions[call.function].finish_shardings
            if index in finished:  # a sum over the mesh deferred to once per step
                leaves.append(finished[index])
                continue
            if call.function not in produced:
                produced[call.function] = self._lowered(call.function).compile().output_shardings
            leaves.append(produced[call.function][index])
        return jax.tree.unflatten(self.out_tree, leaves)

    def _lowered(self, name: str) -> Any:
        """The stage program ``name`` lowered from its input shapes and shardings
        (a backward's running gradient sums first, as Alpa's)."""
        from alpa_ir.dialects.types import dtype_of, shape_of

        function = symbol_op(self.module, name, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        compiled = self.functions[name]
        avals = [
            jax.ShapeDtypeStruct(shape_of(t), dtype_of(t), sharding=s)
            for t, s in zip(function.function_type.inputs.data, compiled.in_shardings, strict=True)
        ]
        return compiled.run.lower(*compiled.acc_structs, *avals)  # type: ignore[attr-defined]

    def get_allocation_sizes(self) -> dict[str, int]:
        """Bytes one device of its mesh allocates for each stage program, by
        program name (XLA's memory analysis; see :meth:`stage_function_names`)."""
        from alpa_ir.api.executable import allocation_bytes

        return {
            name: allocation_bytes(self._lowered(name).compile())
            for name in self.stage_function_names()
        }

    def get_total_allocation_size(self) -> int:
        """Bytes one device allocates for the largest stage program
        (:meth:`get_allocation_sizes`): a device runs its stage's programs one
        at a time, and what they keep between them (weights, stashed
        activations) is counted in each program's arguments."""
        return max(self.get_allocation_sizes().values(), default=0)

    def hlo_files(self, *args: Any) -> dict[str, str]:
        """Each stage program's compiled HLO (no example arguments needed)."""
        del args
        names = self.stage_function_names()
        return {f"hlo/{n}.hlo": t for n, t in zip(names, self.get_hlo_text(), strict=True)}

    def why_text(self, top: int = 3) -> str:
        """The pipeline schedule (with the runner-up schedules when it was
        chosen), then per stage program its ``top`` largest communication
        terms, each with the op whose value it moves (and the user's line)."""
        from alpa_ir.api.why_plan import schedule_lines
        from alpa_ir.autosharding.comm_terms import sharding_terms
        from alpa_ir.hardware.device_mesh import function_mesh

        lines = schedule_lines(self.module)
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
        from alpa_ir.dialects.types import nbytes_of, shape_of

        placements = self.placements
        lines = [f"pipeline: {len(placements)} stages, {self.num_micro_batches} micro-batches"]
        for k, p in enumerate(placements):
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


@dataclass(frozen=True)
class PlannedPipeline:
    """A step planned into pipeline stages, before any backend compiles it
    (:func:`plan_pipeshard`)."""

    module: ModuleOp
    signature: CompiledSignature
    input_module: ModuleOp
    pass_pipeline: str
    statistics: tuple[Any, ...]
    budget: MemoryBudget
    backend: str
    registry: PluginRegistry

    def stage_peaks(self) -> tuple[StagePeak, ...]:
        """Predicted memory of each stage, on one device of its mesh."""
        from alpa_ir.pipeline.plan_memory import pipeline_memory

        return pipeline_memory(self.module, schedules=self.registry.schedules)


def compile_pipeshard(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: PipeshardParallel,
    *,
    donate_argnums: Sequence[int],
    batch_argnums: Sequence[int],
    static_argnums: StaticArgnums = (),
    registry: PluginRegistry | None = None,
    local_all_gather: bool = True,
) -> PipeshardExecutable:
    """Plan ``fn`` for ``args`` with ``method`` as one pass pipeline on the
    imported step (:func:`plan_pipeshard`), and compile the planned module for
    the method's backend. ``local_all_gather``: ``cross-mesh-resharding``'s
    option (Alpa's ``global_config.use_local_allgather``)."""
    planned = plan_pipeshard(
        fn,
        args,
        method,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
        static_argnums=static_argnums,
        registry=registry,
        local_all_gather=local_all_gather,
    )
    return pipeshard_executable(planned)


def pipeshard_executable(planned: PlannedPipeline) -> PipeshardExecutable:
    """The executable of a planned pipeline on its backend (the memory check first)."""
    module, registry = planned.module, planned.registry
    check_pipeline_memory(module, planned.budget, schedules=registry.schedules)  # before compiling
    runner = compile_module(module, backend=planned.backend, registry=registry)
    executable = PipeshardExecutable(
        module, planned.signature, runner, planned.input_module, planned.pass_pipeline
    )
    executable.pass_statistics = planned.statistics
    return executable


@rare_full_collections()  # importing and planning allocate millions of objects
def plan_pipeshard(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: PipeshardParallel,
    *,
    donate_argnums: Sequence[int],
    batch_argnums: Sequence[int],
    static_argnums: StaticArgnums = (),
    registry: PluginRegistry | None = None,
    local_all_gather: bool = True,
) -> PlannedPipeline:
    """Import ``fn`` for ``args`` and plan it with ``method``'s pass pipeline;
    nothing is compiled."""
    from alpa_ir.api.pipeshard_pipeline import resolve_pipeshard
    from alpa_ir.api.step_import import import_for_plan

    del donate_argnums  # buffers of a pipeline step are not donated yet
    pipeline = resolve_pipeshard(method, local_all_gather)
    registry = registry or default_registry()
    arguments, imported = import_for_plan(
        fn, args, pipeline.num_micro_batches, static_argnums=static_argnums,
        batch_argnums=batch_argnums, unroll_differentiated_loops=True, concatenated_outputs=True,
    )  # fmt: skip
    module = imported.module
    manual = method.manual_sharding_option
    if manual is not None and manual.in_axis_resources is not None:
        from alpa_ir.api.manual_sharding import annotate_user_axes

        annotate_user_axes(main_function(module), arguments.arrays, manual.in_axis_resources)
    # a large step's costing workers import the compiler while the layers are found
    with StartedWorkers(pipeline.early_workers(num_ops(main_function(module)))) as started:
        return _plan_imported(
            module, imported, arguments, pipeline, batch_argnums, registry, started
        )


def _plan_imported(
    module: ModuleOp,
    imported: ImportedStep,
    arguments: StepArguments,
    pipeline: PipeshardPipeline,
    batch_argnums: Sequence[int],
    registry: PluginRegistry,
    started: StartedWorkers,
) -> PlannedPipeline:
    """:func:`plan_pipeshard` after the import: the layer passes, then the plan's."""
    from alpa_ir.api.step_import import planned_signature
    from alpa_ir.ir.context import make_context
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.pipeline.stage_assignment import count_layers, is_layer_marker

    main = main_function(module)
    method, b = pipeline.method, pipeline.num_micro_batches
    budget = plan_memory_budget(method.device_memory, pipeline.backend, len(pipeline.devices))
    cluster = pipeline.planning_cluster(budget)
    if cluster is not None:  # what construct-stages plans on
        module.body.block.insert_op_before(cluster.to_op(), main)
    input_module = module.clone()
    num_inputs = len(main.args)
    marked = any(is_layer_marker(op) for op in main.body.block.ops)
    # verified once per pipeline (a failure is replayed to name the pass): per
    # pass, verification took a tenth of planning a 124M-parameter model
    layers = PassManager(
        registry,
        f"builtin.module({','.join(pipeline.layer_passes(marked))})",
        verify_each="end",
    )
    statistics = layers.execute(module, snapshot=input_module).statistics
    main = main_function(module)
    warn_micro_batch_statistics(main, batch_leaves_of(main), b)
    plan_passes = pipeline.plan_passes(count_layers(main), registry.schedules)
    plan = PassManager(registry, f"builtin.module({','.join(plan_passes)})", verify_each="end")
    ctx = make_context(registry)
    ctx.costing_workers = started
    statistics += plan.execute(module, ctx).statistics
    pass_pipeline = format_pipeline([*layers.passes, *plan.passes])  # one pipeline replays both
    draws_rows = len(main_function(module).args) > num_inputs  # draw-micro-batch-rows added them
    signature = planned_signature(arguments, imported, batch_argnums, draws_rows)
    return PlannedPipeline(
        module, signature, input_module, pass_pipeline, tuple(statistics), budget,
        pipeline.backend, registry,
    )  # fmt: skip
