"""A donated state comes back as its own new value whatever the step returns:
a bare pytree (``return state.apply_gradients(...)``, Alpa's and Flax's usual
step) as well as a tuple (``return state, loss``). Each output leaf is matched
with the donated input leaf at the same path (below the argument; below the
output element, or below the output when it is one bare pytree), so the
plan aliases their buffers, keeps the state in its input layout and ZeRO-2's
reduce-scatter shards the weight update."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import alpa_ir
from alpa_ir.costs.collective_accounting import hlo_collectives


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(16)(x)


def _state_and_batch() -> tuple[TrainState, dict[str, jax.Array]]:
    model = _MLP()
    x = jax.random.normal(jax.random.key(0), (32, 16))
    y = jax.random.normal(jax.random.key(1), (32, 16))
    params = model.init(jax.random.key(2), x)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    return state, {"x": x, "y": y}


def _grads(state: TrainState, batch: dict[str, jax.Array]) -> Any:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(p, batch["x"]) - batch["y"]) ** 2)

    return jax.grad(loss)(state.params)


def bare_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    return state.apply_gradients(grads=_grads(state, batch))


def tuple_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
    return state.apply_gradients(grads=_grads(state, batch)), jnp.float32(0)


@pytest.mark.parametrize("step", [bare_step, tuple_step], ids=["bare", "tuple"])
def test_zero2_aliases_a_flax_train_state(step: Any) -> None:
    state, batch = _state_and_batch()
    want = jax.jit(step)(state, batch)
    p_step = alpa_ir.parallelize(step, method=alpa_ir.Zero2Parallel())
    executable = p_step.get_executable(state, batch)
    in_shardings = jax.tree.leaves(executable.get_input_shardings()[0])
    want_state = want if step is bare_step else want[0]
    got = p_step(state, batch)
    new_state = got if step is bare_step else got[0]
    # the state comes back in its input layout (each leaf aliased with its input)
    n_state = len(jax.tree.leaves(state))
    assert len(executable.donated) == n_state
    for leaf, sharding in zip(jax.tree.leaves(new_state), in_shardings, strict=True):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    # ZeRO-2 fired: the weights' gradients are reduce-scattered, not all-reduced
    kinds = [c.kind for c in hlo_collectives(executable.get_hlo_text(want_state, batch))]
    assert "reduce-scatter" in kinds, kinds
    for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(want_state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the new state is a valid donated argument of the next call
    p_step(new_state, batch)


def test_output_paths_of_a_bare_pytree_and_of_a_tuple() -> None:
    from alpa_ir.frontend.output_paths import output_paths

    state = {"params": {"w": 1}, "opt": (2,)}
    assert [p for p, _ in output_paths(state)] == [
        [(jax.tree_util.DictKey("opt"), jax.tree_util.SequenceKey(0))],
        [(jax.tree_util.DictKey("params"), jax.tree_util.DictKey("w"))],
    ]
    (first, _), *_ = output_paths((state, 3))
    assert first == [
        (jax.tree_util.DictKey("opt"), jax.tree_util.SequenceKey(0)),
        (jax.tree_util.SequenceKey(0), jax.tree_util.DictKey("opt"), jax.tree_util.SequenceKey(0)),
    ]
