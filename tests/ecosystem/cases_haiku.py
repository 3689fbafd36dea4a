"""dm-haiku training steps as haiku's examples write them: ``hk.transform``
(with and without an rng), ``hk.transform_with_state`` for BatchNorm,
``hk.dynamic_unroll`` of an LSTM, ``hk.MultiHeadAttention``; the state a
``NamedTuple`` of params, optimizer state (and rng, step)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import optax
from corpus import Built, Case

BATCH, SEQ, VOCAB, DIM = 8, 8, 32, 16


class TrainingState(NamedTuple):
    params: hk.Params
    opt_state: optax.OptState


# --- hk.transform MLP ---------------------------------------------------------


def mlp_net(x: jax.Array) -> jax.Array:
    return hk.nets.MLP([32, 32, 4])(x)


mlp = hk.without_apply_rng(hk.transform(mlp_net))
mlp_optimiser = optax.adam(1e-3)


def mlp_loss(params: hk.Params, batch: dict[str, jax.Array]) -> jax.Array:
    logits = mlp.apply(params, batch["x"])
    labels = jax.nn.one_hot(batch["y"], 4)
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))


def mlp_update(
    state: TrainingState, batch: dict[str, jax.Array]
) -> tuple[TrainingState, dict[str, jax.Array]]:
    loss, grads = jax.value_and_grad(mlp_loss)(state.params, batch)
    updates, opt_state = mlp_optimiser.update(grads, state.opt_state)
    params = optax.apply_updates(state.params, updates)
    return TrainingState(params, opt_state), {"loss": loss}


def build_mlp() -> Built:
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    batch = {"x": jax.random.normal(kx, (16, 8)), "y": jax.random.randint(ky, (16,), 0, 4)}
    params = mlp.init(jax.random.PRNGKey(42), batch["x"])
    return Built(mlp_update, (TrainingState(params, mlp_optimiser.init(params)), batch))


# --- ResNet-ish with hk.BatchNorm (transform_with_state) ----------------------


class Block(hk.Module):
    def __init__(self, channels: int, name: str | None = None) -> None:
        super().__init__(name=name)
        self.channels = channels

    def __call__(self, x: jax.Array, is_training: bool) -> jax.Array:
        bn_config = {"create_scale": True, "create_offset": True, "decay_rate": 0.9}
        shortcut = hk.Conv2D(self.channels, 1, with_bias=False, name="shortcut")(x)
        h = hk.Conv2D(self.channels, 3, with_bias=False)(x)
        h = hk.BatchNorm(**bn_config)(h, is_training=is_training)
        h = jax.nn.relu(h)
        h = hk.Conv2D(self.channels, 3, with_bias=False)(h)
        h = hk.BatchNorm(**bn_config)(h, is_training=is_training)
        return jax.nn.relu(h + shortcut)


def resnet_forward(images: jax.Array, is_training: bool) -> jax.Array:
    x = Block(8)(images, is_training)
    x = hk.avg_pool(x, window_shape=2, strides=2, padding="VALID")
    x = Block(16)(x, is_training)
    x = jnp.mean(x, axis=(1, 2))
    return hk.Linear(4)(x)


resnet = hk.transform_with_state(resnet_forward)
resnet_optimiser = optax.sgd(0.05, momentum=0.9)


class ResNetState(NamedTuple):
    params: hk.Params
    state: hk.State
    opt_state: optax.OptState


def resnet_loss(
    params: hk.Params, state: hk.State, batch: dict[str, jax.Array]
) -> tuple[jax.Array, hk.State]:
    logits, state = resnet.apply(params, state, None, batch["images"], is_training=True)
    labels = jax.nn.one_hot(batch["labels"], 4)
    loss = optax.softmax_cross_entropy(logits, labels).mean()
    l2 = 0.5 * sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params))
    return loss + 1e-4 * l2, state


def resnet_train_step(
    train_state: ResNetState, batch: dict[str, jax.Array]
) -> tuple[ResNetState, dict[str, jax.Array]]:
    params, state, opt_state = train_state
    (loss, state), grads = jax.value_and_grad(resnet_loss, has_aux=True)(params, state, batch)
    updates, opt_state = resnet_optimiser.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return ResNetState(params, state, opt_state), {"loss": loss}


def build_resnet() -> Built:
    kx, ky = jax.random.split(jax.random.PRNGKey(2))
    batch = {
        "images": jax.random.normal(kx, (16, 8, 8, 3)),
        "labels": jax.random.randint(ky, (16,), 0, 4),
    }
    params, state = resnet.init(jax.random.PRNGKey(0), batch["images"], is_training=True)
    train_state = ResNetState(params, state, resnet_optimiser.init(params))
    return Built(resnet_train_step, (train_state, batch), micro_batch_stats=True)


# --- LSTM with hk.dynamic_unroll ----------------------------------------------


def lstm_forward(inputs: jax.Array) -> jax.Array:
    """Time-major ``[T, B, F]`` in, a prediction per step out."""
    core = hk.DeepRNN([hk.LSTM(DIM), jax.nn.relu, hk.LSTM(DIM)])
    batch_size = inputs.shape[1]
    initial_state = core.initial_state(batch_size)
    outputs, _ = hk.dynamic_unroll(core, inputs, initial_state)
    return hk.BatchApply(hk.Linear(1))(outputs)


lstm = hk.without_apply_rng(hk.transform(lstm_forward))
lstm_optimiser = optax.adam(1e-3)


def lstm_loss(params: hk.Params, batch: dict[str, jax.Array]) -> jax.Array:
    inputs = jnp.swapaxes(batch["x"], 0, 1)  # batch-major to time-major
    targets = jnp.swapaxes(batch["y"], 0, 1)
    preds = lstm.apply(params, inputs)
    return jnp.mean(jnp.square(preds - targets))


def lstm_update(
    state: TrainingState, batch: dict[str, jax.Array]
) -> tuple[TrainingState, jax.Array]:
    loss, grads = jax.value_and_grad(lstm_loss)(state.params, batch)
    updates, opt_state = lstm_optimiser.update(grads, state.opt_state)
    return TrainingState(optax.apply_updates(state.params, updates), opt_state), loss


def build_lstm() -> Built:
    t = jnp.linspace(0.0, 4.0, SEQ + 1)
    phase = jax.random.uniform(jax.random.PRNGKey(3), (BATCH, 1))
    wave = jnp.sin(t[None, :] + 6.0 * phase)[..., None]
    batch = {"x": wave[:, :-1], "y": wave[:, 1:]}
    params = lstm.init(jax.random.PRNGKey(0), jnp.swapaxes(batch["x"], 0, 1))
    return Built(lstm_update, (TrainingState(params, lstm_optimiser.init(params)), batch))


# --- hk.MultiHeadAttention transformer (examples/transformer) ----------------


class TransformerState(NamedTuple):
    params: hk.Params
    opt_state: optax.OptState
    rng: jax.Array
    step: jax.Array


def transformer_forward(tokens: jax.Array, is_training: bool = True) -> jax.Array:
    dropout_rate = 0.1 if is_training else 0.0
    init = hk.initializers.VarianceScaling(2.0 / 2)
    x = hk.Embed(VOCAB, DIM)(tokens)
    x = x + hk.get_parameter(
        "positional_embeddings", [SEQ, DIM], init=hk.initializers.TruncatedNormal(0.02)
    )
    mask = jnp.tril(jnp.ones((1, 1, SEQ, SEQ)))
    for _ in range(2):
        h = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
        attn = hk.MultiHeadAttention(num_heads=2, key_size=DIM // 2, w_init=init)
        h = attn(h, h, h, mask=mask)
        h = hk.dropout(hk.next_rng_key(), dropout_rate, h)
        x = x + h
        h = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
        h = hk.Linear(4 * DIM, w_init=init)(h)
        h = jax.nn.gelu(h)
        h = hk.Linear(DIM, w_init=init)(h)
        x = x + hk.dropout(hk.next_rng_key(), dropout_rate, h)
    x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)
    return hk.Linear(VOCAB)(x)


transformer = hk.transform(transformer_forward)
transformer_optimiser = optax.chain(
    optax.clip_by_global_norm(1.0), optax.adam(3e-3, b1=0.9, b2=0.99)
)


def transformer_loss(params: hk.Params, rng: jax.Array, data: dict[str, jax.Array]) -> jax.Array:
    logits = transformer.apply(params, rng, data["obs"], is_training=True)
    targets = jax.nn.one_hot(data["target"], VOCAB)
    log_likelihood = jnp.sum(targets * jax.nn.log_softmax(logits), axis=-1)
    return -jnp.mean(log_likelihood)


def transformer_update(
    state: TransformerState, data: dict[str, jax.Array]
) -> tuple[TransformerState, dict[str, jax.Array]]:
    rng, new_rng = jax.random.split(state.rng)
    loss, gradients = jax.value_and_grad(transformer_loss)(state.params, rng, data)
    updates, new_opt_state = transformer_optimiser.update(gradients, state.opt_state)
    new_params = optax.apply_updates(state.params, updates)
    new_state = TransformerState(
        params=new_params, opt_state=new_opt_state, rng=new_rng, step=state.step + 1
    )
    return new_state, {"step": state.step, "loss": loss}


def build_transformer() -> Built:
    ids = jax.random.randint(jax.random.PRNGKey(4), (BATCH, SEQ + 1), 0, VOCAB)
    data = {"obs": ids[:, :-1], "target": ids[:, 1:]}
    rng = jax.random.PRNGKey(0)
    rng, init_rng = jax.random.split(rng)
    params = transformer.init(init_rng, data["obs"])
    state = TransformerState(
        params=params,
        opt_state=transformer_optimiser.init(params),
        rng=rng,
        step=jnp.array(0),
    )
    return Built(transformer_update, (state, data))


_haiku = functools.partial(Case, library="haiku")

CASES = [
    _haiku(name="haiku_mlp", build=build_mlp),
    _haiku(name="haiku_resnet_batchnorm", build=build_resnet),
    _haiku(name="haiku_lstm_dynamic_unroll", build=build_lstm),
    _haiku(name="haiku_mha_transformer", build=build_transformer),
]
