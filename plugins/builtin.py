"""The built-in plugin: registers every dialect, pass, solver, backend, cost model,
sharding rule and cluster preset of alpa_ir through the public hooks.

Imports happen inside the hooks so that loading the registry stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alpa_ir.plugins.hookspecs import hookimpl


@hookimpl
def alpa_ir_dialects() -> Sequence[Any]:
    from alpa_ir.dialects.lax import Lax
    from alpa_ir.dialects.mesh import Mesh
    from alpa_ir.dialects.pipeline import Pipeline
    from alpa_ir.dialects.sharding import Sharding

    return [Lax, Mesh, Sharding, Pipeline]


@hookimpl
def alpa_ir_passes() -> Sequence[type]:
    from alpa_ir.passes.auto_sharding import AutoSharding
    from alpa_ir.passes.cluster_operators import ClusterOperators
    from alpa_ir.passes.construct_stages import ConstructStages
    from alpa_ir.passes.cross_mesh_resharding import CrossMeshResharding
    from alpa_ir.passes.draw_micro_batch_rows import DrawMicroBatchRows
    from alpa_ir.passes.emit_instructions import EmitInstructions
    from alpa_ir.passes.merge_trivial_ops import MergeTrivialOps
    from alpa_ir.passes.mirror_layers import MergeBackwardRuns, MirrorLayers
    from alpa_ir.passes.outline_stages import OutlineStages
    from alpa_ir.passes.reduce_scatter_rewrite import ReduceScatterRewrite
    from alpa_ir.passes.shard_stages import ShardStages
    from alpa_ir.passes.split_conditionals import SplitConditionals
    from alpa_ir.passes.synthesize_placement import SynthesizePlacement
    from alpa_ir.passes.synthesize_reductions import SynthesizeReductions

    return [
        MergeTrivialOps,
        AutoSharding,
        ReduceScatterRewrite,
        ClusterOperators,
        SplitConditionals,
        DrawMicroBatchRows,
        MergeBackwardRuns,
        MirrorLayers,
        OutlineStages,
        ConstructStages,
        ShardStages,
        SynthesizePlacement,
        SynthesizeReductions,
        CrossMeshResharding,
        EmitInstructions,
    ]


@hookimpl
def alpa_ir_cost_models() -> Mapping[str, Callable[[], Any]]:
    from alpa_ir.autosharding.cost_model import AlphaBetaCostModel
    from alpa_ir.p2.cost_model import P2CostModel

    return {"alpha-beta": AlphaBetaCostModel, "p2": P2CostModel}


@hookimpl
def alpa_ir_backends() -> Mapping[str, Callable[[], Any]]:
    from alpa_ir.backends.ray import RayBackend
    from alpa_ir.backends.simulate import SimulateBackend
    from alpa_ir.backends.xla import XlaBackend
    from alpa_ir.backends.xla_pipeline import XlaPipelineBackend

    return {
        "xla": XlaBackend,
        "xla-pipeline": XlaPipelineBackend,
        "simulate": SimulateBackend,
        "ray": RayBackend,
    }


@hookimpl
def alpa_ir_solvers() -> Mapping[str, Callable[[], Any]]:
    from alpa_ir.solvers import cbc_solver, highs_solver

    return {"cbc": cbc_solver, "highs": highs_solver}


@hookimpl
def alpa_ir_stage_cost_models() -> Mapping[str, Callable[[], Any]]:
    from alpa_ir.stage_cost import AnalyticalStageCostModel
    from alpa_ir.stage_profile import ProfilingStageCostModel

    return {"analytical": AnalyticalStageCostModel, "profile": ProfilingStageCostModel}


@hookimpl
def alpa_ir_sharding_rules() -> Mapping[str, Any]:
    from alpa_ir.autosharding.rules import RULES

    return RULES


@hookimpl
def alpa_ir_cluster_presets() -> Mapping[str, Callable[..., Any]]:
    from alpa_ir.clusters import builtin_presets

    return builtin_presets()


@hookimpl
def alpa_ir_pipelines() -> Mapping[str, Any]:
    """One per single-mesh method: exactly the pipeline the method builds (one
    micro-batch; the method's own string adds its micro-batch count)."""
    from alpa_ir.plugins.registry import NamedPipeline
    from alpa_ir.sharding_options import (
        AutoShardingOption,
        data_parallel_option,
        heuristic_option,
    )

    options = {
        "shard-parallel": ("ShardParallel(): the ILP's plan", AutoShardingOption()),
        "data-parallel": ("DataParallel(): batch split, gradients all-reduced",
                          data_parallel_option("none")),
        "zero2-parallel": ("Zero2Parallel(): data parallel, optimizer state sharded (ZeRO-2)",
                           data_parallel_option("zero2")),
        "zero3-parallel": ("Zero3Parallel(): ZeRO-2 plus sharded parameters (ZeRO-3)",
                           data_parallel_option("zero3")),
        "heuristic-parallel": ("HeuristicParallel(): Alpa's Heuristic baseline",
                               heuristic_option()),
    }  # fmt: skip
    return {
        name: NamedPipeline(description, option.pipeline(1))
        for name, (description, option) in options.items()
    }
