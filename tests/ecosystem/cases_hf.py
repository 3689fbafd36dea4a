"""Hugging Face Flax models trained the way the ``examples/flax`` scripts train
them: ``TrainState`` with a ``dropout_rng``, ``batch.pop("labels")`` inside the
loss, the model's ``__call__(**batch, params=params, dropout_rng=..., train=True)``,
numpy batches. Tiny configs, random init, nothing downloaded."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from corpus import Built, Case
from flax import traverse_util
from flax.training import train_state
from flax.training.common_utils import onehot
from transformers import (
    BartConfig,
    BertConfig,
    FlaxBartForConditionalGeneration,
    FlaxBertForMaskedLM,
    FlaxGPT2LMHeadModel,
    FlaxViTForImageClassification,
    GPT2Config,
    ViTConfig,
)
from transformers.models.bart.modeling_flax_bart import shift_tokens_right

BATCH, SEQ, VOCAB = 8, 8, 64


class TrainState(train_state.TrainState):
    dropout_rng: jnp.ndarray


def create_learning_rate_fn(
    num_train_steps: int, num_warmup_steps: int, learning_rate: float
) -> Callable[[Any], Any]:
    """Linear warmup then linear decay, as in the HF Flax examples."""
    warmup_fn = optax.linear_schedule(
        init_value=0.0, end_value=learning_rate, transition_steps=num_warmup_steps
    )
    decay_fn = optax.linear_schedule(
        init_value=learning_rate,
        end_value=0,
        transition_steps=num_train_steps - num_warmup_steps,
    )
    return optax.join_schedules(schedules=[warmup_fn, decay_fn], boundaries=[num_warmup_steps])


def decay_mask_fn(params: Any) -> Any:
    """No weight decay on biases and LayerNorm parameters (run_clm_flax.py)."""
    flat_params = traverse_util.flatten_dict(params)
    layer_norm_candidates = ["layernorm", "layer_norm", "ln"]
    layer_norm_named_params = {
        layer[-2:]
        for layer_norm_name in layer_norm_candidates
        for layer in flat_params
        if layer_norm_name in "".join(layer).lower()
    }
    flat_mask = {
        path: (path[-1] != "bias" and path[-2:] not in layer_norm_named_params)
        for path in flat_params
    }
    return traverse_util.unflatten_dict(flat_mask)


# --- GPT-2 causal LM (run_clm_flax.py) ----------------------------------------

gpt2_lr = create_learning_rate_fn(num_train_steps=100, num_warmup_steps=2, learning_rate=1e-3)


def gpt2_loss_fn(logits: jax.Array, labels: jax.Array) -> jax.Array:
    shift_logits = logits[..., :-1, :]
    shift_labels = labels[..., 1:]
    loss = optax.softmax_cross_entropy(shift_logits, onehot(shift_labels, shift_logits.shape[-1]))
    return loss.mean()


def gpt2_train_step(
    state: TrainState, batch: dict[str, Any]
) -> tuple[TrainState, dict[str, jax.Array]]:
    dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

    def compute_loss(params: Any) -> jax.Array:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        loss = gpt2_loss_fn(logits, labels)
        return loss

    grad_fn = jax.value_and_grad(compute_loss)
    loss, grad = grad_fn(state.params)
    new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
    metrics = {"loss": loss, "learning_rate": gpt2_lr(state.step)}
    return new_state, metrics


def build_gpt2() -> Built:
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2, n_inner=32
    )
    model = FlaxGPT2LMHeadModel(config, seed=0, dtype=jnp.float32)
    rng = jax.random.PRNGKey(0)
    rng, dropout_rng = jax.random.split(rng)
    adamw = optax.adamw(
        learning_rate=gpt2_lr, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.01, mask=decay_mask_fn
    )
    state = TrainState.create(
        apply_fn=model.__call__, params=model.params, tx=adamw, dropout_rng=dropout_rng
    )
    ids = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ))
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}
    return Built(gpt2_train_step, (state, batch))


# --- BERT masked LM (run_mlm_flax.py; the dropout key folded with the step) --

bert_lr = create_learning_rate_fn(num_train_steps=100, num_warmup_steps=0, learning_rate=1e-3)


def bert_train_step(
    state: train_state.TrainState, batch: dict[str, Any], dropout_rng: jax.Array
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    dropout_rng = jax.random.fold_in(dropout_rng, state.step)

    def loss_fn(params: Any) -> tuple[jax.Array, jax.Array]:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        # compute loss, ignore padded input tokens
        label_mask = jnp.where(labels > 0, 1.0, 0.0)
        loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask
        # take average
        loss = loss.sum()
        num_labels = label_mask.sum()
        return loss, num_labels

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, num_labels), grad = grad_fn(state.params)
    loss = jax.tree_util.tree_map(lambda x: x / num_labels, loss)
    grad = jax.tree_util.tree_map(lambda x: x / num_labels, grad)
    new_state = state.apply_gradients(grads=grad)
    metrics = {"loss": loss, "learning_rate": bert_lr(state.step)}
    return new_state, metrics


def build_bert() -> Built:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    model = FlaxBertForMaskedLM(config, seed=0, dtype=jnp.float32)
    tx = optax.adamw(learning_rate=bert_lr, weight_decay=0.01, mask=decay_mask_fn)
    state = train_state.TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx)
    rng = np.random.default_rng(1)
    ids = rng.integers(5, VOCAB, (BATCH, SEQ))
    masked = rng.random((BATCH, SEQ)) < 0.25
    masked[:, 0] = True  # every example has a masked token (and so every micro-batch)
    labels = np.where(masked, ids, -100)
    input_ids = np.where(masked, 4, ids)  # 4 stands for [MASK]
    batch = {
        "input_ids": input_ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
        "labels": labels,
    }
    return Built(bert_train_step, (state, batch, jax.random.key(0)))


# --- Bart seq2seq with adafactor (run_summarization_flax.py) ------------------


def bart_loss_fn(
    logits: jax.Array, labels: jax.Array, padding_mask: jax.Array, label_smoothing_factor: float
) -> tuple[jax.Array, jax.Array]:
    """Cross entropy with label smoothing and padding mask."""
    vocab_size = logits.shape[-1]
    confidence = 1.0 - label_smoothing_factor
    low_confidence = (1.0 - confidence) / (vocab_size - 1)
    normalizing_constant = -(
        confidence * jnp.log(confidence)
        + (vocab_size - 1) * low_confidence * jnp.log(low_confidence + 1e-20)
    )
    soft_labels = onehot(labels, vocab_size, on_value=confidence, off_value=low_confidence)
    loss = optax.softmax_cross_entropy(logits, soft_labels)
    loss = loss - normalizing_constant
    # ignore padded tokens from loss
    loss = loss * padding_mask
    loss = loss.sum()
    num_labels = padding_mask.sum()
    return loss, num_labels


def bart_train_step(
    state: TrainState, batch: dict[str, Any], label_smoothing_factor: float = 0.0
) -> tuple[TrainState, dict[str, jax.Array]]:
    dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

    def compute_loss(params: Any) -> tuple[jax.Array, jax.Array]:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        loss, num_labels = bart_loss_fn(
            logits, labels, batch["decoder_attention_mask"], label_smoothing_factor
        )
        return loss, num_labels

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)
    (loss, num_labels), grad = grad_fn(state.params)
    # true loss = total loss / total samples
    loss = loss / num_labels
    grad = jax.tree_util.tree_map(lambda x: x / num_labels, grad)
    new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
    return new_state, {"loss": loss}


def build_bart() -> Built:
    config = BartConfig(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=16,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    model = FlaxBartForConditionalGeneration(config, seed=0, dtype=jnp.float32)
    rng, dropout_rng = jax.random.split(jax.random.PRNGKey(0))
    del rng
    state = TrainState.create(
        apply_fn=model.__call__,
        params=model.params,
        tx=optax.adafactor(learning_rate=1e-2),
        dropout_rng=dropout_rng,
    )
    gen = np.random.default_rng(2)
    input_ids = gen.integers(3, VOCAB, (BATCH, SEQ))
    input_ids[:, -1] = config.eos_token_id
    labels = gen.integers(3, VOCAB, (BATCH, 6))
    lengths = gen.integers(3, 7, (BATCH,))
    label_mask = (np.arange(6)[None, :] < lengths[:, None]).astype(np.int64)
    labels = np.where(label_mask == 1, labels, config.pad_token_id)
    decoder_input_ids = shift_tokens_right(
        labels, config.pad_token_id, config.decoder_start_token_id
    )
    batch = {
        "input_ids": input_ids,
        "attention_mask": np.ones_like(input_ids),
        "labels": labels,
        "decoder_input_ids": np.asarray(decoder_input_ids),
        "decoder_attention_mask": label_mask,
    }
    step = functools.partial(bart_train_step, label_smoothing_factor=0.1)
    return Built(step, (state, batch))


# --- ViT image classification (run_image_classification.py) ------------------

vit_lr = create_learning_rate_fn(num_train_steps=100, num_warmup_steps=1, learning_rate=1e-3)


def vit_train_step(
    state: TrainState, batch: dict[str, Any]
) -> tuple[TrainState, dict[str, jax.Array]]:
    dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

    def compute_loss(params: Any) -> jax.Array:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        loss = optax.softmax_cross_entropy(logits, onehot(labels, num_classes=4))
        return loss.mean()

    grad_fn = jax.value_and_grad(compute_loss)
    loss, grad = grad_fn(state.params)
    new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
    metrics = {"loss": loss, "learning_rate": vit_lr(state.step)}
    return new_state, metrics


def build_vit() -> Built:
    config = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=4,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    model = FlaxViTForImageClassification(config, seed=0, dtype=jnp.float32)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=vit_lr, weight_decay=0.05),
    )
    state = TrainState.create(
        apply_fn=model.__call__, params=model.params, tx=optimizer, dropout_rng=jax.random.key(1)
    )
    gen = np.random.default_rng(3)
    batch = {
        "pixel_values": gen.standard_normal((BATCH, 3, 8, 8)).astype(np.float32),
        "labels": gen.integers(0, 4, (BATCH,)),
    }
    return Built(vit_train_step, (state, batch))


_hf = functools.partial(Case, library="hf")

CASES = [
    _hf(name="gpt2_trainstate_dropout", build=build_gpt2),
    _hf(name="bert_mlm_dropout", build=build_bert),
    _hf(name="bart_seq2seq_adafactor", build=build_bart),
    _hf(name="vit_clip_adamw", build=build_vit),
]
