"""``get_hlo_text()`` prints the compiled program as Alpa returned it: every
operand with its shape (``gather(f32[64,32]{1,0} %p, ...)``, ``all-reduce(f32[] %x)``),
which is how Alpa's users and helpers read it (a scalar all-reduce is found by
``all-reduce(f32[]``); ``compiled.as_text()`` leaves operand shapes out."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

import alpa_ir as alpa
from alpa_ir.costs.collective_accounting import hlo_collectives


class _GatherModel(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(32, use_bias=False)(x)
        x = x[:, jnp.arange(16)]
        return nn.Dense(16, use_bias=False)(x)


def _step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
    def loss_fn(params: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(params, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def test_get_hlo_text_prints_operand_shapes() -> None:
    x, y = jnp.ones((256, 32)), jnp.ones((256, 16))
    model = _GatherModel()
    params = model.init(jax.random.PRNGKey(0), x)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(1e-2))
    method = alpa.DataParallel(devices=jax.local_devices()[:4])
    executable = alpa.parallelize(_step, method=method).get_executable(state, x, y)
    text = executable.get_hlo_text()
    # the gather and its gradient's scatter on a device's 64 of the 256 rows
    assert "gather(f32[64,32]{1,0} %" in text and "scatter(f32[64,32]{1,0} %" in text
    assert "all-reduce(f32[32,32]{1,0} %" in text  # the gradients' sum, operands typed
    # the collectives read from the text are those of XLA's own print
    compiled = executable._compile_local()[0].lower(*executable._input_structs()).compile()
    assert hlo_collectives(text) == hlo_collectives(compiled.as_text())
    assert "gather(f32[64,32]" not in compiled.as_text()
