"""Compile a training step with :class:`~alpa_ir.api.pipeshard.PipeshardParallel` and run it."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.api.executable import PlannedExecutable
from alpa_ir.api.memory_check import check_pipeline_memory, plan_memory_budget
from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    AutoStageOption,
    ManualLayerOption,
    ManualStageOption,
    PipeshardParallel,
    StagePlacement,
    _device_ids,
    manual_placements,
    uniform_placements,
)
from alpa_ir.api.run_module import compile_module
from alpa_ir.backends.xla_pipeline import LocalPipelineExecutable
from alpa_ir.costs.costing_workers import StartedWorkers
from alpa_ir.dialects.pipeline import plan_stages
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import (
    CompiledSignature,
    StaticArgnums,
    StepArguments,
    check_micro_batches,
    compiled_signature,
    trace_arguments,
)
from alpa_ir.frontend.jaxpr_import import ImportedStep, import_step
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.hardware.memory_budget import MemoryBudget
from alpa_ir.ir.collection import rare_full_collections
from alpa_ir.ir.module_utils import main_function, num_ops, symbol_op
from alpa_ir.passmanager.pipeline_syntax import format_pipeline
from alpa_ir.pipeline.plan_memory import StagePeak
from alpa_ir.pipeline.schedule_kinds import SPLIT_SCHEDULES
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
            self.last_timeline = self._measured_timeline(runner.events)
        return self.signature.unflatten_outputs(outputs)

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
        """Every stage program's function, in stage order (forward, backward,
        apply-grad rounds within a stage)."""
        run = {c.function for c in self.program.calls.values()}
        return [
            name
            for stage in plan_stages(self.module)
            for _, name in stage.phase_functions()
            if name in run
        ]

    def get_hlo_text(self, status: Any = None) -> list[str]:
        """The HLO XLA compiled for each stage program, in stage order (see
        :meth:`stage_function_names`); as lowered for ``HloStatus.UNOPTIMIZED``
        and ``SHARDING_ANNOTATED`` (Alpa's ``get_hlo_text(status)``)."""
        from alpa_ir.api.hlo_status import hlo_text, split_status
        from alpa_ir.dialects.types import dtype_of, shape_of

        _, which = split_status((), status)

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
            texts.append(hlo_text(compiled.run.lower(*avals), which))  # type: ignore[attr-defined]
        return texts

    def get_allocation_sizes(self) -> dict[str, int]:
        """Bytes one device of its mesh allocates for each stage program, by
        program name (XLA's memory analysis; see :meth:`stage_function_names`)."""
        from alpa_ir.api.executable import allocation_bytes
        from alpa_ir.dialects.types import dtype_of, shape_of

        sizes = {}
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
            lowered = compiled.run.lower(*avals)  # type: ignore[attr-defined]
            sizes[name] = allocation_bytes(lowered.compile())
        return sizes

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


def _layer_passes(module: ModuleOp, method: PipeshardParallel) -> list[str]:
    """The passes that draw the imported step's layers: with
    :class:`AutoLayerOption` ``cluster-operators`` cuts its forward pass; the
    user's boundaries (``mark_pipeline_boundary``) otherwise. Boundaries JAX
    did not mirror into the backward pass are mirrored."""
    from alpa_ir.pipeline.stage_assignment import is_layer_marker

    b = method.num_micro_batches
    passes = [f"draw-micro-batch-rows{{num-micro-batches={b}}}"] if b > 1 else []
    passes += ["merge-backward-runs", "split-conditionals"]
    option = method.layer_option
    marked = any(is_layer_marker(op) for op in main_function(module).body.block.ops)
    if option is None:  # the step's own boundaries, else Alpa's default
        option = ManualLayerOption() if marked else AutoLayerOption(layer_num=2)
    if isinstance(option, AutoLayerOption):
        if marked:  # Alpa's automatic layers ignore the step's own boundaries too
            warnings.warn(
                "PipeshardParallel: the step marks its own layer boundaries "
                "(mark_pipeline_boundary) but asks for AutoLayerOption: they are replaced by "
                f"{option.layer_num} automatic layers; use ManualLayerOption to keep them",
                UserWarning,
                stacklevel=4,
            )
        replace = " replace-markers=true" if marked else ""
        passes.append(f"cluster-operators{{layers={option.layer_num} delta={option.eps}{replace}}}")
    return [*passes, "mirror-layers"]


def _split_pass(method: PipeshardParallel) -> list[str]:
    """``split-backward`` where the schedule runs B and W apart, or may."""
    if method.pipeline_schedule in SPLIT_SCHEDULES or method.is_plugin_schedule:
        return ["split-backward"]  # a plugin's order may run W apart from B
    if method.pipeline_schedule == "auto" and isinstance(method.stage_option, AutoStageOption):
        return ["split-backward{zero-bubble-only=true}"]
    return []


def _stage_pass(
    method: PipeshardParallel,
    num_layers: int,
    devices: tuple[int, ...],
    schedules: Mapping[str, Any] | None = None,
) -> str:
    """``outline-stages`` with the uniform or manual slicing, or ``construct-stages``."""
    option = method.stage_option
    b, schedule = method.num_micro_batches, method.pipeline_schedule
    if schedule == "auto" and not isinstance(option, AutoStageOption):
        schedule = "1f1b"  # given stages: nothing to choose the schedule with
    remat = "true" if method.remat_layer else "false"
    ids = ",".join(str(d) for d in devices)
    if isinstance(option, AutoStageOption):
        space = option.submesh_logical_shape_space.replace("_", "-")
        comm = option.cross_stage_comm
        comm_text = comm if isinstance(comm, str) else str(comm).lower()
        return (
            f"construct-stages{{num-micro-batches={b} schedule={schedule} submesh-space={space} "
            f"stage-cost-model={option.stage_cost_model} progress=false remat={remat} "
            f"cost-mode={option.cost_mode} workers={option.worker_count()} "
            f"repeated-layers={option.repeated_layers} cross-stage-comm={comm_text} "
            f"devices={ids}}}"
        )
    if isinstance(option, ManualStageOption):
        if method.chunks_per_mesh > 1:
            raise AlpaError(
                f"pipeline_schedule {schedule!r} cuts the layers into chunks per mesh; give "
                "the stages as UniformStageOption, not ManualStageOption"
            )
        placements = manual_placements(num_layers, devices, option)
    else:
        placements = uniform_placements(num_layers, devices, option)
    meshes = ",".join("x".join(str(n) for n in p.mesh.shape) for p in placements)
    ids = ",".join(str(d) for p in placements for d in p.mesh.devices or ())  # those used
    if method.chunks_per_mesh == 1:
        layers = ",".join(f"{p.first}-{p.last}" for p in placements)
        mesh_of = ""
    else:
        layers, mesh_of = _chunks(num_layers, len(placements), method, schedules)
    return (
        f"outline-stages{{layers={layers} meshes={meshes}{mesh_of} devices={ids} "
        f"num-micro-batches={b} schedule={schedule} remat={remat}}}"
    )


def _chunks(
    num_layers: int,
    meshes: int,
    method: PipeshardParallel,
    schedules: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """The layers cut into ``meshes × v`` chunks and each chunk's mesh, as the
    schedule places them (``outline-stages``' ``layers`` and `` mesh-of=``)."""
    from alpa_ir.pipeline.schedule_kinds import build_schedule

    v = method.chunks_per_mesh
    count = meshes * v
    if count > num_layers:
        raise AlpaError(
            f"pipeline_schedule {method.pipeline_schedule!r}: {meshes} stages x {v} chunks need "
            f"{count} layers, the step has {num_layers}"
        )
    order = build_schedule(
        method.pipeline_schedule, meshes, method.num_micro_batches, v, schedules=schedules
    )
    bounds = [round(k * num_layers / count) for k in range(count + 1)]
    layers = ",".join(f"{bounds[k]}-{bounds[k + 1] - 1}" for k in range(count))
    return layers, " mesh-of=" + ",".join(str(m) for m in order.mesh_of)


def _planning_cluster(method: PipeshardParallel, num_devices: int, budget: MemoryBudget) -> Any:
    """The cluster automatic stages plan on: the devices the plan may use as
    one node, each with ``budget`` bytes; on the ray backend with several
    hosts of equal devices, those hosts joined by their link (probed at
    ``init``, else a default), so ``(1, 2^m)`` submeshes stay inside a host and
    ``(n, M)`` ones span hosts."""
    from alpa_ir.hardware.clusters import local_cpu

    node = local_cpu(budget=budget).one_node(num_devices)
    if method.backend != "ray":
        return node
    from alpa_ir.runtime.ray_cluster import cluster_hosts, host_link

    hosts = cluster_hosts()
    per_host = {h.num_devices for h in hosts}
    if len(hosts) < 2 or len(per_host) != 1:
        return node
    (m,) = per_host
    if num_devices % m:
        return node
    link = host_link(hosts[0].resource)
    node = local_cpu(budget=budget).one_node(m)
    return node.across_hosts(num_devices // m, link.bandwidth, link.latency)


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
) -> PipeshardExecutable:
    """Plan ``fn`` for ``args`` with ``method`` as one pass pipeline on the
    imported step (:func:`plan_pipeshard`), and compile the planned module for
    the method's backend."""
    planned = plan_pipeshard(
        fn,
        args,
        method,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
        static_argnums=static_argnums,
        registry=registry,
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
) -> PlannedPipeline:
    """Import ``fn`` for ``args`` and plan it with ``method``'s pass pipeline;
    nothing is compiled."""
    from alpa_ir.api.runtime_api import session_backend

    del donate_argnums  # buffers of a pipeline step are not donated yet
    method = replace(method, backend=session_backend(method.backend))
    registry = registry or default_registry()
    devices = _device_ids(method.devices, method.backend)
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
    main = main_function(module)
    # a large step's costing workers import the compiler while the layers are found
    with StartedWorkers(_early_workers(method, main)) as started:
        return _plan_imported(
            module, imported, arguments, method, devices, batch_argnums, b, registry, started
        )


def _early_workers(method: PipeshardParallel, main: func.FuncOp) -> int:
    """How many costing workers to start before the layers are found: those
    ``construct-stages`` will want besides this process, for a step large
    enough that its cost table will (:data:`~alpa_ir.costs.stage_table.WORKERS_FROM_OPS`)."""
    from alpa_ir.costs.stage_table import WORKERS_FROM_OPS

    option = method.stage_option
    if not isinstance(option, AutoStageOption) or option.stage_cost_model != "analytical":
        return 0  # a model that measures on the local devices costs in this process
    large = num_ops(main) >= WORKERS_FROM_OPS
    return option.worker_count() - 1 if large else 0


def _plan_imported(
    module: ModuleOp,
    imported: ImportedStep,
    arguments: StepArguments,
    method: PipeshardParallel,
    devices: tuple[int, ...],
    batch_argnums: Sequence[int],
    b: int,
    registry: PluginRegistry,
    started: StartedWorkers,
) -> PlannedPipeline:
    """:func:`plan_pipeshard` after the import: the layer passes, then the plan's."""
    from alpa_ir.ir.context import make_context
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.pipeline.stage_assignment import count_layers

    main = main_function(module)
    budget = plan_memory_budget(method.device_memory, method.backend, len(devices))
    if isinstance(method.stage_option, AutoStageOption):  # what construct-stages plans on
        cluster = _planning_cluster(method, len(devices), budget)
        module.body.block.insert_op_before(cluster.to_op(), main)
    input_module = module.clone()
    num_inputs = len(main.args)
    # verified once per pipeline (a failure is replayed to name the pass): per
    # pass, verification took a tenth of planning a 124M-parameter model
    layers = PassManager(
        registry,
        f"builtin.module({','.join(_layer_passes(module, method))})",
        verify_each="end",
    )
    statistics = layers.execute(module, snapshot=input_module).statistics
    main = main_function(module)
    warn_micro_batch_statistics(main, batch_leaves_of(main), b)
    inner = method.auto_sharding_option.pipeline(1).removeprefix("builtin.module(")[:-1]
    plan_passes = [
        _stage_pass(method, count_layers(main), devices, registry.schedules),
        f'shard-stages{{stage-pipeline="{inner}"}}',
        *_split_pass(method),
        "cross-mesh-resharding",
        "emit-instructions",
    ]
    plan = PassManager(registry, f"builtin.module({','.join(plan_passes)})", verify_each="end")
    ctx = make_context(registry)
    ctx.costing_workers = started
    statistics += plan.execute(module, ctx).statistics
    pass_pipeline = format_pipeline([*layers.passes, *plan.passes])  # one pipeline replays both
    signature = compiled_signature(arguments, imported.in_tree, imported.out_tree, imported.outputs)
    if len(main_function(module).args) > num_inputs:  # draw-micro-batch-rows added the rows
        batch = arguments.dynamic_positions(batch_argnums)
        first = jax.tree.leaves(arguments.arrays[batch[0]])[0]
        signature = replace(signature, micro_batch_rows=int(np.shape(first)[0]))
    return PlannedPipeline(
        module, signature, input_module, pass_pipeline, tuple(statistics), budget,
        method.backend or "xla", registry,
    )  # fmt: skip
