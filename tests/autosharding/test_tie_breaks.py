"""What the communication cost leaves free (``autosharding/tie_breaks.py``):
dead code costs nothing, and fresh outputs break ties towards fewer bytes
per device. Alpa's ``test_weight_init``: a Flax ``init`` (whose forward pass
is dead) returns its weights and Adam state sharded, not whole on every
device, with the same values as one device."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from xdsl.dialects import func

import alpa_ir
from alpa_ir.autosharding.tie_breaks import dead_ops
from alpa_ir.ir.module_utils import main_function


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(16)(nn.Dense(16)(x))


def _init(key: jax.Array) -> TrainState:
    model = _Model()
    params = model.init(key, jnp.ones((64, 16)))  # runs the forward pass, drops its output
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


def _split(x: jax.Array) -> bool:
    return any(e is not None for e in x.sharding.spec)  # type: ignore[attr-defined]


def test_an_init_function_returns_its_weights_and_optimizer_state_sharded() -> None:
    mesh = alpa_ir.LogicalDeviceMesh((4,), devices=(0, 1, 2, 3))
    parallel = alpa_ir.parallelize(_init, method=alpa_ir.ShardParallel(devices=mesh))
    key = jax.random.PRNGKey(0)
    state = parallel(key)
    for layer in ("Dense_0", "Dense_1"):
        assert _split(state.params["params"][layer]["kernel"]), layer  # dead code: free
        assert _split(state.opt_state[0].mu["params"][layer]["kernel"]), layer  # the ties
        assert _split(state.opt_state[0].nu["params"][layer]["kernel"]), layer
    assert not _split(state.step)
    want = jax.jit(_init)(key)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6),
        (state.params, state.opt_state),
        (want.params, want.opt_state),
    )
    # the objective reported is communication only: the ties are left out
    assert parallel.get_last_executable().auto_sharding_objective == 0.0


def test_dead_ops_are_those_nothing_returned_depends_on() -> None:
    def step(w: jax.Array, x: jax.Array) -> Any:
        unused = jnp.sum(x @ w)  # dead, with its operand chain
        del unused
        return jnp.tanh(w) * 2.0

    module = alpa_ir.import_jax(step, jnp.ones((4, 4)), jnp.ones((2, 4)))
    block = main_function(module).body.block
    dead = dead_ops(block)
    assert {op.name for op in dead} == {"lax.dot_general", "lax.reduce_sum"}
    live = [op for op in block.ops if op not in dead and not isinstance(op, func.ReturnOp)]
    assert {op.name for op in live} >= {"lax.tanh", "lax.mul"}
