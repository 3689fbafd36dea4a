"""equinox training steps as equinox's tutorials write them: the model itself
in the state (activation functions and all) with ``eqx.filter_value_and_grad``,
a per-example attention model ``jax.vmap``-ed over the batch with a state that
is an ``eqx.Module``, and ``params, static = eqx.partition(model, eqx.is_array)``
with ``jax.value_and_grad`` over the params."""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from corpus import Built, Case

BATCH, SEQ, VOCAB, DIM = 8, 8, 32, 16


# --- eqx.nn.MLP, the model as the state --------------------------------------

mlp_optim = optax.adamw(1e-3)


@eqx.filter_value_and_grad
def mlp_loss(model: eqx.nn.MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    pred_y = jax.vmap(model)(x)
    return jnp.mean((y - pred_y) ** 2)


def mlp_make_step(
    state: tuple[eqx.nn.MLP, optax.OptState], batch: tuple[jax.Array, jax.Array]
) -> tuple[tuple[eqx.nn.MLP, optax.OptState], jax.Array]:
    model, opt_state = state
    x, y = batch
    loss, grads = mlp_loss(model, x, y)
    updates, opt_state = mlp_optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    return (model, opt_state), loss


def build_mlp() -> Built:
    key = jax.random.PRNGKey(0)
    model_key, data_key = jax.random.split(key)
    model = eqx.nn.MLP(in_size=4, out_size=2, width_size=32, depth=2, key=model_key)
    x = jax.random.normal(data_key, (16, 4))
    y = jnp.stack([jnp.sin(x[:, 0]) * x[:, 1], jnp.cos(x[:, 2] + x[:, 3])], axis=-1)
    opt_state = mlp_optim.init(eqx.filter(model, eqx.is_array))
    return Built(mlp_make_step, ((model, opt_state), (x, y)))


# --- eqx.nn.MultiheadAttention, vmapped over the batch -----------------------


class TransformerBlock(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    dropout: eqx.nn.Dropout

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(DIM)
        self.attention = eqx.nn.MultiheadAttention(
            num_heads=2, query_size=DIM, use_query_bias=True, use_output_bias=True, key=k1
        )
        self.norm2 = eqx.nn.LayerNorm(DIM)
        self.mlp = eqx.nn.MLP(DIM, DIM, 4 * DIM, depth=1, activation=jax.nn.gelu, key=k2)
        self.dropout = eqx.nn.Dropout(p=0.1)

    def __call__(self, x: jax.Array, mask: jax.Array, *, key: jax.Array) -> jax.Array:
        k1, k2 = jax.random.split(key)
        h = jax.vmap(self.norm1)(x)
        x = x + self.dropout(self.attention(h, h, h, mask=mask), key=k1)
        h = jax.vmap(self.norm2)(x)
        return x + self.dropout(jax.vmap(self.mlp)(h), key=k2)


class TinyTransformer(eqx.Module):
    embedding: eqx.nn.Embedding
    positions: jax.Array
    blocks: list[TransformerBlock]
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        keys = jax.random.split(key, 5)
        self.embedding = eqx.nn.Embedding(VOCAB, DIM, key=keys[0])
        self.positions = 0.02 * jax.random.normal(keys[1], (SEQ, DIM))
        self.blocks = [TransformerBlock(keys[2]), TransformerBlock(keys[3])]
        self.head = eqx.nn.Linear(DIM, VOCAB, key=keys[4])

    def __call__(self, tokens: jax.Array, *, key: jax.Array) -> jax.Array:
        x = jax.vmap(self.embedding)(tokens) + self.positions
        mask = jnp.tril(jnp.ones((tokens.shape[0], tokens.shape[0]), dtype=bool))
        for block, k in zip(self.blocks, jax.random.split(key, len(self.blocks)), strict=True):
            x = block(x, mask, key=k)
        return jax.vmap(self.head)(x)


class TrainState(eqx.Module):
    model: TinyTransformer
    opt_state: optax.OptState
    key: jax.Array


attention_optim = optax.adam(1e-3)


def attention_train_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    key, step_key = jax.random.split(state.key)
    keys = jax.random.split(step_key, batch["tokens"].shape[0])

    @eqx.filter_value_and_grad
    def loss_fn(model: TinyTransformer) -> jax.Array:
        logits = jax.vmap(model)(batch["tokens"], key=keys)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

    loss, grads = loss_fn(state.model)
    updates, opt_state = attention_optim.update(grads, state.opt_state)
    model = eqx.apply_updates(state.model, updates)
    return TrainState(model, opt_state, key), {"loss": loss}


def build_attention() -> Built:
    model = TinyTransformer(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    batch = {"tokens": ids[:, :-1], "targets": ids[:, 1:]}
    opt_state = attention_optim.init(eqx.filter(model, eqx.is_inexact_array))
    return Built(attention_train_step, (TrainState(model, opt_state, jax.random.key(2)), batch))


# --- params, static = eqx.partition(model, eqx.is_array), with optax ---------


class CNN(eqx.Module):
    layers: list

    def __init__(self, key: jax.Array) -> None:
        key1, key2, key3 = jax.random.split(key, 3)
        # Standard CNN setup: convolutional layer, followed by flattening,
        # with a small MLP on top.
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=3, key=key1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(75, 32, key=key2),
            jax.nn.sigmoid,
            eqx.nn.Linear(32, 10, key=key3),
            jax.nn.log_softmax,
        ]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


def build_partition() -> Built:
    model = CNN(jax.random.PRNGKey(5678))
    params, static = eqx.partition(model, eqx.is_array)
    optim = optax.adamw(3e-4)

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        model = eqx.combine(params, static)
        pred_y = jax.vmap(model)(x)
        pred_y = jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1)
        return -jnp.mean(pred_y)

    def train_step(
        state: dict[str, Any], batch: dict[str, jax.Array]
    ) -> tuple[dict[str, Any], dict[str, jax.Array]]:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch["x"], batch["y"])
        updates, opt_state = optim.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss}

    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    batch = {"x": jax.random.normal(kx, (16, 1, 8, 8)), "y": jax.random.randint(ky, (16,), 0, 10)}
    state = {"params": params, "opt_state": optim.init(params)}
    return Built(train_step, (state, batch))


_equinox = functools.partial(Case, library="equinox")

CASES = [
    _equinox(name="eqx_mlp_model_in_state", build=build_mlp),
    _equinox(name="eqx_mha_vmap", build=build_attention),
    _equinox(name="eqx_partition_optax", build=build_partition),
]
