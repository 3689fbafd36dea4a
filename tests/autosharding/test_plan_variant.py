"""A plan variant (``ShardingPlanner.plan(variant=...)``): a second plan under
options that change only the arguments' strategies, made from the first
plan's strategy graph, equals planning the function again with those options
(the memory-fallback plan of the stage cost model is made this way)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from stage_fixtures import _deep_module, _small_cluster

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.function_plan import plan_function, plan_function_and_variant
from alpa_ir.costs.stage_cost import MEMORY_FALLBACK_MIP_GAP, StageCostOptions
from alpa_ir.errors import AlpaError
from alpa_ir.ir.context import make_context
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges


def _sharded(options: StageCostOptions) -> StageCostOptions:
    """The options the stage cost model plans its memory-saving plan with."""
    return replace(
        options,
        allow_replicated_parameters=False,
        mip_gap=max(options.mip_gap, MEMORY_FALLBACK_MIP_GAP),
        branch_and_bound=False,
    )


@pytest.mark.parametrize("devices, shape", [(2, (1, 2)), (4, (2, 2))])
def test_the_variant_is_the_plan_made_from_the_start(devices: int, shape: tuple[int, int]) -> None:
    cluster = _small_cluster(devices=devices)
    mesh = cluster.logical_mesh(shape)
    function = LayerRanges(main_function(_deep_module())).function(0, 3).function
    options = StageCostOptions(num_micro_batches=4)
    planned, variant = plan_function_and_variant(
        function, mesh, options, _sharded(options), {}, cluster=cluster
    )
    assert variant is not None
    second = variant()
    # the first plan keeps a weight whole on every device, the second cannot
    assert str(planned) != str(second)
    assert str(planned) == str(plan_function(function, mesh, options, {}, cluster=cluster))
    assert str(second) == str(plan_function(function, mesh, _sharded(options), {}, cluster=cluster))


def test_the_stage_cost_models_second_plan_is_unchanged() -> None:
    """The memory-saving plan priced from the variant equals the one priced from
    a plan made from the start (the model's slow path)."""
    cluster = _small_cluster(devices=2, memory=2**13)
    mesh = cluster.logical_mesh((1, 2))
    extracted = LayerRanges(main_function(_deep_module())).function(1, 1)
    options = StageCostOptions(memory_fallback=True)
    model = AnalyticalStageCostModel(options)
    cost = model.stage_cost(extracted.function, mesh, cluster, extracted.param_args)
    assert cost.memory_saving is not None
    sharded_options = _sharded(options)
    again = plan_function(extracted.function, mesh, sharded_options, {}, cluster=cluster)
    slow = model.price_planned(again, mesh, cluster, extracted.param_args, sharded_options)
    assert cost.memory_saving == slow


def test_a_variant_changes_only_the_arguments_strategies() -> None:
    from alpa_ir.autosharding.planner import ShardingOptions, ShardingPlanner

    module = _deep_module()
    planner = ShardingPlanner(ShardingOptions(mesh_shape=(1, 2)))
    with pytest.raises(AlpaError, match="a plan variant may change only allow_replicated"):
        planner.plan(make_context(), module, variant=ShardingOptions(allow_all_gather=False))


def test_a_solver_without_branch_and_bound_fails_only_the_variant() -> None:
    """A plugin solver with no ``branch_and_bound`` setting makes the first plan;
    only the variant, which turns branch and bound off, is refused."""
    from alpa_ir.autosharding.planner import ShardingOptions, ShardingPlanner
    from alpa_ir.plugins.hookspecs import hookimpl
    from alpa_ir.plugins.registry import load_registry
    from alpa_ir.solvers import cbc_solver

    class PlainSolver:  # not a dataclass: no settings to replace
        name = "plain"

        def solve(self, problem: object, **kwargs: object) -> object:
            return cbc_solver().solve(problem, **kwargs)  # type: ignore[arg-type]

    class Plugin:
        @staticmethod
        @hookimpl
        def alpa_ir_solvers() -> dict:
            return {"plain": PlainSolver}

    ctx = make_context(load_registry(extra_plugins=[Plugin()]))
    options = ShardingOptions(mesh_shape=(1, 2), solver="plain")
    variant = ShardingPlanner(options).plan(
        ctx, _deep_module(), variant=replace(options, branch_and_bound=False)
    )
    assert variant is not None
    with pytest.raises(AlpaError, match="solver 'plain' has no branch-and-bound setting"):
        variant.plan()
