"""The stage cost model binds its communication cost model to a cluster once
and passes it to every plan it makes (``plan_function``'s ``cost_model``):
the plans equal those made with a model bound afresh."""

from __future__ import annotations

import pytest
from stage_fixtures import _deep_module

from alpa_ir.costs import function_plan
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.function_plan import bound_cost_model, plan_function
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges


def test_one_bound_cost_model_gives_the_plans_of_fresh_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = get_cluster("alpa-testbed", num_devices=8)  # GPUs: the calibrated model
    function = LayerRanges(main_function(_deep_module())).function(1, 1).function
    options = StageCostOptions(num_micro_batches=2)
    model = AnalyticalStageCostModel(options)
    bound: list[object] = []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        bound.append(args)
        return bound_cost_model(*args, **kwargs)

    monkeypatch.setattr(function_plan, "bound_cost_model", counted)
    for shape in ((1, 2), (2, 2)):
        mesh = cluster.logical_mesh(shape)
        shared = model._pricer(cluster, options)
        with_shared = plan_function(function, mesh, options, {}, cluster=cluster, cost_model=shared)  # type: ignore[arg-type]
        assert not bound  # the caller's model was used
        fresh = plan_function(function, mesh, options, {}, cluster=cluster)
        assert len(bound) == 1
        bound.clear()
        assert str(with_shared) == str(fresh)
