"""ZeRO-3 with Adafactor (Alpa's test_moe ZeRO-3 case): the factored second
moments are reductions of the squared gradient and are broadcast back over
unit dims for the update, so the update of a weight reaches them only through
a reduction over unsplit dims and a broadcast; and an operand broadcast along
unit dims is split like the result on its other dims. Every weight and every
moment of two or more dims is then sharded, and the step computes what one
device computes."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import alpa_ir as alpa


class _Experts(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.param("w", nn.initializers.normal(0.1), (4, 8, 16))
        h = nn.relu(jnp.einsum("bm,emh->ebh", x, w))
        return nn.Dense(8)(h.sum(axis=0))


def _step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss_fn(params: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))


def test_zero3_adafactor_shards_the_factored_moments_and_equals_one_device() -> None:
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
    batch = {"x": x, "y": jnp.cos(x)}
    model = _Experts()
    params = model.init(jax.random.PRNGKey(0), x)
    tx = optax.adafactor(learning_rate=1e-2, min_dim_size_to_factor=4)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    expected = jax.jit(_step)(state, batch)
    parallel = alpa.parallelize(_step, method=alpa.Zero3Parallel(jax.local_devices()[:4]))
    actual = parallel(state, batch)
    for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    leaves = jax.tree_util.tree_flatten_with_path((actual.params, actual.opt_state))[0]
    replicated = [
        jax.tree_util.keystr(path)
        for path, leaf in leaves
        if leaf.ndim > 1 and leaf.sharding.is_fully_replicated
    ]
    assert not replicated
