"""Alpa's MoE (``alpa_ir.model.moe``): top-2 gating routes each token to at
most two experts within their capacity, with weights that sum to one; an MoE
layer trains under ``parallelize`` as on one device; the language model has
Alpa's parameter names."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import alpa_ir
from alpa_ir.model.moe import FlaxMoEForLMModule, FlaxMoELayer, MoEConfig, TrainState, top2_gating
from alpa_ir.testing import assert_allclose


def test_top2_gating_respects_capacity_and_normalises() -> None:
    # 1 group of 4 tokens, 2 experts: capacity 2 * 4 / 2 = 4 slots per expert
    gates = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(0), (1, 4, 2)))
    combine, dispatch = top2_gating(gates)
    assert combine.shape == (1, 4, 2, 4) and dispatch.dtype == jnp.bool_
    np.testing.assert_allclose(combine.sum(axis=(2, 3)), 1.0, rtol=1e-6)  # all fit
    assert int(dispatch.sum(axis=(2, 3)).max()) == 2  # two experts per token
    # every token prefers expert 0 and then expert 1; 4 experts: capacity 2 * 4 / 4 = 2
    skewed = jnp.tile(jnp.array([0.7, 0.2, 0.05, 0.05]), (1, 4, 1))
    combine, dispatch = top2_gating(skewed)
    per_expert = dispatch.sum(axis=(1, 3))[0]
    assert per_expert.tolist() == [2, 2, 0, 0]  # two slots each, the rest dropped
    # the first two tokens got both experts; their weights renormalise to one
    np.testing.assert_allclose(combine[0, :2].sum(axis=(1, 2)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(combine[0, 2:].sum(), 0.0)
    np.testing.assert_allclose(combine[0, 0, 0].max(), 0.7 / 0.9, rtol=1e-6)


def _config(**kwargs: Any) -> MoEConfig:
    return MoEConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                     expert_group_size=8, expert_number=4, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, **kwargs)  # fmt: skip


def test_moe_layer_trains_under_parallelize_as_on_one_device() -> None:
    model = FlaxMoELayer(_config())
    k = jax.random.split(jax.random.PRNGKey(1), 2)
    batch = {
        "hidden_states": jax.random.normal(k[0], (4, 8, 16)),
        "attention_mask": jnp.ones((4, 8), jnp.int32),
        "labels": jax.random.normal(k[1], (4, 8, 16)),
    }
    params = model.init(jax.random.PRNGKey(0), batch["hidden_states"], batch["attention_mask"])
    assert params["params"]["moe"]["wi"].shape == (4, 16, 32)  # [E, M, H]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))

    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(params, batch["hidden_states"], batch["attention_mask"])[0]
            return jnp.mean((out - batch["labels"]) ** 2)

        loss, grads = jax.value_and_grad(loss_func)(state.params)
        return state.apply_gradients(grads=grads), loss

    expected, expected_loss = jax.jit(train_step)(state, batch)
    actual, loss = alpa_ir.parallelize(train_step, method=alpa_ir.ShardParallel())(state, batch)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert_allclose(expected.params, actual.params, rtol=1e-4, atol=1e-5)


def test_moe_language_model_has_alpa_names() -> None:
    config = _config(num_hidden_layers=2, vocab_size=32, max_position_embeddings=8)
    ids = jnp.zeros((2, 8), jnp.int32)
    inputs = (ids, jnp.ones_like(ids), ids, jnp.broadcast_to(jnp.arange(8), ids.shape))
    model = FlaxMoEForLMModule(config)
    params = model.init(jax.random.PRNGKey(0), *inputs)["params"]
    layers = params["transformers"]["encoder"]["layer"]
    assert "moe" in layers["0"] and "intermediate" in layers["1"]  # MoE, then BERT
    assert "token_type_embeddings" not in params["transformers"]["embeddings"]
    assert params["bias"].shape == (32,)
    assert model.apply({"params": params}, *inputs).logits.shape == (2, 8, 32)
