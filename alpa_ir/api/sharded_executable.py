"""``ShardedExecutable``: a step planned for one mesh and compiled for its
devices (the SPMD program of :mod:`alpa_ir.backends.spmd`)."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from xdsl.dialects import func
from xdsl.dialects.builtin import FloatAttr, ModuleOp

from alpa_ir.api.executable import PlannedExecutable
from alpa_ir.backends.grad_accumulation import AccumulatingStep
from alpa_ir.dialects.sharding import SPEC_ATTR, spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import (
    CompiledSignature,
)
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.runtime.devices import partition_spec


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

            run, in_shardings = compile_annotated(
                self.function,
                jax_mesh,
                mesh.axis_names,
                num_micro_batches=self.num_micro_batches,
                batch_args=self.batch_leaves,
            )
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
            from alpa_ir.autosharding.gradient_reductions import scatter_chains
            from alpa_ir.pipeline.step_partition import deferred_reductions, partition_step

            part = partition_step(self.function, self.batch_leaves)
            # gradient reductions run once per step, after the micro-batches
            once = {start for start, _ in scatter_chains(part).values()}
            repeated = frozenset(part.compute) - deferred_reductions(part, self.function) - once
        return predicted_collectives(
            self.function, self.mesh.shape, repeated, self.num_micro_batches
        )

    def predicted_wire_bytes(self) -> float:
        """Bytes one device sends per step, by the plan (ring algorithms)."""
        return sum(c.wire_bytes for c in self.predicted_collectives())

    def measured_wire_bytes(self, *args: Any) -> float:
        """Bytes one device sends per step, by the collectives XLA compiled."""
        from alpa_ir.api.hlo_status import compiled_text
        from alpa_ir.costs.collective_accounting import hlo_collectives, total_wire_bytes

        run = self._compile_local()[0]
        if not isinstance(run, AccumulatingStep):
            return total_wire_bytes(hlo_collectives(self.get_hlo_text(*args)), self.mesh.size)
        # accumulate runs for all micro-batches but the last, then accumulate_last and apply
        last, apply = (compiled_text(p.compile()) for p in self._lowered())
        acc = compiled_text(
            run.accumulate.lower(*run.accumulate_structs(self._input_structs())).compile()
        )
        return sum(
            times * total_wire_bytes(hlo_collectives(text), self.mesh.size)
            for text, times in ((acc, self.num_micro_batches - 1), (last, 1), (apply, 1))
        )

    @property
    def grad_sync_channel_ids(self) -> str:
        """Alpa's: the channel ids of the collectives that synchronise the
        gradients, run once per step after the micro-batches (``".3.7."``;
        ``""`` without gradient accumulation)."""
        from alpa_ir.api.hlo_status import compiled_text
        from alpa_ir.backends.grad_accumulation import grad_sync_channel_ids

        if not isinstance(self._compile_local()[0], AccumulatingStep):
            return ""
        return grad_sync_channel_ids(compiled_text(self._lowered()[0].compile()))

    def _lowered(self) -> list[Any]:
        """The programs of a step lowered for its inputs' shapes and shardings:
        with gradient accumulation Alpa's two (accumulate, with the gradient
        synchronisation of its last call, and apply), else the one."""
        run = self._compile_local()[0]
        structs = self._input_structs()
        if isinstance(run, AccumulatingStep):
            return list(run.lowered(structs))
        return [run.lower(*structs)]

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
        ``get_hlo_text(status)``; :mod:`alpa_ir.api.hlo_status`). The program is
        lowered from its inputs' shapes and shardings, so a state that a call
        donated is not needed; ``args`` are accepted as before and not read."""
        from alpa_ir.api.hlo_status import hlo_text, split_status

        _, which = split_status(args, status)
        return "\n".join(hlo_text(p, which) for p in self._lowered())

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

    def get_total_allocation_size(self) -> int:
        """Bytes one device allocates for the SPMD program (XLA's memory analysis
        of the program compiled for its inputs' shapes and shardings)."""
        from alpa_ir.api.executable import allocation_bytes

        return max(allocation_bytes(p.compile()) for p in self._lowered())

    def _input_structs(self) -> list[jax.ShapeDtypeStruct]:
        """The program's flat inputs as shapes, dtypes and shardings (batch
        leaves as ``[micro-batches, ...]`` when accumulating)."""
        in_shardings = self._compile_local()[1]
        avals = list(self.signature.avals)
        if self.signature.micro_batch_rows:
            avals.append(((self.signature.micro_batch_rows,), np.int32))
        b, structs = self.num_micro_batches, []
        for k, ((shape, dtype), sharding) in enumerate(zip(avals, in_shardings, strict=True)):
            if b > 1 and k in self.batch_leaves:
                shape = (b, shape[0] // b, *shape[1:])
            structs.append(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))
        return structs

    def get_input_placement_specs(self) -> Any:
        assert self.mesh.axis_names is not None
        specs = [
            partition_spec(spec_of_value(a, self.function), self.mesh.axis_names)
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
            specs.append(partition_spec(spec, self.mesh.axis_names))
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
