"""Plan a step for one mesh (``plan_step``: import, the method's pass
pipeline) and compile it for its backend (``sharded_executable``);
``compile_step`` does both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
from jax.sharding import PartitionSpec
from xdsl.dialects import func
from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp

from alpa_ir.api.manual_sharding import (
    annotate_inputs,
    annotate_outputs,
)
from alpa_ir.api.shard_parallel import ManualShardParallel, Method
from alpa_ir.api.sharded_executable import ShardedExecutable, donated_leaves
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import (
    CompiledSignature,
    StaticArgnums,
    check_micro_batches,
)
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh, resolve_mesh
from alpa_ir.ir.collection import rare_full_collections
from alpa_ir.ir.module_utils import main_function
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.pipeline.step_partition import batch_leaves_of, warn_micro_batch_statistics
from alpa_ir.plugins.registry import PluginRegistry, default_registry


@dataclass(frozen=True)
class PlannedStep:
    """A step planned for one mesh, before any backend compiles it
    (:func:`plan_step`)."""

    module: ModuleOp
    mesh: LogicalDeviceMesh
    signature: CompiledSignature
    batch_leaves: tuple[int, ...]
    num_micro_batches: int
    propagate: bool
    out_specs: Sequence[PartitionSpec | None] | None
    input_module: ModuleOp
    pass_pipeline: str
    statistics: tuple[Any, ...]
    backend: str

    def peak_memory(self) -> float:
        """Predicted bytes per device of the planned program."""
        from alpa_ir.pipeline.plan_memory import program_memory

        function = main_function(self.module)
        return program_memory(
            function,
            self.mesh.shape,
            donated=donated_leaves(function),
            batch_args=self.batch_leaves,
            num_micro_batches=self.num_micro_batches,
        ).peak


def compile_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: Method,
    *,
    donate_argnums: Sequence[int] | str,
    batch_argnums: Sequence[int],
    static_argnums: StaticArgnums = (),
    registry: PluginRegistry | None = None,
) -> ShardedExecutable:
    """Plan and compile ``fn`` for ``args`` with ``method`` (no execution)."""
    planned = plan_step(
        fn,
        args,
        method,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
        static_argnums=static_argnums,
        registry=registry,
    )
    return sharded_executable(planned, method, args)


def sharded_executable(
    planned: PlannedStep, method: Method, args: tuple[Any, ...]
) -> ShardedExecutable:
    """The executable of a planned step on its backend (the memory check first,
    on local devices); ``args``: the example arguments it was planned for."""
    module, b, batch_leaves = planned.module, planned.num_micro_batches, planned.batch_leaves
    on_ray = planned.backend == "ray"
    if not (planned.propagate or on_ray):  # XLA lays out what is only propagated
        _check_memory(main_function(module), planned.mesh, batch_leaves, b, method)
    executable = ShardedExecutable(
        module, planned.mesh, planned.signature, batch_leaves, b, propagate=planned.propagate,
        out_specs=planned.out_specs, compile_locally=not on_ray,
    )  # fmt: skip
    if on_ray:
        from alpa_ir.backends.ray_hosts import RayHostsExecutable

        executable.remote = RayHostsExecutable(module, num_micro_batches=b, batch_args=batch_leaves)
    executable._example_args = args
    executable.input_module, executable.pass_pipeline = planned.input_module, planned.pass_pipeline
    executable.pass_statistics = planned.statistics
    return executable


@rare_full_collections()  # importing and planning allocate millions of objects
def plan_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: Method,
    *,
    donate_argnums: Sequence[int] | str,
    batch_argnums: Sequence[int],
    static_argnums: StaticArgnums = (),
    registry: PluginRegistry | None = None,
) -> PlannedStep:
    """Import ``fn`` for ``args`` and plan it with ``method``'s pass pipeline;
    nothing is compiled."""
    from alpa_ir.api.runtime_api import session_backend
    from alpa_ir.api.step_import import import_for_plan, planned_signature
    from alpa_ir.runtime.ray_cluster import backend_devices

    registry = registry or default_registry()
    backend = session_backend(getattr(method, "backend", None))
    devices = method.devices
    if devices is None:  # the session's mesh (set_global_physical_mesh), if any
        from alpa_ir.api.session_meshes import session_physical_mesh

        kept = session_physical_mesh()
        devices = None if kept is None else kept.logical_mesh()
    mesh = resolve_mesh(devices, backend_devices(backend))
    option = method.auto_sharding_option
    if (option.force_data_parallel or option.force_zero_stage_3) and not isinstance(
        method, ManualShardParallel
    ):
        mesh = mesh.flattened()
    manual = getattr(method, "manual_sharding_option", None)
    if manual is not None and (
        manual.submesh_axis_names is not None or manual.pipeline_intermediate_axes is not None
    ):
        raise AlpaError(
            "ManualShardingOption: submesh_axis_names and pipeline_intermediate_axes are for "
            f"PipeshardParallel's stages; {type(method).__name__} has one mesh"
        )
    if manual is not None and manual.mesh_axis_names is not None:
        if len(manual.mesh_axis_names) != mesh.rank:
            raise AlpaError(
                f"ManualShardingOption names {len(manual.mesh_axis_names)} mesh axes, the mesh "
                f"{list(mesh.shape)} has {mesh.rank}"
            )
        mesh = replace(mesh, axis_names=tuple(manual.mesh_axis_names))
    b = check_micro_batches(method.num_micro_batches)
    propagate = not method.auto_sharding_option.enable_auto_sharding
    if propagate and manual is None:
        raise AlpaError(
            "AutoShardingOption(enable_auto_sharding=False) propagates the specs of a "
            "ManualShardingOption; give one (ShardParallel(manual_sharding_option=...))"
        )
    arguments, imported = import_for_plan(
        fn, args, b, static_argnums=static_argnums, batch_argnums=batch_argnums,
        donate_argnums=donate_argnums,
    )  # fmt: skip
    module = imported.module
    function = main_function(module)
    module.body.block.insert_op_before(mesh.to_op("mesh"), function)
    function.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
    warn_micro_batch_statistics(function, batch_leaves_of(function), b)
    option = method.auto_sharding_option
    if isinstance(method, ManualShardParallel):
        assert mesh.axis_names is not None
        annotate_inputs(
            function, arguments.arrays, method.in_specs, mesh.axis_names, mesh.shape,
            what="ManualShardParallel in_specs", none_subtrees=False,
        )  # fmt: skip
        option = replace(option, force_data_parallel=False)
    out_specs = None
    if manual is not None:
        assert mesh.axis_names is not None
        if manual.in_axis_resources is not None:
            _annotate_manual(function, arguments.arrays, manual.in_axis_resources, mesh)
        if manual.out_axis_resources is not None:
            out_specs = annotate_outputs(
                function, imported.out_tree, manual.out_axis_resources, mesh.axis_names, mesh.shape
            )
    input_module = module.clone()
    num_inputs = len(function.args)
    passes = [] if propagate else [option.pipeline(b).removeprefix("builtin.module(")[:-1]]
    if b > 1:  # micro-batches draw the one-device random rows
        passes.insert(0, f"draw-micro-batch-rows{{num-micro-batches={b}}}")
    manager = PassManager(registry, f"builtin.module({','.join(passes)})", verify_each="end")
    pass_pipeline = manager.pipeline
    statistics = manager.execute(module).statistics
    rows = len(main_function(module).args) > num_inputs
    signature = planned_signature(arguments, imported, batch_argnums, rows)
    batch_leaves = _leaf_indices(arguments.arrays, arguments.dynamic_positions(batch_argnums))
    if rows:
        batch_leaves.append(len(signature.avals))
    return PlannedStep(
        module, mesh, signature, tuple(batch_leaves), b, propagate, out_specs, input_module,
        pass_pipeline, tuple(statistics), backend,
    )  # fmt: skip


def _check_memory(
    function: func.FuncOp,
    mesh: LogicalDeviceMesh,
    batch_leaves: Sequence[int],
    num_micro_batches: int,
    method: Method,
) -> None:
    """Refuse the plan before it compiles if it needs more memory per device than
    the local devices have (:mod:`alpa_ir.api.memory_check`)."""
    from alpa_ir.api.memory_check import check_program_memory, plan_memory_budget

    budget = plan_memory_budget(method.device_memory, "xla", mesh.size)
    check_program_memory(
        function,
        mesh.shape,
        budget,
        donated=donated_leaves(function),
        batch_args=batch_leaves,
        num_micro_batches=num_micro_batches,
        where=type(method).__name__,
    )


def _leaf_indices(args: tuple[Any, ...], argnums: Sequence[int]) -> list[int]:
    out, start = [], 0
    for k, a in enumerate(args):
        n = len(jax.tree.leaves(a))
        if k in argnums:
            out += range(start, start + n)
        start += n
    return out


def _annotate_manual(
    function: func.FuncOp, args: tuple[Any, ...], in_specs: Any, mesh: LogicalDeviceMesh
) -> None:
    """User PartitionSpecs become argument specs the planner must keep."""
    assert mesh.axis_names is not None
    annotate_inputs(function, args, in_specs, mesh.axis_names, mesh.shape)
