"""The vocabulary-split embedding lookup (Megatron's, Alpa's
``test_embedding_2d_mesh``): a gather from a table split along the dim it
indexes looks up the rows of each device's block (zeros elsewhere) and sums
the partial results; its gradient, a scatter-add, keeps the updates of each
device's block. Out-of-bounds indices keep JAX's meaning in every mode."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.costs.collective_accounting import hlo_collectives

VOCAB, HIDDEN = 1024, 8


@pytest.mark.parametrize("mode", ["fill", "clip"])
def test_a_lookup_and_its_scatter_add_on_a_row_split_table_equal_one_device(mode: str) -> None:
    def lookup(table: jax.Array, idx: jax.Array, rows: jax.Array) -> Any:
        return (
            jnp.take(table, idx, axis=0, mode=mode),
            table.at[idx].add(rows, mode="drop" if mode == "fill" else mode),
        )

    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCAB, HIDDEN), np.float32)
    idx = np.array([[0, 255, 256], [700, 1023, 5000]], np.int32)  # 5000: out of bounds
    rows = rng.standard_normal((2, 3, HIDDEN), np.float32)
    want = jax.jit(lookup)(table, idx, rows)
    manual = alpa_ir.ManualShardingOption(("dp", "mp"), in_axis_resources=(P("mp", None), P(), P()))
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((1, 4))
    method = alpa_ir.ShardParallel(devices=mesh, manual_sharding_option=manual)
    parallel = alpa_ir.parallelize(lookup, method=method, donate_argnums=())
    got = parallel(table, idx, rows)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    kinds = [c.kind for c in hlo_collectives(parallel.get_last_executable().get_hlo_text())]
    assert kinds == ["all-reduce"], kinds  # the lookup's partial rows; the table stays split


class _Tied(nn.Module):
    """Alpa's test_embedding_2d_mesh model: input and output embedding tied."""

    def setup(self) -> None:
        self.embed = nn.Embed(VOCAB, HIDDEN)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.embed(x) @ self.embed.variables["params"]["embedding"].T


def _step(state: TrainState, x: jax.Array, y: jax.Array) -> TrainState:
    def loss(params: Any) -> jax.Array:
        out = state.apply_fn(params, x)
        return -jnp.sum(jax.nn.one_hot(y, VOCAB) * jax.nn.log_softmax(out, axis=-1))

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_a_tied_embedding_is_split_on_its_vocabulary_and_equals_one_device() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCAB, (8, 8)).astype(np.int32)
    y = rng.integers(0, VOCAB, (8, 8)).astype(np.int32)
    model = _Tied()
    params = jax.jit(model.init)(jax.random.key(0), x)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    want = jax.jit(_step)(state, x, y)
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((2, 2))
    parallel = alpa_ir.parallelize(_step, method=alpa_ir.ShardParallel(devices=mesh))
    got = parallel(state, x, y)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    table = got.params["params"]["embed"]["embedding"]
    assert table.sharding.shard_shape(table.shape)[0] < VOCAB  # split on the vocabulary
    kinds = {c.kind for c in hlo_collectives(parallel.get_last_executable().get_hlo_text())}
    assert kinds == {"all-reduce"}, kinds  # never gathered whole
