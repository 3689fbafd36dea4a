"""The profiling stage cost model: stage latency measured on the local devices."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from stage_fixtures import _layers
from xdsl.dialects import func

import alpa_ir
from alpa_ir.backends.stage_profile import ProfilingStageCostModel
from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.ir.module_utils import main_function
from alpa_ir.plugins.registry import default_registry


@functools.cache
def _stage(count: int, hidden: int = 256, batch: int = 256) -> func.FuncOp:
    params = {f"layer{k}": jnp.full((hidden, hidden), 0.01) for k in range(count)}
    return main_function(alpa_ir.import_jax(_layers, params, jnp.ones((batch, hidden))))


def test_registered_as_the_profile_stage_cost_model() -> None:
    model = default_registry().get("stage_cost_models", "profile")()
    assert isinstance(model, ProfilingStageCostModel)


def test_more_work_takes_longer_and_keeps_more_activations() -> None:
    cluster = get_cluster("local-cpu")
    mesh = cluster.logical_mesh((1, 1), (0,))
    model = ProfilingStageCostModel(repeat=5)
    params_small, params_large = tuple(range(1)), tuple(range(8))
    small = model.stage_cost(_stage(1), mesh, cluster, param_args=params_small)
    large = model.stage_cost(_stage(8), mesh, cluster, param_args=params_large)
    assert 0 < small.latency < large.latency
    assert small.memory.activations < large.memory.activations
    # parameters: 256 x 256 float32 per layer, gradients 1x, Adam state 2x
    assert large.memory.parameters == 8 * 256 * 256 * 4
    assert large.memory.optimizer_state == 2 * large.memory.parameters


def test_sharding_splits_the_parameters_and_measures_the_spmd_program() -> None:
    cluster = get_cluster("local-cpu")
    params = tuple(range(2))
    one = ProfilingStageCostModel().stage_cost(
        _stage(2), cluster.logical_mesh((1, 1), (0,)), cluster, param_args=params
    )
    four = ProfilingStageCostModel().stage_cost(
        _stage(2), cluster.logical_mesh((1, 4), (0, 1, 2, 3)), cluster, param_args=params
    )
    assert four.latency > 0
    assert four.memory.parameters < one.memory.parameters
    # the same plan as the analytical model: the parameters' local shapes agree
    analytical = AnalyticalStageCostModel().stage_cost(
        _stage(2), cluster.logical_mesh((1, 4), (0, 1, 2, 3)), cluster, param_args=params
    )
    assert four.memory.parameters == analytical.memory.parameters


def test_identical_stages_are_measured_once() -> None:
    cluster = get_cluster("local-cpu")
    mesh = cluster.logical_mesh((1, 2), (0, 1))
    model = ProfilingStageCostModel()
    first = model.stage_cost(_stage(1), mesh, cluster, param_args=(0,))
    assert model.stage_cost(_stage(1), mesh, cluster, param_args=(0,)) is first
    assert (model.stats.hits, model.stats.misses) == (1, 1)


def test_a_mesh_larger_than_the_local_devices_is_an_error() -> None:
    cluster = get_cluster("alpa-testbed", num_nodes=2)
    with pytest.raises(AlpaError, match=r"16 devices .* cannot be profiled on the 8 local"):
        ProfilingStageCostModel().stage_cost(
            _stage(1), cluster.logical_mesh((2, 8)), cluster, param_args=(0,)
        )


def test_bad_options() -> None:
    with pytest.raises(AlpaError, match="repeat must be >= 1"):
        ProfilingStageCostModel(repeat=0)


def test_auto_stage_option_with_the_profile_model_equals_one_device() -> None:
    """construct-stages priced by profiling on the local devices plans a
    pipeline of the tiny MLP that trains like one device."""
    import numpy as np

    from alpa_ir.api.pipeshard import AutoLayerOption, AutoStageOption, PipeshardParallel
    from alpa_ir.models import make_train_step

    fn, (state, batch) = make_train_step("mlp-tiny")
    method = PipeshardParallel(
        devices=range(4),
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=AutoStageOption(stage_cost_model="profile"),
    )
    step = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    ours, theirs = state, state
    for _ in range(2):
        ours, loss = step(ours, batch)
        theirs, want = jax.jit(fn)(theirs, batch)
        np.testing.assert_allclose(loss, want, rtol=1e-4)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_construct_stages_pass_takes_the_model_by_name() -> None:
    from alpa_ir.passes.construct_stages import ConstructStages

    assert ConstructStages(stage_cost_model="profile").stage_cost_model == "profile"
    with pytest.raises(AlpaError, match="unknown stage cost model 'nonexistent'; known: analy"):
        from alpa_ir.ir.context import make_context

        module = alpa_ir.import_jax(lambda x: x * 2, jnp.ones(4))
        ConstructStages(cluster="local-cpu", stage_cost_model="nonexistent").apply(
            make_context(), module
        )
