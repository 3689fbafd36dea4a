"""The default communication cost model (issue #25, scope 4): ``auto`` prices a mesh of
GPUs with ``calibrated`` (within 10 % of the P² simulator for every kind) and any other
mesh with Alpa's ``alpha-beta``; auto-sharding, the stage cost model and the API use it."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp
from zoo_fixtures import tiny_step

from alpa_ir import import_jax
from alpa_ir.api.sharding_options import AutoShardingOption
from alpa_ir.autosharding.cost_model import AlphaBetaCostModel
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.function_plan import bound_cost_model, collective_time, plan_function
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.hardware.clusters import Cluster, ClusterLevel, get_cluster
from alpa_ir.ir.module_utils import main_function
from alpa_ir.p2.calibrated import CalibratedCostModel
from alpa_ir.p2.default_cost_model import DefaultCostModel
from alpa_ir.passes.auto_sharding import AutoSharding
from alpa_ir.passes.construct_stages import ConstructStages
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.tools.bench_cost_model_prices import PRESETS

GPU_PRESETS = (*PRESETS, "alpa-testbed", "dgx-a100", "dgx-h100", "gcp-a100", "gcp-v100")


def test_every_default_is_auto() -> None:
    assert AutoShardingOption().cost_model == AutoSharding().cost_model == "auto"
    assert StageCostOptions().cost_model == ConstructStages().cost_model == "auto"
    assert isinstance(default_registry().get("cost_models", "auto")(), DefaultCostModel)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_the_default_on_every_gpu_preset_is_calibrated(preset: str) -> None:
    """Its prices are then those ``test_cost_model_prices`` checks against the simulator."""
    cluster = get_cluster(preset, presets=default_registry().cluster_presets)
    assert DefaultCostModel.for_cluster(cluster) == CalibratedCostModel.for_cluster(cluster)


def test_the_default_elsewhere_is_alphas() -> None:
    assert DefaultCostModel.for_cluster(get_cluster("local-cpu")) == AlphaBetaCostModel()
    by_hand = Cluster("lab", (ClusterLevel("gpu", 4, 1e10, 1e-5),), 16e9, 1e14)
    assert DefaultCostModel.for_cluster(by_hand) == AlphaBetaCostModel()
    bare = get_cluster("local-cpu").logical_mesh((1, 1)).to_op("mesh")
    assert DefaultCostModel().for_module(ModuleOp([bare]), bare, "") == AlphaBetaCostModel()


def _planned(cost_model: str, with_cluster: bool) -> float:
    """The objective of mlp-tiny auto-sharded on alpa-testbed's (2, 4) mesh."""
    fn, args = tiny_step("mlp-tiny")
    module = import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,))
    cluster = get_cluster("alpa-testbed")
    mesh_op = cluster.logical_mesh((2, 4)).to_op("mesh")
    if with_cluster:
        mesh_op.properties["cluster"] = FlatSymbolRefAttr("testbed")
        module.body.block.insert_op_before(cluster.to_op("testbed"), main_function(module))
    module.body.block.insert_op_before(mesh_op, main_function(module))
    main_function(module).attributes["mesh.mesh"] = FlatSymbolRefAttr("mesh")
    option = "" if cost_model == "default" else f"{{cost-model={cost_model}}}"
    PassManager(default_registry(), f"builtin.module(auto-sharding{option})").run(module)
    return main_function(module).attributes["sharding.objective"].value.data  # type: ignore[attr-defined]


def test_auto_sharding_prices_a_gpu_mesh_with_calibrated_by_default() -> None:
    """On a mesh of alpa-testbed the default plan's objective is the calibrated one (µs),
    not Alpa's (seconds, from the mesh's own α and β); without the cluster it is Alpa's."""
    default = _planned("default", with_cluster=True)
    assert default == pytest.approx(_planned("calibrated", with_cluster=True), rel=1e-9)
    alpas = _planned("alpha-beta", with_cluster=True)
    assert default > 100 * alpas  # microseconds against seconds
    assert _planned("default", with_cluster=False) == pytest.approx(alpas, rel=1e-9)


def test_the_stage_cost_model_prices_communication_with_the_bound_model() -> None:
    """A stage's communication time is the calibrated seconds of its collectives on a GPU
    cluster, Alpa's α-β seconds with ``cost_model="alpha-beta"``; the planned functions
    of both are kept apart in the strategy caches."""
    fn, args = tiny_step("mlp-tiny")
    function = main_function(import_jax(fn, *args, batch_argnums=(1,)))
    cluster = get_cluster("alpa-testbed", num_devices=16)
    mesh = cluster.logical_mesh((2, 8))
    times = {}
    for name in ("auto", "alpha-beta"):
        options = StageCostOptions(cost_model=name, mip_gap=0.0)
        cost = AnalyticalStageCostModel(options).stage_cost(function, mesh, cluster)
        planned = plan_function(function, mesh, options, cluster=cluster)
        pricer = bound_cost_model(name, cluster)
        want, count = collective_time(planned, mesh, pricer)
        assert count > 0 and cost.communication_time == pytest.approx(want, rel=1e-9)
        times[name] = cost.communication_time
    assert isinstance(bound_cost_model("auto", cluster), CalibratedCostModel)
    assert times["auto"] != pytest.approx(times["alpha-beta"], rel=1e-3)
    caches: dict = {}
    for name in ("auto", "alpha-beta"):
        plan_function(function, mesh, StageCostOptions(cost_model=name), caches, cluster=cluster)
    assert len(caches) == 2
