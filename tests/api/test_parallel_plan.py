"""Alpa's parallel plans: a compiled step's plan pickles, and
``plan_to_method`` compiles the same plan again (one mesh: the same input
specs and objective; a pipeline: the same stages and placements), equal to
one device."""

from __future__ import annotations

import pickle
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.errors import AlpaError

_RNG = np.random.default_rng(0)
PARAMS = {f"w{i}": jnp.asarray(_RNG.normal(size=(32, 32)) * 0.2, jnp.float32) for i in range(4)}
BATCH = {
    "x": jnp.asarray(_RNG.normal(size=(64, 32)), jnp.float32),
    "y": jnp.asarray(_RNG.normal(size=(64, 32)), jnp.float32),
}


def _step(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> Any:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        h = batch["x"]
        for i in range(4):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean((h - batch["y"]) ** 2)

    value, grads = alpa_ir.value_and_grad(loss)(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads), value


def _replanned(method: Any) -> tuple[Any, Any]:
    first = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable = first.get_executable(PARAMS, BATCH)
    plan = pickle.loads(pickle.dumps(executable.get_parallel_plan()))
    again = alpa_ir.parallelize(_step, method=alpa_ir.plan_to_method(plan), donate_argnums=())
    want = jax.jit(_step)(PARAMS, BATCH)
    got = again(PARAMS, BATCH)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return executable, again.get_last_executable()


def test_a_shard_parallel_plan_compiles_again_to_the_same_plan() -> None:
    """The state is a TrainState whose optimizer (a closure) does not pickle:
    the plan keeps one spec per input array, as Alpa's."""
    import optax
    from flax.training.train_state import TrainState

    state = TrainState.create(
        apply_fn=None, params=PARAMS, tx=optax.chain(optax.sgd(0.1, momentum=0.9))
    )

    def step(state: TrainState, batch: dict[str, jax.Array]) -> Any:
        params, value = _step(state.params, batch)
        return state.replace(params=params), value

    method = alpa_ir.ShardParallel(
        num_micro_batches=2,
        auto_sharding_option=alpa_ir.AutoShardingOption(force_data_parallel=True),
    )
    first = alpa_ir.parallelize(step, method=method, donate_argnums=())
    before = first.get_executable(state, BATCH)
    plan = pickle.loads(pickle.dumps(before.get_parallel_plan()))
    again = alpa_ir.parallelize(step, method=alpa_ir.plan_to_method(plan), donate_argnums=())
    got, want = again(state, BATCH), jax.jit(step)(state, BATCH)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    after = again.get_last_executable()
    assert after.get_input_placement_specs() == before.get_input_placement_specs()
    assert after.auto_sharding_objective == before.auto_sharding_objective
    assert after.mesh.shape == before.mesh.shape


def test_a_plan_of_a_state_with_a_none_field_keeps_one_spec_per_array() -> None:
    """Alpa's TrainState holds ``dynamic_scale=None``: a None subtree is no
    input array, so the plan keeps 6 specs (4 weights, x, y), not 7."""
    params = {**PARAMS, "scale": None}
    method = alpa_ir.ShardParallel(
        num_micro_batches=2,
        auto_sharding_option=alpa_ir.AutoShardingOption(force_data_parallel=True),
    )
    before = alpa_ir.parallelize(_step, method=method, donate_argnums=()).get_executable(
        params, BATCH
    )
    plan = pickle.loads(pickle.dumps(before.get_parallel_plan()))
    assert len(plan.input_placement_specs) == 6
    again = alpa_ir.parallelize(_step, method=alpa_ir.plan_to_method(plan), donate_argnums=())
    after = again.get_executable(params, BATCH)
    assert after.auto_sharding_objective == before.auto_sharding_objective


def test_a_pipeshard_plan_keeps_its_stages() -> None:
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option=alpa_ir.AutoLayerOption(layer_num=2)
    )
    before, after = _replanned(method)
    assert after.placements == before.placements
    assert after.get_input_placement_specs() == before.get_input_placement_specs()
    placed = jax.tree.leaves(before.get_parallel_plan().input_placement_specs)
    assert {p.device_ids for p in placed} == {(0, 1, 2, 3), (4, 5, 6, 7)}  # the two stages


def test_plan_to_method_refuses_what_is_not_a_plan() -> None:
    with pytest.raises(AlpaError, match="plan_to_method needs a ParallelPlan, got dict"):
        alpa_ir.plan_to_method({})
