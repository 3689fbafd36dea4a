"""Alpa's CreateStateParallel and FollowParallel: a state created where the
train step reads it, and an evaluation step that keeps the train step's
parameter specs; each equal to one device."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import alpa_ir


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(16)(x)


def _create_state() -> TrainState:
    model = _Model()
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 16)))
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


def _train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(params: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def _eval_step(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean((_Model().apply(params, batch["x"]) - batch["y"]) ** 2)


def _batch(rows: int) -> dict[str, jax.Array]:
    rng = np.random.default_rng(rows)
    return {
        "x": jnp.asarray(rng.normal(size=(rows, 16)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(rows, 16)), jnp.float32),
    }


def _close(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def test_create_state_puts_the_state_where_the_step_reads_it_and_follow_keeps_it() -> None:
    batch = _batch(32)
    train = alpa_ir.parallelize(_train_step, method=alpa_ir.Zero3Parallel())
    create = alpa_ir.parallelize(_create_state, method=alpa_ir.CreateStateParallel(train, batch))
    state = create()
    wanted = train.get_executable(state, batch).get_input_shardings()[0]
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(wanted), strict=True):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    # ZeRO-3 splits the parameters: the state is created split, not replicated
    assert not all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state.params))
    _close(state.params, _create_state().params)

    want = jax.jit(_train_step)(_create_state(), batch)
    state = train(state, batch)
    _close(state.params, want.params)

    evaluate = alpa_ir.parallelize(_eval_step, method=alpa_ir.FollowParallel(train))
    eval_batch = _batch(64)
    loss = evaluate(state.params, eval_batch)
    np.testing.assert_allclose(loss, _eval_step(want.params, eval_batch), rtol=1e-5)
    np.testing.assert_allclose(evaluate(state.params, eval_batch), loss)  # called again
    specs = evaluate.get_last_executable().get_input_placement_specs()[0]
    assert specs == train.get_last_executable().get_input_placement_specs()[0].params


def test_create_state_for_a_pipelined_step_uses_its_stage_meshes() -> None:
    """The state of a pipelined step is created on its stages' submeshes; the
    step reports where its inputs and outputs live (Alpa's placement specs)."""
    batch = _batch(32)

    def step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
        def loss(params: Any) -> jax.Array:
            return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

        return state.apply_gradients(grads=alpa_ir.grad(loss)(state.params))

    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option=alpa_ir.AutoLayerOption(layer_num=2)
    )
    train = alpa_ir.parallelize(step, method=method)
    create = alpa_ir.parallelize(_create_state, method=alpa_ir.CreateStateParallel(train, batch))
    state = create()
    wanted = train.get_executable(state, batch).get_input_shardings()[0]
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(wanted), strict=True):
        assert leaf.sharding == sharding
    new_state = train(state, batch)
    _close(new_state.params, jax.jit(step)(_create_state(), batch).params)
    # Alpa's accessors of a pipelined step: where its inputs and outputs live
    executable = train.get_last_executable()
    assert executable.get_input_placement_specs() == executable.get_input_shardings()
    reported = jax.tree.leaves(
        executable.get_output_placement_specs(),
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )
    assert len({frozenset(s.device_set) for s in reported}) == 2  # both stages' submeshes
    for leaf, sharding in zip(jax.tree.leaves(new_state), reported, strict=True):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    # an eval step follows it (tests/api/test_follow_pipeline.py)
    evaluate = alpa_ir.parallelize(_eval_step, method=alpa_ir.FollowParallel(train))
    params = jax.device_get(new_state.params)
    np.testing.assert_allclose(evaluate(params, batch), _eval_step(params, batch), rtol=1e-5)
