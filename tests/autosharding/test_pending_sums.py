"""Partial sums added before they are reduced: the gradient of a weight used
twice (a tied embedding: the lookup's scatter-add and the output layer's
matmul) is the sum of two partial gradients under data parallelism, and is
reduced once, as Alpa's plan does, instead of once per use."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import alpa_ir
from alpa_ir.autosharding.graph import pending_sum_ops
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.sharding import AllGatherOp, AllReduceOp, AllToAllOp, ReduceScatterOp
from alpa_ir.dialects.types import shape_of
from alpa_ir.ir.module_utils import main_function

VOCAB, HIDDEN = 64, 16


class _Tied(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        embed = nn.Embed(VOCAB, HIDDEN)
        return embed.attend(nn.Dense(HIDDEN)(embed(x)))


def _step(state: TrainState, x: jax.Array, y: jax.Array) -> TrainState:
    def loss(params: Any) -> jax.Array:
        logits = state.apply_fn(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def _inputs() -> tuple[TrainState, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (32, 8)).astype(np.int32)
    y = rng.integers(0, VOCAB, (32, 8)).astype(np.int32)
    model = _Tied()
    params = jax.jit(model.init)(jax.random.key(0), x)
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1)), x, y


def test_only_the_ops_that_lead_a_partial_sum_to_an_addition_may_defer_it() -> None:
    def grads(w: jax.Array, x: jax.Array) -> jax.Array:
        return jax.grad(lambda w: (w[x] @ w.T).sum())(w)

    function = main_function(
        alpa_ir.import_jax(grads, np.ones((VOCAB, HIDDEN), np.float32), np.ones(4, np.int32))
    )
    pending = pending_sum_ops(function.body.block)
    names = sorted(op.primitive_name for op in pending if isinstance(op, LaxOp))
    # the weight gradient's matmul, its transposes, the lookup's scatter-add
    # (and the zeros it adds into), and the sum of the two
    assert names.count("add_any") == 1 and names.count("scatter-add") == 1
    assert "dot_general" in names and "transpose" in names
    # the forward matmul and the lookup itself never make a pending sum
    assert "gather" not in names
    forward = [op for op in function.body.block.ops if isinstance(op, LaxOp)]
    assert forward[0] not in pending
    # a pending sum is left for its use only where there is one use, and never
    # out of the function (here the sum of the two is the returned gradient)
    for op, keep in pending.items():
        assert not keep or op.results[0].has_one_use()
        returned = getattr(op, "primitive_name", None) == "add_any"  # the gradient
        assert keep == (not returned and op.results[0].has_one_use())


def test_a_pipelines_gradients_leave_their_stage_complete() -> None:
    """The backward stage of a pipeline returns its weights' gradients whole: a
    gradient left pending out of its function reached the apply-grad stage
    as a partial argument no strategy takes (no plan)."""

    def step(p: dict[str, jax.Array], b: jax.Array) -> Any:
        def loss(p: dict[str, jax.Array]) -> jax.Array:
            h = b
            for i in range(2):
                h = jnp.tanh(jnp.tanh(h @ p[f"w{i}"]) @ p[f"w{i}"])  # each weight used twice
            return jnp.mean(h**2)

        grads = jax.grad(loss)(p)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)

    rng = np.random.default_rng(0)
    params = {f"w{i}": jnp.asarray(rng.normal(size=(16, 16)) * 0.3, jnp.float32) for i in range(2)}
    batch = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
    method = alpa_ir.PipeshardParallel(
        devices=jax.devices()[4:],
        stage_option=alpa_ir.UniformStageOption(num_stages=2),
    )
    got = alpa_ir.parallelize(step, method=method)(params, batch)
    want = jax.jit(step)(params, batch)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_a_tied_embeddings_gradient_is_reduced_once_under_data_parallelism() -> None:
    state, x, y = _inputs()
    want = jax.jit(_step)(state, x, y)
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((4, 1))
    p_step = alpa_ir.parallelize(_step, method=alpa_ir.ShardParallel(devices=mesh))
    got = p_step(state, x, y)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    function = main_function(p_step.get_last_executable().module)
    ops = list(function.body.block.ops)
    table = (VOCAB, HIDDEN)
    reductions = [
        op
        for op in ops
        if isinstance(op, AllReduceOp | ReduceScatterOp) and shape_of(op.results[0].type) == table
    ]
    assert len(reductions) == 1, reductions
    # the lookup's gradient is not moved to be scattered another way
    assert not [op for op in ops if isinstance(op, AllToAllOp)]
    assert len([op for op in ops if isinstance(op, AllGatherOp)]) <= 1
