"""The built-in plugin: registers every dialect, pass, solver, backend, cost model,
sharding rule and cluster preset of alpa_ir through the public hooks.

Dialects, passes, backends, solvers and cost models are contributed as
:class:`~alpa_ir.plugins.registry.Lazy` names (module and attribute), so that
loading the registry imports none of them, nor JAX or a solver; the other
hooks import inside the hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from alpa_ir.plugins.contributions import Lazy, NamedPipeline
from alpa_ir.plugins.hookspecs import hookimpl


@hookimpl
def alpa_ir_dialects() -> Mapping[str, Any]:
    return {
        "lax": Lazy("alpa_ir.dialects.lax", "Lax"),
        "mesh": Lazy("alpa_ir.dialects.mesh", "Mesh"),
        "sharding": Lazy("alpa_ir.dialects.sharding", "Sharding"),
        "pipeline": Lazy("alpa_ir.dialects.pipeline", "Pipeline"),
    }


PASSES = {
    "merge-trivial-ops": "merge_trivial_ops.MergeTrivialOps",
    "auto-sharding": "auto_sharding.AutoSharding",
    "reduce-scatter-rewrite": "reduce_scatter_rewrite.ReduceScatterRewrite",
    "cluster-operators": "cluster_operators.ClusterOperators",
    "split-conditionals": "split_conditionals.SplitConditionals",
    "draw-micro-batch-rows": "draw_micro_batch_rows.DrawMicroBatchRows",
    "merge-backward-runs": "merge_backward_runs.MergeBackwardRuns",
    "mirror-layers": "mirror_layers.MirrorLayers",
    "outline-stages": "outline_stages.OutlineStages",
    "construct-stages": "construct_stages.ConstructStages",
    "shard-stages": "shard_stages.ShardStages",
    "synthesize-placement": "synthesize_placement.SynthesizePlacement",
    "synthesize-reductions": "synthesize_reductions.SynthesizeReductions",
    "split-backward": "split_backward.SplitBackward",
    "cross-mesh-resharding": "cross_mesh_resharding.CrossMeshResharding",
    "emit-instructions": "emit_instructions.EmitInstructions",
}
"""Each built-in pass: its module under ``alpa_ir.passes`` and class."""


def _lazy(package: str, path: str) -> Lazy:
    module, attribute = path.rsplit(".", 1)
    return Lazy(f"{package}.{module}", attribute)


@hookimpl
def alpa_ir_passes() -> Mapping[str, Any]:
    return {name: _lazy("alpa_ir.passes", path) for name, path in PASSES.items()}


@hookimpl
def alpa_ir_cost_models() -> Mapping[str, Callable[..., Any]]:
    return {
        "alpha-beta": Lazy("alpa_ir.autosharding.cost_model", "AlphaBetaCostModel"),
        "p2": Lazy("alpa_ir.p2.cost_model", "P2CostModel"),
        "calibrated": Lazy("alpa_ir.p2.calibrated", "CalibratedCostModel"),
        "auto": Lazy("alpa_ir.p2.default_cost_model", "DefaultCostModel"),
    }


@hookimpl
def alpa_ir_backends() -> Mapping[str, Callable[..., Any]]:
    return {
        "xla": Lazy("alpa_ir.backends.xla", "XlaBackend"),
        "xla-pipeline": Lazy("alpa_ir.backends.xla_pipeline", "XlaPipelineBackend"),
        "simulate": Lazy("alpa_ir.backends.simulate", "SimulateBackend"),
        "ray": Lazy("alpa_ir.backends.ray", "RayBackend"),
    }


@hookimpl
def alpa_ir_solvers() -> Mapping[str, Callable[..., Any]]:
    return {
        "cbc": Lazy("alpa_ir.solvers", "cbc_solver"),
        "highs": Lazy("alpa_ir.solvers", "highs_solver"),
    }


@hookimpl
def alpa_ir_stage_cost_models() -> Mapping[str, Callable[..., Any]]:
    return {
        "analytical": Lazy("alpa_ir.costs.analytical_stage_cost", "AnalyticalStageCostModel"),
        "profile": Lazy("alpa_ir.backends.stage_profile", "ProfilingStageCostModel"),
    }


@hookimpl
def alpa_ir_sharding_rules() -> Mapping[str, Any]:
    from alpa_ir.autosharding.rules import RULES

    return RULES


@hookimpl
def alpa_ir_cluster_presets() -> Mapping[str, Callable[..., Any]]:
    from alpa_ir.hardware.clusters import builtin_presets
    from alpa_ir.p2.system_clusters import p2_cluster_presets

    return {**builtin_presets(), **p2_cluster_presets()}


@hookimpl
def alpa_ir_pipelines() -> Mapping[str, Any]:
    """One per single-mesh method: exactly the pipeline the method builds (one
    micro-batch; the method's own string adds its micro-batch count)."""
    from alpa_ir.api.sharding_options import (
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


@hookimpl
def alpa_ir_schedules() -> Mapping[str, Callable[..., Any]]:
    from alpa_ir.pipeline.schedule_kinds import BUILTIN_SCHEDULES

    return BUILTIN_SCHEDULES
