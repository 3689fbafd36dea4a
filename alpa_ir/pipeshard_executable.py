"""Compile a training step with :class:`~alpa_ir.pipeshard.PipeshardParallel` and run it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.device_mesh import LogicalDeviceMesh
from alpa_ir.errors import AlpaError
from alpa_ir.module_utils import main_function, symbol_op
from alpa_ir.pipeshard import (
    AutoLayerOption,
    AutoStageOption,
    ManualStageOption,
    PipeshardParallel,
    StagePlacement,
    _device_ids,
    manual_placements,
    per_micro_batch,
    shard_stage_function,
    uniform_placements,
)
from alpa_ir.plugins.registry import PluginRegistry, default_registry
from alpa_ir.runtime.local_driver import LocalPipelineDriver, Ref, StageCall


class PipeshardExecutable:
    """A step compiled into pipeline stages on submeshes of the local devices."""

    def __init__(
        self,
        module: ModuleOp,
        placements: Sequence[StagePlacement],
        driver: LocalPipelineDriver,
        in_tree: Any,
        out_tree: Any,
    ) -> None:
        self.module = module
        self.placements = tuple(placements)
        self.driver = driver
        self.in_tree, self.out_tree = in_tree, out_tree
        self.remote: Any = None
        """The Ray executable when the step runs on the ray backend."""

    @property
    def num_micro_batches(self) -> int:
        return self.driver.num_micro_batches

    def __call__(self, *args: Any) -> Any:
        flat, tree = jax.tree.flatten(args)
        if tree != self.in_tree:
            raise AlpaError(
                f"arguments have structure {tree}, the step was compiled for {self.in_tree}"
            )
        if self.remote is not None:
            return self.remote(*args)
        return jax.tree.unflatten(self.out_tree, self.driver(flat))

    def close(self) -> None:
        """Stop the Ray workers of a step on the ray backend."""
        if self.remote is not None:
            self.remote.close()

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
    module: ModuleOp, method: PipeshardParallel, devices: tuple[int, ...]
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
    plan = construct_stages(
        module,
        cluster,
        num_micro_batches=method.num_micro_batches,
        schedule=method.pipeline_schedule,
        submesh_space=space,
        progress=False,
    )
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


def _calls(module: ModuleOp, compiled: dict[str, Any]) -> tuple[list[StageCall], list[Ref]]:
    from alpa_ir.stage_outline import PHASES

    main = main_function(module)
    block = main.body.block
    refs: dict[Any, Ref] = {a: ("arg", k, 0) for k, a in enumerate(block.args)}
    calls: list[StageCall] = []
    for op in block.ops:
        if not isinstance(op, func.CallOp):
            continue
        name = op.callee.string_value()
        stage_name, phase = name.split("_", 1)
        assert phase in PHASES
        target = symbol_op(module, name, func.FuncOp)
        entry = compiled[name]
        calls.append(
            StageCall(
                name=name,
                stage=int(stage_name.removeprefix("stage")),
                phase=phase,
                operands=tuple(refs[v] for v in op.operands),
                run=entry.run,
                in_shardings=entry.in_shardings,
                per_micro_batch=per_micro_batch(target),
            )
        )
        for r, result in enumerate(op.results):
            refs[result] = ("call", len(calls) - 1, r)
    results = [refs[v] for v in block.last_op.operands]  # type: ignore[union-attr]
    return calls, results


def schedule_order(
    calls: Sequence[StageCall], num_stages: int, num_micro_batches: int, kind: str
) -> list[tuple[int, int]]:
    """(call index, micro-batch) of the forward/backward calls in the clock
    order of the GPipe or 1F1B schedule (within a clock, by stage)."""
    from alpa_ir.pipeline_schedule import schedule_clocks

    index = {(c.stage, c.phase): k for k, c in enumerate(calls) if not c.per_step}
    order = []
    for clock in schedule_clocks(num_stages, num_micro_batches, kind):  # type: ignore[arg-type]
        for task in sorted(clock, key=lambda t: t.stage):
            k = index.get((task.stage, task.phase))
            if k is not None and task.micro_batch is not None:
                order.append((k, task.micro_batch))
    return order


def _import_step(
    fn: Callable[..., Any], abstract: Any, method: PipeshardParallel, batch_argnums: Sequence[int]
) -> ModuleOp:
    """Import the step; with :class:`AutoLayerOption` its differentiated
    functions get the layer markers of ``cluster-operators``."""
    import contextlib

    from alpa_ir.frontend.jaxpr_import import import_jax
    from alpa_ir.markers import AutomaticLayers, automatic_layers

    option = method.layer_option
    scope = (
        automatic_layers(AutomaticLayers(option.layer_num, option.eps))
        if isinstance(option, AutoLayerOption)
        else contextlib.nullcontext()
    )
    with scope:
        # A fresh function object: JAX's trace cache must not return a trace
        # made without (or with other) layer markers.
        return import_jax(lambda *a: fn(*a), *abstract, batch_argnums=batch_argnums)


def compile_pipeshard(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: PipeshardParallel,
    *,
    donate_argnums: Sequence[int],
    batch_argnums: Sequence[int],
    registry: PluginRegistry | None = None,
) -> PipeshardExecutable:
    """Plan and compile ``fn`` for ``args`` with ``method``."""
    from alpa_ir.frontend.pytree_codec import decode_treedef
    from alpa_ir.parallel import _leaf_indices, _micro_batch_args
    from alpa_ir.stage_outline import StageSlice, count_layers, outline_stages

    del donate_argnums  # buffers of a pipeline step are not donated yet
    registry = registry or default_registry()
    devices = _device_ids(method.devices)
    b = method.num_micro_batches
    if b < 1:
        raise AlpaError(f"num_micro_batches must be at least 1, got {b}")
    traced = _micro_batch_args(args, batch_argnums, b) if b > 1 else args
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), traced)
    module = _import_step(fn, abstract, method, batch_argnums)
    main = main_function(module)
    in_tree = decode_treedef(main.attributes["alpa.in_tree"].data)  # type: ignore[attr-defined]
    out_tree = decode_treedef(main.attributes["alpa.out_tree"].data)  # type: ignore[attr-defined]
    if isinstance(method.stage_option, AutoStageOption):
        placements = _auto_placements(module, method, devices)
    else:
        placements = _placements(method, count_layers(main), devices)
        for k, p in enumerate(placements):
            module.body.block.insert_op_before(p.mesh.to_op(f"mesh{k}"), main)
        slices = [StageSlice(p.first, p.last, f"mesh{k}") for k, p in enumerate(placements)]
        outline_stages(module, slices, b, method.pipeline_schedule)
    compiled: dict[str, Any] = {}
    for op in list(module.body.block.ops):
        if isinstance(op, func.FuncOp) and op.sym_name.data != "main":
            stage = int(op.sym_name.data.split("_", 1)[0].removeprefix("stage"))
            mesh: LogicalDeviceMesh = placements[stage].mesh
            compiled[op.sym_name.data] = shard_stage_function(
                module, op.sym_name.data, mesh, method.auto_sharding_option, registry
            )
    calls, results = _calls(module, compiled)
    driver = LocalPipelineDriver(
        calls,
        results,
        frozenset(_leaf_indices(args, batch_argnums)),
        b,
        order=schedule_order(calls, len(placements), b, method.pipeline_schedule),
    )
    executable = PipeshardExecutable(module, placements, driver, in_tree, out_tree)
    if method.backend == "ray":
        executable.remote = _ray_executable(module, registry)
    return executable


def _ray_executable(module: ModuleOp, registry: PluginRegistry) -> Any:
    """The step's transfers and instruction lists, run by one Ray actor per mesh."""
    from alpa_ir.backends.ray import RayExecutable
    from alpa_ir.pass_manager import PassManager

    with_programs = module.clone()
    PassManager(registry, "builtin.module(cross-mesh-resharding,emit-instructions)").run(
        with_programs
    )
    return RayExecutable(with_programs)
