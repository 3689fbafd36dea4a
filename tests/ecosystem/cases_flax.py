"""flax.linen training steps as Flax users write them: ``nn.scan`` over blocks,
``nn.remat`` (with and without a policy), dropout with a key carried in the
state, BatchNorm's mutable ``batch_stats``, attention, a tied embedding, bf16
compute, ``nn.RNN``, the plain ``TrainState`` step and a Python ``train`` flag."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from corpus import Built, Case
from flax.training import train_state

VOCAB, DIM, SEQ, BATCH, LAYERS = 32, 16, 8, 8, 2


def _tokens(seed: int, batch: int = BATCH, seq: int = SEQ) -> dict[str, jax.Array]:
    ids = jax.random.randint(jax.random.PRNGKey(seed), (batch, seq + 1), 0, VOCAB)
    return {"inputs": ids[:, :-1], "targets": ids[:, 1:]}


def _lm_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


class MlpBlock(nn.Module):
    dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        h = nn.Dense(4 * self.dim)(h)
        h = nn.gelu(h)
        return x + nn.Dense(self.dim)(h)


class ScanBlock(nn.Module):
    """A residual block in the ``(carry, x) -> (carry, y)`` form ``nn.scan`` wants."""

    dim: int

    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        return MlpBlock(self.dim)(x), None


def _lm_train_state_step(
    state: train_state.TrainState, batch: dict[str, jax.Array]
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn({"params": params}, batch["inputs"])
        return _lm_loss(logits, batch["targets"])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    state = state.apply_gradients(grads=grads)
    return state, {"loss": loss}


def _lm_built(model: nn.Module, tx: optax.GradientTransformation, seed: int = 0) -> Built:
    batch = _tokens(seed + 1)
    variables = model.init(jax.random.PRNGKey(seed), batch["inputs"])
    state = train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)
    return Built(_lm_train_state_step, (state, batch))


# --- nn.scan over blocks -----------------------------------------------------


class ScannedLM(nn.Module):
    remat: bool = False

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, DIM)(tokens)
        block = nn.remat(ScanBlock, prevent_cse=False) if self.remat else ScanBlock
        blocks = nn.scan(
            block,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=LAYERS,
        )
        x, _ = blocks(DIM, name="blocks")(x, None)
        x = nn.LayerNorm()(x)
        return nn.Dense(VOCAB)(x)


def build_scan() -> Built:
    return _lm_built(ScannedLM(), optax.adamw(1e-3))


def build_scan_remat() -> Built:
    return _lm_built(ScannedLM(remat=True), optax.adam(1e-3))


# --- nn.remat with a checkpoint policy ----------------------------------------


class RematLM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, DIM)(tokens)
        Block = nn.remat(MlpBlock, policy=jax.checkpoint_policies.dots_saveable)
        for i in range(LAYERS):
            x = Block(DIM, name=f"block_{i}")(x)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def build_remat_policy() -> Built:
    return _lm_built(RematLM(), optax.sgd(0.1, momentum=0.9))


# --- dropout with the key in the state ---------------------------------------


class DropoutMLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
        x = nn.relu(nn.Dense(32)(x))
        x = nn.Dropout(rate=0.2, deterministic=deterministic)(x)
        x = nn.relu(nn.Dense(32)(x))
        x = nn.Dropout(rate=0.2, deterministic=deterministic)(x)
        return nn.Dense(4)(x)


class DropoutState(NamedTuple):
    params: Any
    opt_state: optax.OptState
    key: jax.Array


_dropout_model = DropoutMLP()
_dropout_tx = optax.adam(1e-3)


def dropout_step(
    state: DropoutState, batch: dict[str, jax.Array]
) -> tuple[DropoutState, dict[str, jax.Array]]:
    key, dropout_key = jax.random.split(state.key)

    def loss_fn(params: Any) -> jax.Array:
        logits = _dropout_model.apply(
            {"params": params}, batch["x"], deterministic=False, rngs={"dropout": dropout_key}
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = _dropout_tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return DropoutState(params, opt_state, key), {"loss": loss}


def _classification_batch(seed: int, features: int = 8, classes: int = 4) -> dict[str, jax.Array]:
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "x": jax.random.normal(kx, (16, features)),
        "y": jax.random.randint(ky, (16,), 0, classes),
    }


def build_dropout_key() -> Built:
    batch = _classification_batch(1)
    params = _dropout_model.init(jax.random.key(0), batch["x"], deterministic=True)["params"]
    state = DropoutState(params, _dropout_tx.init(params), jax.random.key(42))
    return Built(dropout_step, (state, batch))


# --- BatchNorm with mutable batch_stats --------------------------------------


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        for features in (8, 16):
            x = nn.Conv(features, (3, 3), use_bias=False)(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(4)(x)


class BatchNormTrainState(train_state.TrainState):
    batch_stats: Any


def batchnorm_step(
    state: BatchNormTrainState, batch: dict[str, jax.Array]
) -> tuple[BatchNormTrainState, dict[str, jax.Array]]:
    def loss_fn(params: Any) -> tuple[jax.Array, tuple[Any, jax.Array]]:
        logits, new_model_state = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats},
            batch["image"],
            mutable=["batch_stats"],
        )
        one_hot = jax.nn.one_hot(batch["label"], 4)
        loss = optax.softmax_cross_entropy(logits, one_hot).mean()
        return loss, (new_model_state, logits)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, (new_model_state, logits)), grads = grad_fn(state.params)
    state = state.apply_gradients(grads=grads, batch_stats=new_model_state["batch_stats"])
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state, {"loss": loss, "accuracy": accuracy}


def build_batchnorm() -> Built:
    kx, ky = jax.random.split(jax.random.PRNGKey(3))
    batch = {
        "image": jax.random.normal(kx, (16, 8, 8, 3)),
        "label": jax.random.randint(ky, (16,), 0, 4),
    }
    model = CNN()
    variables = model.init(jax.random.PRNGKey(0), batch["image"][:1], train=False)
    state = BatchNormTrainState.create(
        apply_fn=model.apply,
        params=variables["params"],
        batch_stats=variables["batch_stats"],
        tx=optax.sgd(0.05, momentum=0.9, nesterov=True),
    )
    return Built(batchnorm_step, (state, batch), micro_batch_stats=True)


# --- MultiHeadDotProductAttention --------------------------------------------


class AttentionLM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, DIM)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (SEQ, DIM))
        mask = nn.make_causal_mask(tokens)
        for _ in range(LAYERS):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=DIM)(h, h, mask=mask)
            x = MlpBlock(DIM)(x)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def build_mha() -> Built:
    return _lm_built(AttentionLM(), optax.adamw(1e-3, weight_decay=0.01))


# --- tied embedding (nn.Embed.attend) ----------------------------------------


class TiedLM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(VOCAB, DIM, name="embed")
        x = embed(tokens)
        for i in range(LAYERS):
            x = MlpBlock(DIM, name=f"block_{i}")(x)
        x = nn.LayerNorm()(x)
        return embed.attend(x)


def build_tied_embed() -> Built:
    return _lm_built(TiedLM(), optax.adam(1e-3))


# --- bf16 compute, fp32 params -----------------------------------------------


class Bf16LM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        dtype, param_dtype = jnp.bfloat16, jnp.float32
        x = nn.Embed(VOCAB, DIM, dtype=dtype, param_dtype=param_dtype)(tokens)
        for _ in range(LAYERS):
            h = nn.LayerNorm(dtype=dtype, param_dtype=param_dtype)(x)
            h = nn.Dense(4 * DIM, dtype=dtype, param_dtype=param_dtype)(h)
            h = nn.gelu(h)
            x = x + nn.Dense(DIM, dtype=dtype, param_dtype=param_dtype)(h)
        x = nn.LayerNorm(dtype=dtype, param_dtype=param_dtype)(x)
        logits = nn.Dense(VOCAB, dtype=dtype, param_dtype=param_dtype)(x)
        return logits.astype(jnp.float32)


def build_bf16() -> Built:
    return _lm_built(Bf16LM(), optax.adamw(1e-3))


# --- nn.RNN(nn.LSTMCell) -----------------------------------------------------


class LSTMClassifier(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, DIM)(tokens)
        x = nn.RNN(nn.LSTMCell(features=DIM))(x)
        return nn.Dense(4)(x[:, -1])


def lstm_step(
    state: train_state.TrainState, batch: dict[str, jax.Array]
) -> tuple[train_state.TrainState, jax.Array]:
    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn({"params": params}, batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def build_lstm() -> Built:
    kx, ky = jax.random.split(jax.random.PRNGKey(5))
    batch = {
        "tokens": jax.random.randint(kx, (BATCH, SEQ), 0, VOCAB),
        "label": jax.random.randint(ky, (BATCH,), 0, 4),
    }
    model = LSTMClassifier()
    params = model.init(jax.random.PRNGKey(0), batch["tokens"])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(3e-3))
    return Built(lstm_step, (state, batch))


# --- the plain TrainState step (state.step is the Python int 0) ---------------


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(32)(x))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(4)(x)


def trainstate_step(
    state: train_state.TrainState, batch: dict[str, jax.Array]
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    def loss_fn(params: Any) -> tuple[jax.Array, jax.Array]:
        logits = state.apply_fn({"params": params}, batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
    return state, {"loss": loss, "accuracy": accuracy}


def build_trainstate() -> Built:
    batch = _classification_batch(7)
    model = MLP()
    params = model.init(jax.random.PRNGKey(0), batch["x"])["params"]
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(learning_rate=0.1)
    )
    assert isinstance(state.step, int)  # flax creates it as the Python int 0
    return Built(trainstate_step, (state, batch))


# --- a Python bool flag as an extra (static) argument ------------------------


class RngTrainState(train_state.TrainState):
    key: jax.Array


def flag_step(
    state: RngTrainState, batch: dict[str, jax.Array], train: bool
) -> tuple[RngTrainState, dict[str, jax.Array]]:
    dropout_key = jax.random.fold_in(state.key, state.step)

    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn(
            {"params": params}, batch["x"], deterministic=not train, rngs={"dropout": dropout_key}
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    if train:
        state = state.apply_gradients(grads=grads)
    return state, {"loss": loss}


def build_static_flag() -> Built:
    batch = _classification_batch(9)
    model = DropoutMLP()
    params = model.init(jax.random.PRNGKey(0), batch["x"], deterministic=True)["params"]
    state = RngTrainState.create(
        apply_fn=model.apply, params=params, tx=optax.adam(1e-3), key=jax.random.PRNGKey(11)
    )
    return Built(flag_step, (state, batch, True), static_argnums=(2,))


_flax = functools.partial(Case, library="flax")

CASES = [
    _flax(name="flax_scan_blocks", build=build_scan),
    _flax(name="flax_scan_remat", build=build_scan_remat),
    _flax(name="flax_remat_policy", build=build_remat_policy),
    _flax(name="flax_dropout_key", build=build_dropout_key),
    _flax(name="flax_batchnorm", build=build_batchnorm),
    _flax(name="flax_mha", build=build_mha),
    _flax(name="flax_tied_embed", build=build_tied_embed),
    # bf16 matmuls keep 8 mantissa bits: a plan that sums a contraction in
    # another order (split over devices or micro-batches) differs by ~2^-8
    # relative per op, compounded over the layers, so rtol is 2e-2 here only.
    # AdamW divides each gradient element by its own magnitude: an element
    # whose gradient is within bf16 round-off of zero gets an update of +-lr
    # either way, so its parameter may differ by 2 lr (atol 2.5e-3 for lr 1e-3).
    _flax(name="flax_bf16_fp32_params", build=build_bf16, rtol=2e-2, atol=2.5e-3),
    _flax(name="flax_rnn_lstm", build=build_lstm),
    _flax(name="flax_trainstate_python_step", build=build_trainstate),
    _flax(name="flax_static_train_flag", build=build_static_flag),
]
