"""Alpa's ``TrainState`` (``alpa_ir.model.model_util``): Flax's, with a
float32 master copy under float16 parameters, parallelized as Alpa's tests
use it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import alpa_ir
from alpa_ir.model.model_util import TrainState
from alpa_ir.testing import assert_allclose


def _params() -> dict[str, jax.Array]:
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    return {"w": jax.random.normal(k[0], (16, 8)), "b": jax.random.normal(k[1], (8,))}


def _step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(p: dict[str, Any]) -> jax.Array:
        return jnp.mean((batch["x"] @ p["w"].astype(jnp.float32) + p["b"] - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_without_master_copy_it_is_flax_train_state() -> None:
    from flax.training.train_state import TrainState as FlaxTrainState

    params = _params()
    ours = TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-2))
    flax_state = FlaxTrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-2))
    assert ours.master_copy is None and ours.dynamic_scale is None
    grads = jax.tree.map(jnp.ones_like, params)
    assert_allclose(
        ours.apply_gradients(grads=grads).params, flax_state.apply_gradients(grads=grads).params
    )
    assert int(ours.apply_gradients(grads=grads).step) == 1


def test_master_copy_keeps_float32_under_float16_params() -> None:
    state = TrainState.create(
        apply_fn=None, params=_params(), tx=optax.sgd(0.1), use_master_copy=True
    )
    assert state.params["w"].dtype == jnp.float16
    assert state.master_copy["w"].dtype == jnp.float32
    grads = jax.tree.map(lambda x: jnp.full(x.shape, 1e-3, jnp.float32), state.params)
    new = state.apply_gradients(grads=grads)
    # the update is smaller than float16 resolves near 1; the master copy keeps it
    np.testing.assert_allclose(new.master_copy["w"], state.master_copy["w"] - 1e-4, rtol=1e-6)
    assert new.params["w"].dtype == jnp.float16


def test_parallelized_step_on_alpa_train_state() -> None:
    k = jax.random.split(jax.random.PRNGKey(1), 2)
    batch = {"x": jax.random.normal(k[0], (32, 16)), "y": jax.random.normal(k[1], (32, 8))}
    state = TrainState.create(apply_fn=None, params=_params(), tx=optax.adam(1e-2))
    expected = jax.jit(_step)(state, batch)
    actual = alpa_ir.parallelize(_step, method=alpa_ir.DataParallel())(state, batch)
    assert_allclose(expected.params, actual.params, atol=1e-5)
    assert int(actual.step) == 1
