"""``shard-stages``: auto-shard every stage function of an outlined pipeline on its mesh.

Each function ``@main`` calls (forward, backward and apply-grad of every
stage, in call order) becomes ``@main`` of a module of its own with a copy of
its ``mesh.logical_mesh``, and a nested pass manager runs ``stage-pipeline``
on it (so verification, once after its pipeline, timing, IR dumps,
statistics and crash reproducers apply to each stage function as to any
module); the sharded function then
replaces the original. A value's layout is carried from function to function
on one mesh (:func:`alpa_ir.pipeline.stage_specs.shard_in_call_order`): an argument
already laid out there by an earlier function is given that spec.

A function without batch arguments (apply-grad) has no batch to force: the
inner passes' ``force-data-parallel`` and ``force-batch-dim-to-mesh-dim``
are switched off for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp, StringAttr, SymbolRefAttr
from xdsl.passes import ModulePass

from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.mesh import MESH_ATTR, ClusterOp, LogicalMeshOp
from alpa_ir.dialects.pipeline import plan_stages
from alpa_ir.ir.collection import frozen_heap
from alpa_ir.ir.module_utils import main_function, symbol_op, top_level_ops
from alpa_ir.pipeline.manual_stage_specs import (
    constrain_user_axes,
    parse_intermediate_axes,
    parse_mesh_axis_names,
)
from alpa_ir.pipeline.stage_specs import (
    force_stage_input_specs,
    parse_stage_specs,
    shard_in_call_order,
)

STAGE_PIPELINE = "merge-trivial-ops,auto-sharding"


def function_and_mesh(module: ModuleOp, name: str) -> tuple[func.FuncOp, LogicalMeshOp]:
    """Function ``@name`` of ``module`` and the logical mesh it runs on."""
    function = symbol_op(module, name, func.FuncOp)
    assert isinstance(function, func.FuncOp)
    ref = function.attributes[MESH_ATTR]
    assert isinstance(ref, SymbolRefAttr)
    mesh = symbol_op(module, ref.root_reference.data, LogicalMeshOp)
    assert isinstance(mesh, LogicalMeshOp)
    return function, mesh


def function_module(module: ModuleOp, name: str) -> ModuleOp:
    """A module holding a copy of ``@name`` as ``@main`` on a copy of its mesh as ``@mesh``
    (and copies of the module's ``mesh.cluster`` ops, which a cost model may price on)."""
    function, mesh = function_and_mesh(module, name)
    mesh_copy = mesh.clone()
    mesh_copy.properties["sym_name"] = StringAttr("mesh")
    copy = function.clone()
    copy.sym_name = StringAttr("main")
    copy.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
    clusters = [c.clone() for c in top_level_ops(module, ClusterOp)]  # the hardware it prices
    return ModuleOp([*clusters, mesh_copy, copy])


def _without_batch_forcing(pass_: ModulePass) -> ModulePass:
    names = {f.name for f in dataclasses.fields(pass_)}  # type: ignore[arg-type]
    changes: dict[str, object] = {}
    if "force_data_parallel" in names:
        changes["force_data_parallel"] = False
    if "force_batch_dim_to_mesh_dim" in names:
        changes["force_batch_dim_to_mesh_dim"] = -1
    return dataclasses.replace(pass_, **changes) if changes else pass_  # type: ignore[type-var]


@dataclass(frozen=True)
class ShardStages(ModulePass):
    """Auto-shard each stage function on its mesh (module docstring)."""

    name = "shard-stages"

    stage_pipeline: str = STAGE_PIPELINE
    """The passes run on each stage function (as ``@main`` of its own module),
    a pipeline string without ``builtin.module(...)``."""

    stage_pipelines: str = ""
    """Per stage (``;`` between stages), the passes run on that stage's
    functions instead of ``stage_pipeline`` (Alpa's
    ``submesh_autosharding_option_dicts``); an empty entry, or none: the
    default."""

    input_specs: str = ""
    """Specs every stage's inputs must have (Alpa's ``stage_input_shardings``;
    :func:`alpa_ir.pipeline.stage_specs.format_stage_specs`' text), given to
    the functions before they are sharded; empty: none."""

    mesh_axis_names: str = ""
    """The axis names of each stage's mesh, in the stages' order (``;``
    between meshes, ``,`` between names; one entry: every mesh), for the
    user's specs of ``@main``'s arguments (``sharding.user_axes``, Alpa's
    ``ManualShardingOption``); empty: none."""

    intermediate_axes: str = ""
    """``axis:dim`` pairs (``,`` between them) splitting each activation of
    rank 2 or more a forward function receives from another mesh's forward
    (Alpa's ``pipeline_intermediate_axes``); empty: none."""

    propagate: bool = False
    """No ILP (Alpa's ``enable_auto_sharding=False``): each function's
    arguments keep their given specs (replicated where none is given) and
    XLA's sharding propagation chooses its results' specs
    (:mod:`alpa_ir.autosharding.xla_propagation`); ``stage-pipeline`` is not run."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from alpa_ir.passmanager.pass_manager import PassManager
        from alpa_ir.passmanager.pipeline_syntax import parse_pipeline
        from alpa_ir.plugins.registry import registry_of

        registry = registry_of(ctx)
        texts = self.stage_pipelines.split(";") if self.stage_pipelines else []
        stage_of = (  # only per-stage pipelines need the plan's stages
            {
                name: k
                for k, stage in enumerate(plan_stages(op))
                for _, name in stage.phase_functions()
            }
            if texts
            else {}
        )
        parsed: dict[str, tuple[tuple[ModulePass, ...], tuple[ModulePass, ...]]] = {}

        def passes_of(name: str) -> tuple[tuple[ModulePass, ...], tuple[ModulePass, ...]]:
            """The passes for function ``name`` (with and without batch forcing)."""
            k = stage_of.get(name, -1)
            text = texts[k] if 0 <= k < len(texts) and texts[k] else self.stage_pipeline
            if text not in parsed:
                passes = tuple(parse_pipeline(f"builtin.module({text})", registry))
                parsed[text] = (passes, tuple(_without_batch_forcing(p) for p in passes))
            return parsed[text]

        def propagate(name: str) -> None:
            from alpa_ir.autosharding.xla_propagation import propagate_function  # loads JAX

            propagate_function(*function_and_mesh(op, name))

        def shard(name: str) -> None:
            single = function_module(op, name)
            batch = BATCH_ATTR in main_function(single).attributes
            passes, without_batch = passes_of(name)
            stage_passes = passes if batch else without_batch
            # the outer pipeline verifies the planned module (each stage's
            # own verification took a tenth of shard-stages on GPT-2 small)
            PassManager(registry, stage_passes, verify_each=False).run(single, ctx)
            original = symbol_op(op, name, func.FuncOp)
            assert isinstance(original, func.FuncOp)
            planned = main_function(single)
            planned.detach()  # moved, not copied: its module is dropped
            planned.sym_name = StringAttr(name)
            planned.attributes[MESH_ATTR] = original.attributes[MESH_ATTR]
            op.body.block.insert_op_before(planned, original)
            op.body.block.erase_op(original)

        if self.mesh_axis_names or self.intermediate_axes:
            constrain_user_axes(
                op,
                parse_mesh_axis_names(self.mesh_axis_names),
                parse_intermediate_axes(self.intermediate_axes),
            )
        if self.input_specs:
            force_stage_input_specs(op, parse_stage_specs(self.input_specs))
        with frozen_heap():  # the module outlives the planning of its functions
            shard_in_call_order(op, propagate if self.propagate else shard)
