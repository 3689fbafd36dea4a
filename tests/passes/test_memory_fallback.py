"""StageCostOptions.memory_fallback: a second plan with every parameter sharded
for large layers, carried through construct-stages' table (layer sums) and
taken by a stage when the first plan does not fit."""

from __future__ import annotations

import pytest
from stage_fixtures import _deep_module, _small_cluster
from xdsl.dialects import func

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.costs.stage_table import StageCostTable, ViewCost, cost_table
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.pipeline.stage_construction import solve_stages

SMALL_MEMORY = 2**13  # a 16x16 weight's state (4 KiB) is well over MEMORY_FALLBACK_FROM of it


def _middle_layer() -> tuple[func.FuncOp, tuple[int, ...]]:
    """Layer 1 of the deep test module: on 2 devices its plan replicates the weight."""
    extracted = LayerRanges(main_function(_deep_module())).function(1, 1)
    return extracted.function, extracted.param_args


def test_a_large_layer_also_gets_a_plan_with_every_parameter_sharded() -> None:
    c = _small_cluster(devices=2, memory=SMALL_MEMORY)
    mesh = c.logical_mesh((1, 2))
    function, params = _middle_layer()
    plain = AnalyticalStageCostModel().stage_cost(function, mesh, c, params)
    both = AnalyticalStageCostModel(StageCostOptions(memory_fallback=True)).stage_cost(
        function,
        mesh,
        c,
        params,
    )
    assert plain.memory_saving is None
    assert plain.memory.parameters == 16 * 16 * 4  # data parallel: the weight replicated
    saving = both.memory_saving
    assert saving is not None
    assert saving.memory.parameters == plain.memory.parameters / 2
    assert saving.memory.persistent < both.memory.persistent
    assert saving.latency > both.latency  # it pays for the memory in communication
    assert both.latency == pytest.approx(plain.latency)  # the first plan is unchanged


def test_no_second_plan_for_small_layers_or_one_device() -> None:
    model = AnalyticalStageCostModel(StageCostOptions(memory_fallback=True))
    function, params = _middle_layer()
    roomy = _small_cluster(devices=2, memory=2**40)
    cost = model.stage_cost(function, roomy.logical_mesh((1, 2)), roomy, params)
    assert cost.memory_saving is None
    tight = _small_cluster(devices=2, memory=SMALL_MEMORY)
    one = model.stage_cost(function, tight.logical_mesh((1, 1)), tight, params)
    assert one.memory_saving is None


def test_layer_sums_carry_the_memory_saving_plans() -> None:
    ranges = LayerRanges(main_function(_deep_module()))
    model = AnalyticalStageCostModel(StageCostOptions(memory_fallback=True))
    cluster = _small_cluster(devices=2, memory=SMALL_MEMORY)
    table = cost_table(ranges, cluster, model, cost_mode="layer-sum", progress=False)
    singles = [table.cost(k, k, (1, 2)) for k in range(4)]
    assert [s.memory_saving is not None for s in singles] == [False, True, True, False]
    whole = table.cost(0, 3, (1, 2))
    assert whole.memory_saving is not None
    parts = [s.memory_saving or s for s in singles]
    assert whole.memory_saving.persistent == pytest.approx(sum(p.persistent for p in parts))
    assert whole.memory_saving.latency == pytest.approx(sum(p.latency for p in parts))
    assert whole.memory_saving.persistent < whole.persistent
    # the layers inside one stage do not cross stages, in either plan
    assert whole.memory_saving.cross_bytes == whole.cross_bytes


def test_a_stage_takes_the_memory_saving_plan_only_when_the_first_does_not_fit() -> None:
    saving = ViewCost(1.5, 4.0, 1.0, 0.0)
    cost = ViewCost(1.0, 10.0, 1.0, 0.0, memory_saving=saving)
    assert cost.fitting(100.0) is cost
    assert cost.fitting(8.0) is saving
    cluster = _small_cluster(devices=2, memory=8.0)
    views = {(1, 2): (cluster.logical_mesh((1, 2)),), (1, 1): (cluster.logical_mesh((1, 1)),)}
    table = StageCostTable(cluster, ((1, 1), (1, 2)), views, 1)
    table.costs[(0, 0, (1, 2))] = cost
    table.costs[(0, 0, (1, 1))] = ViewCost(2.0, 100.0, 1.0, 0.0)
    plan = solve_stages(table, 4)
    (stage,) = plan.stages
    assert stage.submesh == (1, 2) and stage.cost is saving and stage.latency == 1.5
    table.cluster = _small_cluster(devices=2, memory=100.0)
    (roomy,) = solve_stages(table, 4).stages
    assert roomy.cost is cost and roomy.latency == 1.0


def test_the_second_plan_is_solved_to_the_fallback_gap_without_branch_and_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second plan accepts a plan within MEMORY_FALLBACK_MIP_GAP of the LP
    bound (a dived plan, without CBC proving it optimal), and runs no branch
    and bound, so that no time limit decides it; a larger gap of the options
    applies as it is, the first plan keeps the options' own."""
    from alpa_ir.costs import analytical_stage_cost
    from alpa_ir.costs.stage_cost import MEMORY_FALLBACK_MIP_GAP

    seen: list[StageCostOptions] = []
    real = analytical_stage_cost.plan_function_and_variant

    def spy(function, mesh, options, variant, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend([options, variant])  # the second plan is made from the first's graph
        return real(function, mesh, options, variant, *args, **kwargs)

    monkeypatch.setattr(analytical_stage_cost, "plan_function_and_variant", spy)
    c = _small_cluster(devices=2, memory=SMALL_MEMORY)
    function, params = _middle_layer()
    for gap in (0.01, 0.2):
        seen.clear()
        options = StageCostOptions(memory_fallback=True, mip_gap=gap)
        cost = AnalyticalStageCostModel(options).stage_cost(
            function, c.logical_mesh((1, 2)), c, params
        )
        assert cost.memory_saving is not None
        first, second = seen
        assert (first.mip_gap, first.allow_replicated_parameters) == (gap, True)
        assert second.mip_gap == max(gap, MEMORY_FALLBACK_MIP_GAP)
        assert not second.allow_replicated_parameters
        # no time limit of its own: no branch and bound (the same plan at any load)
        assert second.time_limit == first.time_limit
        assert not second.branch_and_bound and first.branch_and_bound
