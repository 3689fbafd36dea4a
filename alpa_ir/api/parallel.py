"""``parallelize``: the user-facing API for intra-operator parallel training
(modelled on Alpa's).

    @alpa_ir.parallelize(method=alpa_ir.ShardParallel(), donate_argnums=(0,), batch_argnums=(1,))
    def train_step(state, batch): ...

On the first call with a given signature the step is imported, planned by
the method's pass pipeline and compiled for the local devices; later calls
reuse the executable. ``get_executable(*args)`` returns it without running.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from xdsl.dialects import func
from xdsl.dialects.builtin import FlatSymbolRefAttr, FloatAttr, ModuleOp

from alpa_ir.api.executable import PlannedExecutable
from alpa_ir.api.manual_sharding import (
    ManualShardingOption,
    annotate_inputs,
    annotate_outputs,
)
from alpa_ir.api.sharding_options import AutoShardingOption, data_parallel_option, heuristic_option
from alpa_ir.dialects.mesh import MESH_ATTR
from alpa_ir.dialects.sharding import SPEC_ATTR, ShardingSpec, spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import (
    CompiledSignature,
    StaticArgnums,
    check_micro_batches,
    compiled_signature,
    signature_key,
    step_arguments,
    trace_arguments,
)
from alpa_ir.hardware.device_mesh import Devices, LogicalDeviceMesh, resolve_mesh
from alpa_ir.hardware.memory_budget import check_memory_option
from alpa_ir.ir.module_utils import main_function
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.pipeline.step_partition import batch_leaves_of, warn_micro_batch_statistics
from alpa_ir.plugins.registry import PluginRegistry, default_registry


@dataclass(frozen=True)
class ShardParallel:
    """Intra-operator parallelism planned by the ILP on one logical mesh."""

    devices: Devices = None
    num_micro_batches: int | None = None
    auto_sharding_option: AutoShardingOption = field(default_factory=AutoShardingOption)
    manual_sharding_option: ManualShardingOption | None = None
    """Specs of the inputs and outputs given by hand (kept by the ILP; only
    propagated with ``AutoShardingOption(enable_auto_sharding=False)``)."""
    backend: Literal["xla", "ray"] | None = None
    """``xla``: the step runs in this process on the local devices; ``ray``: one
    Ray actor per host, the mesh may span hosts (after ``alpa_ir.init(cluster="ray")``);
    None: ``ray`` while connected to Ray by ``alpa_ir.init(cluster="ray")``, else
    ``xla`` (Alpa's switch)."""
    device_memory: float | str | None = None
    """Bytes each device may hold (a number, or a size such as ``"6GiB"``); None:
    ``ALPA_DEVICE_MEMORY``, else what the local devices have
    (:mod:`alpa_ir.hardware.memory_budget`). A plan that needs more is refused
    before it compiles."""

    def __post_init__(self) -> None:
        if self.backend not in ("xla", "ray", None):
            raise AlpaError(f"backend must be 'xla' or 'ray', got {self.backend!r}")
        check_memory_option(self.device_memory, "ShardParallel(device_memory=...)")


def DataParallel(devices: Devices = None, num_micro_batches: int | None = None) -> ShardParallel:
    """Batch split over every mesh axis, parameters replicated, gradients all-reduced."""
    return ShardParallel(
        devices,
        num_micro_batches,
        data_parallel_option(reduce_scatter="none"),
    )


def Zero2Parallel(devices: Devices = None, num_micro_batches: int | None = None) -> ShardParallel:
    """Data parallel with gradients reduce-scattered and optimizer state sharded (ZeRO-2)."""
    return ShardParallel(
        devices,
        num_micro_batches,
        data_parallel_option(reduce_scatter="zero2"),
    )


def Zero3Parallel(devices: Devices = None, num_micro_batches: int | None = None) -> ShardParallel:
    """ZeRO-2 plus sharded parameters, all-gathered where used (ZeRO-3)."""
    return ShardParallel(
        devices,
        num_micro_batches,
        data_parallel_option(reduce_scatter="zero3"),
    )


def HeuristicParallel(
    devices: Devices = None, num_micro_batches: int | None = None
) -> ShardParallel:
    """Alpa's "Heuristic" baseline: the largest dimension of every input split,
    the rest planned to match (the ILP plays GSPMD's propagation)."""
    return ShardParallel(
        devices,
        num_micro_batches,
        heuristic_option(),
    )


@dataclass(frozen=True)
class ManualShardParallel:
    """A user's own plan: ``in_specs`` is a pytree like the arguments whose
    leaves are ``jax.sharding.PartitionSpec`` (mesh axis names of ``devices``)
    or None (left to the planner). Megatron-style plans are written this way."""

    in_specs: Any
    devices: Devices = None
    num_micro_batches: int | None = None
    auto_sharding_option: AutoShardingOption = field(
        default_factory=lambda: AutoShardingOption(reduce_scatter="none")
    )
    device_memory: float | str | None = None
    """Bytes each device may hold (see :attr:`ShardParallel.device_memory`)."""

    def __post_init__(self) -> None:
        check_memory_option(self.device_memory, "ManualShardParallel(device_memory=...)")


Method = ShardParallel | ManualShardParallel


def partition_spec_of(spec: ShardingSpec, names: Sequence[str]) -> PartitionSpec:
    return PartitionSpec(
        *[
            None if not d else (names[d[0]] if len(d) == 1 else tuple(names[a] for a in d))
            for d in spec.dims
        ]
    )


class ShardedExecutable(PlannedExecutable):
    """A step planned and compiled for a mesh of local devices."""

    def __init__(
        self,
        module: ModuleOp,
        mesh: LogicalDeviceMesh,
        signature: CompiledSignature,
        batch_leaves: Sequence[int],
        num_micro_batches: int,
        *,
        propagate: bool = False,
        out_specs: Sequence[PartitionSpec | None] | None = None,
        compile_locally: bool = True,
    ) -> None:
        super().__init__(module, signature)
        self.mesh = mesh
        self.function: func.FuncOp = main_function(module)
        self.batch_leaves = tuple(batch_leaves)
        self.num_micro_batches = num_micro_batches
        self.donated = () if propagate else donated_leaves(self.function)
        """Flat inputs whose buffers the program reuses for their new values
        (the donated state: ``donate_argnums``, default the state, argument 0)."""
        self._propagate, self._out_specs = propagate, out_specs
        self._local: tuple[Any, Sequence[Any], list[Any] | None] | None = None
        if compile_locally:  # on the ray backend only when asked for (its mesh
            self._compile_local()  # may hold more devices than this process)

    def _compile_local(self) -> tuple[Any, Sequence[Any], list[Any] | None]:
        """The program on this process's devices (:attr:`jax_mesh`): (program,
        input shardings, output shardings), compiled once."""
        if self._local is not None:
            return self._local
        from alpa_ir.backends.spmd import compile_spmd

        mesh, jax_mesh = self.mesh, self.jax_mesh
        assert mesh.axis_names is not None
        out_specs = self._out_specs
        out_shardings = (
            None
            if out_specs is None or self._propagate
            else [None if s is None else NamedSharding(jax_mesh, s) for s in out_specs]
        )
        if self._propagate:  # the given specs only, propagated by XLA's SPMD partitioner
            from alpa_ir.backends.xla import compile_annotated

            run, in_shardings = compile_annotated(self.function, jax_mesh, mesh.axis_names)
        else:
            run, in_shardings = compile_spmd(
                self.module,
                self.function,
                jax_mesh,
                mesh.axis_names,
                donate=self.donated,
                num_micro_batches=self.num_micro_batches,
                batch_args=self.batch_leaves,
            )
        self._local = (run, in_shardings, out_shardings)
        return self._local

    @functools.cached_property
    def jax_mesh(self) -> Mesh:
        """The plan's mesh of this process's JAX devices (for the ray backend:
        the driver's own, as many as the mesh needs; the hosts hold theirs)."""
        from alpa_ir.runtime.devices import local_devices_for

        mesh = self.mesh
        assert mesh.devices is not None and mesh.axis_names is not None
        devices = np.array(local_devices_for(mesh.devices), dtype=object).reshape(mesh.shape)
        return Mesh(devices, mesh.axis_names)

    @property
    def auto_sharding_objective(self) -> float:
        attr = self.function.attributes.get("sharding.objective")
        return float(attr.value.data) if isinstance(attr, FloatAttr) else float("nan")

    def predicted_collectives(self) -> list[Any]:
        """The plan's explicit collectives (see ``alpa_ir.autosharding.plan_bytes``)."""
        from alpa_ir.autosharding.plan_bytes import predicted_collectives

        repeated: frozenset[object] = frozenset()
        if self.num_micro_batches > 1:
            from alpa_ir.pipeline.step_partition import deferred_reductions, partition_step

            part = partition_step(self.function, self.batch_leaves)
            # gradient reductions run once per step, after the micro-batches
            repeated = frozenset(part.compute) - deferred_reductions(part, self.function)
        return predicted_collectives(
            self.function, self.mesh.shape, repeated, self.num_micro_batches
        )

    def predicted_wire_bytes(self) -> float:
        """Bytes one device sends per step, by the plan (ring algorithms)."""
        return sum(c.wire_bytes for c in self.predicted_collectives())

    def measured_wire_bytes(self, *args: Any) -> float:
        """Bytes one device sends per step, by the collectives XLA compiled."""
        from alpa_ir.costs.collective_accounting import hlo_collectives, total_wire_bytes

        return total_wire_bytes(hlo_collectives(self.get_hlo_text(*args)), self.mesh.size)

    remote: Any = None
    """The Ray executable (one worker per host) when the step runs on the ray backend."""

    def _flat_inputs(self, args: tuple[Any, ...]) -> list[Any]:
        in_shardings = self._compile_local()[1]
        return jax.device_put(self._host_inputs(args), list(in_shardings))

    def _host_inputs(self, args: tuple[Any, ...]) -> list[Any]:
        """The flat inputs, batch leaves as ``[micro-batches, ...]`` when accumulating."""
        flat = self.signature.flatten(args)
        for k, x in enumerate(flat):
            if isinstance(x, jax.Array) and x.is_deleted():
                name = self.signature.leaf_names[k]
                raise AlpaError(
                    f"{name} was donated to an earlier call of this step, which consumed its "
                    "buffer (donate_argnums); pass the state that call returned"
                )
        if self.num_micro_batches > 1:
            b = self.num_micro_batches
            flat = [
                np.reshape(x, (b, np.shape(x)[0] // b, *np.shape(x)[1:]))
                if k in self.batch_leaves
                else x
                for k, x in enumerate(flat)
            ]
        return flat

    def __call__(self, *args: Any) -> Any:
        if self.remote is not None:
            outs = self.remote.run_flat(self._host_inputs(args))
            return self.signature.unflatten_outputs(outs)
        run, _, out_shardings = self._compile_local()
        outs = list(run(*self._flat_inputs(args)))
        if out_shardings is not None:  # delivered in the user's output specs
            outs = [
                x if s is None else jax.device_put(x, s)
                for x, s in zip(outs, out_shardings, strict=True)
            ]
        return self.signature.unflatten_outputs(outs)

    def get_hlo_text(self, *args: Any, status: Any = None) -> str:
        """The HLO of the SPMD program: compiled (after XLA's passes), or as
        lowered for ``HloStatus.UNOPTIMIZED``/``SHARDING_ANNOTATED`` (Alpa's
        ``get_hlo_text(status)``; :mod:`alpa_ir.api.hlo_status`). ``args``:
        example arguments (default: those of the first call)."""
        from alpa_ir.api.hlo_status import hlo_text, split_status

        args, which = split_status(args, status)
        if not args:
            args = self._example_args
        run = self._compile_local()[0]
        return hlo_text(run.lower(*self._flat_inputs(args)), which)

    def plan_text(self) -> str:
        """The plan: the mesh and the sharding of every input."""
        assert self.mesh.axis_names is not None
        lines = [
            f"shard-parallel on mesh {list(self.mesh.shape)} devices {list(self.mesh.devices or ())}"
        ]
        names = self.signature.leaf_names
        for name, arg in zip(names, self.function.args, strict=True):
            lines.append(f"  {name}: {spec_of_value(arg, self.function)}")
        return "\n".join(lines)

    def why_text(self, top: int = 5) -> str:
        """Why the plan costs what it costs: its ``top`` largest communication
        terms, each with the op whose value it moves (and the user's line)."""
        from alpa_ir.api.why_plan import hint_cost_lines
        from alpa_ir.autosharding.comm_terms import sharding_terms

        terms = sharding_terms(self.function, tuple(self.mesh.shape), top)
        lines = [f"largest communication of the plan on mesh {list(self.mesh.shape)}:"]
        lines += [f"  {t.text()}" for t in terms] or ["  none: the plan communicates nothing"]
        lines += hint_cost_lines(self.function)
        return "\n".join(lines)

    def plot(self, kind: str, path: str | os.PathLike[str]) -> Any:
        """Draw the plan: ``devices`` (the mesh on the local devices) or
        ``shardings`` (the largest inputs' tiles), or ``communication`` (bytes per
        collective kind, predicted by the plan and compiled by XLA) into ``path``
        (.png or .svg)."""
        if kind == "communication":
            from alpa_ir.plots.communication import draw_communication, shard_rows

            return draw_communication(shard_rows(self), path)
        from alpa_ir.plots.views import plot_module

        return plot_module(self.module, kind, path)

    def hlo_files(self, *args: Any) -> dict[str, str]:
        """The compiled SPMD program (``args``: example arguments, default those
        of the first call)."""
        return {"hlo/step.hlo": self.get_hlo_text(*args)}

    def get_input_placement_specs(self) -> Any:
        assert self.mesh.axis_names is not None
        specs = [
            partition_spec_of(spec_of_value(a, self.function), self.mesh.axis_names)
            for a in self.function.args
        ]
        return jax.tree.unflatten(self.in_tree, specs)

    def get_input_shardings(self) -> Any:
        """A ``jax.sharding.NamedSharding`` per input array, as a pytree like the
        arguments (the whole batch, not a micro-batch): where each input lives.
        ``restore_checkpoint(path, target=executable)`` places the state (argument
        0) by it."""
        return jax.tree.map(
            lambda s: NamedSharding(self.jax_mesh, s),
            self.get_input_placement_specs(),
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    def get_input_avals(self) -> Any:
        """A ``jax.ShapeDtypeStruct`` (shape, dtype and sharding) per input array,
        as a pytree like the arguments."""
        from alpa_ir.dialects.types import dtype_of, shape_of

        shardings = jax.tree.leaves(
            self.get_input_shardings(), is_leaf=lambda x: isinstance(x, NamedSharding)
        )
        avals = []
        for k, (arg, sharding) in enumerate(zip(self.function.args, shardings, strict=True)):
            shape = list(shape_of(arg.type))
            if k in self.batch_leaves and self.num_micro_batches > 1:
                shape[0] *= self.num_micro_batches
            dtype = dtype_of(arg.type)
            avals.append(jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding))
        return jax.tree.unflatten(self.in_tree, avals)

    def get_output_placement_specs(self) -> Any:
        assert self.mesh.axis_names is not None
        attrs = self.function.res_attrs
        specs = []
        for k, value in enumerate(self.function.body.block.last_op.operands):  # type: ignore[union-attr]
            entry = attrs.data[k].data.get(SPEC_ATTR) if attrs is not None else None  # type: ignore[attr-defined]
            spec = entry.spec if entry is not None else spec_of_value(value, self.function)  # type: ignore[attr-defined]
            specs.append(partition_spec_of(spec, self.mesh.axis_names))
        return jax.tree.unflatten(self.out_tree, specs)

    _example_args: tuple[Any, ...] = ()


def donated_leaves(function: func.FuncOp) -> tuple[int, ...]:
    """The flat inputs to donate: donated inputs (``alpa.donated``) paired with
    an output (``alpa.aliases``) that the plan lays out alike, so that XLA can
    write the new value into the old buffer."""
    from alpa_ir.frontend.jaxpr_import import ALIASES_ATTR, DONATED_ATTR

    donated_attr = function.attributes.get(DONATED_ATTR)
    aliases_attr = function.attributes.get(ALIASES_ATTR)
    if donated_attr is None or aliases_attr is None:
        return ()
    donated = {int(x) for x in donated_attr.get_values()}  # type: ignore[attr-defined]
    returned = list(function.body.block.last_op.operands)  # type: ignore[union-attr]
    out = []
    for pair in aliases_attr.data:  # type: ignore[attr-defined]
        output, arg = (int(x) for x in pair.get_values())
        if arg not in donated:
            continue
        if spec_of_value(function.args[arg], function) == spec_of_value(returned[output], function):
            out.append(arg)
    return tuple(sorted(out))


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
    donate_argnums: Sequence[int],
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


def plan_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    method: Method,
    *,
    donate_argnums: Sequence[int],
    batch_argnums: Sequence[int],
    static_argnums: StaticArgnums = (),
    registry: PluginRegistry | None = None,
) -> PlannedStep:
    """Import ``fn`` for ``args`` and plan it with ``method``'s pass pipeline;
    nothing is compiled."""
    from alpa_ir.api.runtime_api import session_backend
    from alpa_ir.frontend.jaxpr_import import import_step
    from alpa_ir.runtime.ray_cluster import backend_devices

    registry = registry or default_registry()
    backend = session_backend(getattr(method, "backend", None))
    mesh = resolve_mesh(method.devices, backend_devices(backend))
    if method.auto_sharding_option.force_data_parallel and not isinstance(
        method, ManualShardParallel
    ):
        mesh = mesh.flattened()
    manual = getattr(method, "manual_sharding_option", None)
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
    if propagate and b > 1:
        raise AlpaError(
            "enable_auto_sharding=False does not accumulate gradients; use 1 micro-batch"
        )
    arguments, traced = trace_arguments(fn, args, static_argnums, batch_argnums, b)
    imported = import_step(
        fn,
        *traced,
        static_argnums=arguments.static_argnums,
        donate_argnums=donate_argnums,
        batch_argnums=batch_argnums,
    )
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
    signature = compiled_signature(arguments, imported.in_tree, imported.out_tree, imported.outputs)
    batch_leaves = _leaf_indices(arguments.arrays, arguments.dynamic_positions(batch_argnums))
    if rows:
        signature = replace(signature, micro_batch_rows=_batch_size(signature, batch_leaves))
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


def _batch_size(signature: CompiledSignature, batch_leaves: Sequence[int]) -> int:
    """The whole batch's leading dimension."""
    return int(signature.avals[batch_leaves[0]][0][0])


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


def _is_pipeshard(method: object) -> bool:
    from alpa_ir.api.pipeshard import PipeshardParallel

    return isinstance(method, PipeshardParallel)


class ParallelizedFunction:
    """The result of :func:`parallelize`: call it like the original function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        method: Method,
        donate_argnums: Sequence[int],
        batch_argnums: Sequence[int],
        static_argnums: StaticArgnums = "auto",
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn, self.method = fn, method
        self.donate_argnums, self.batch_argnums = tuple(donate_argnums), tuple(batch_argnums)
        self.static_argnums = static_argnums
        self._cache: dict[Any, ShardedExecutable] = {}

    def get_executable(self, *args: Any) -> ShardedExecutable:
        """The executable for these arguments (compiled on first use)."""
        _check_method(self.method)
        key = signature_key(step_arguments(self.fn, args, self.static_argnums))
        if key not in self._cache and _is_pipeshard(self.method):
            from alpa_ir.api.pipeshard_executable import compile_pipeshard

            self._cache[key] = compile_pipeshard(  # type: ignore[assignment]
                self.fn,
                args,
                self.method,  # type: ignore[arg-type]
                donate_argnums=self.donate_argnums,
                batch_argnums=self.batch_argnums,
                static_argnums=self.static_argnums,
            )
        if key not in self._cache:
            self._cache[key] = compile_step(
                self.fn,
                args,
                self.method,
                donate_argnums=self.donate_argnums,
                batch_argnums=self.batch_argnums,
                static_argnums=self.static_argnums,
            )
        return self._cache[key]

    def __call__(self, *args: Any) -> Any:
        executable = self.get_executable(*args)
        remote = getattr(executable, "remote", None)
        if remote is not None and getattr(remote, "broken", ""):
            # its Ray workers died on an earlier call: compile and start them again
            self._cache = {k: v for k, v in self._cache.items() if v is not executable}
            executable = self.get_executable(*args)
        return executable(*args)


def _check_method(method: object) -> None:
    from alpa_ir.api.pipeshard import PipeshardParallel

    if not isinstance(method, ShardParallel | ManualShardParallel | PipeshardParallel):
        raise AlpaError(
            "method must be a parallel method (ShardParallel(), DataParallel(), "
            f"Zero2Parallel(), Zero3Parallel(), PipeshardParallel(), ...), got {method!r}"
        )


def parallelize(
    fn: Callable[..., Any] | None = None,
    *,
    method: Method | None = None,
    static_argnums: StaticArgnums = "auto",
    donate_argnums: Sequence[int] = (0,),
    batch_argnums: Sequence[int] = (1,),
) -> Any:
    """Parallelize a training step; usable as ``@parallelize`` or
    ``@parallelize(method=...)``. Defaults follow Alpa: the state (argument 0)
    is donated, argument 1 is the batch, and with ``static_argnums="auto"``
    the arguments that are Python ``bool``/``int``/``float``/``str`` (or
    hold a leaf that is not an array) are static: bound at compile time, a new
    value compiles again."""

    def wrap(f: Callable[..., Any]) -> ParallelizedFunction:
        return ParallelizedFunction(
            f, method or ShardParallel(), donate_argnums, batch_argnums, static_argnums
        )

    return wrap(fn) if fn is not None else wrap
