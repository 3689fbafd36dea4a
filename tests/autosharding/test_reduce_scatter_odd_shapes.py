"""ZeRO-2 shards the optimizer state of a parameter whose gradient reaches its
update through a reduction over unit dims, and of one whose leading dim does
not divide by the mesh:

- a bias added to a rank-3 activation by NumPy broadcasting
  (``h + b``: ``b`` is expanded to ``(1, 1, n)`` first) has the gradient
  ``reduce_sum(reshape(sum, (1, 1, n)), axes=(0, 1))``: a reduction over unit
  dims only (a reshape in effect), which the update follows since 625398c.
  Before, the update stopped at it and the bias kept its all-reduce and a
  whole Adam state on every device: at a4cb4db Alpa's BERT MLM
  ``data_parallel_reduce_scatter`` test counted its one all-reduce on this
  bias (the LM head's), not on the table Alpa keeps (below);
- a table of 2 rows on 4 devices (BERT's token-type embedding) is split along
  its second dim. Alpa leaves it whole, by every sign because it splits a
  table along its rows only: its test_bert ZeRO-3 twin names ``token_embed``
  as the one table left unsharded, and ``mlm_data_parallel_reduce_scatter``
  asserts one all-reduce and at most one parameter's Adam state unsharded.
  Same bytes moved either way; this plan holds a quarter of that state per
  device.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

import alpa_ir as alpa
from alpa_ir.dialects.sharding import AllReduceOp, ReduceScatterOp
from alpa_ir.dialects.types import shape_of


class _TypedDense(nn.Module):
    @nn.compact
    def __call__(self, ids: jax.Array, x: jax.Array) -> jax.Array:
        bias = self.param("bias", nn.initializers.normal(0.1), (16,))
        h = nn.Dense(16, use_bias=False)(x) + nn.Embed(2, 16)(ids)
        return h + bias  # rank 1 onto rank 3 by broadcasting


def _step(state: train_state.TrainState, batch: dict[str, jax.Array]) -> Any:
    def loss_fn(p: Any) -> jax.Array:
        out = state.apply_fn(p, batch["ids"], batch["x"])
        return jnp.mean((out - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss_fn)(state.params))


def test_broadcast_bias_and_two_row_table_are_sharded_under_zero2() -> None:
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (8, 4, 16))
    ids = (jnp.arange(32).reshape(8, 4) % 2).astype(jnp.int32)
    batch = {"ids": ids, "x": x, "y": jnp.sin(x)}
    model = _TypedDense()
    params = model.init(key, ids, x)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(0.1))
    expected = jax.jit(_step)(state, batch)

    parallel = alpa.parallelize(_step, method=alpa.Zero2Parallel(jax.local_devices()[:4]))
    body = list(parallel.get_executable(state, batch).module.walk())
    # no all-reduce is left: the step returns no loss (jax.grad), so the
    # loss's scalar sum is dead code, erased before the ILP
    assert [shape_of(op.results[0].type) for op in body if isinstance(op, AllReduceOp)] == []
    assert sum(isinstance(op, ReduceScatterOp) for op in body) == 3
    actual = parallel(state, batch)
    for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    moments = [m for m in jax.tree.leaves(actual.opt_state) if m.ndim >= 1]
    assert len(moments) == 6
    assert all(not m.sharding.is_fully_replicated for m in moments), [
        (m.shape, m.sharding) for m in moments
    ]
