"""Building blocks shared by the transformer families, written with plain jax.numpy.

Softmax and log-softmax are spelled out (max-shift, exp, sum) instead of
``jax.nn.softmax`` so that the jaxpr holds only ordinary primitives (no
``custom_jvp_call``); the cross-entropy uses a one-hot product rather than a
gather, which every sharding rule understands.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.frontend.markers import mark_pipeline_boundary

INIT_STD = 0.02
"""GPT-2/3 initialisation: normal(0, 0.02) for dense and embedding weights."""


def dense_init() -> Any:
    return nn.initializers.normal(stddev=INIT_STD)


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """Numerically stable softmax with a stop-gradient max shift."""
    shifted = x - jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    e = jnp.exp(shifted)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    shifted = x - jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean token/sample cross-entropy in float32; labels are integer class ids."""
    logp = log_softmax(logits.astype(jnp.float32))
    onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    return -jnp.mean(jnp.sum(onehot * logp, axis=-1))


def mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    diff = pred.astype(jnp.float32) - target.astype(jnp.float32)
    return jnp.mean(diff * diff)


def boundary(x: Any, index: int, enabled: bool) -> Any:
    """Mark a pipeline boundary before layer ``index`` (none before the first layer)."""
    if enabled and index > 0:
        return mark_pipeline_boundary(x)
    return x


class SelfAttention(nn.Module):
    """Multi-head softmax self-attention: fused QKV projection, optional causal mask."""

    hidden_size: int
    num_heads: int
    causal: bool
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, seq, _ = x.shape
        head_dim = self.hidden_size // self.num_heads
        qkv = nn.Dense(
            3 * self.hidden_size, dtype=self.dtype, kernel_init=dense_init(), name="qkv"
        )(x)
        qkv = qkv.reshape(batch, seq, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        scores = scores.astype(jnp.float32)
        if self.causal:
            mask = jnp.tril(jnp.ones((seq, seq), dtype=jnp.bool_))
            scores = jnp.where(mask[None, None], scores, jnp.finfo(jnp.float32).min)
        probs = softmax(scores).astype(self.dtype)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, self.hidden_size)
        return nn.Dense(self.hidden_size, dtype=self.dtype, kernel_init=dense_init(), name="out")(
            ctx
        )


class FeedForward(nn.Module):
    """Dense ``hidden -> ratio*hidden`` GELU ``-> hidden`` (the transformer MLP)."""

    hidden_size: int
    mlp_ratio: int = 4
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.Dense(
            self.mlp_ratio * self.hidden_size,
            dtype=self.dtype,
            kernel_init=dense_init(),
            name="fc1",
        )(x)
        h = jax.nn.gelu(h, approximate=True)
        return nn.Dense(self.hidden_size, dtype=self.dtype, kernel_init=dense_init(), name="fc2")(h)


def attention_flops(tokens: int, seq_len: int, hidden: int) -> float:
    """Forward matmul FLOPs of one self-attention sublayer (2 FLOPs per multiply-add).

    QKV and output projections 2·T·4h², attention scores and context 2·2·T·s·h
    (T tokens, s sequence length, h hidden); element-wise work is not counted.
    """
    return 8.0 * tokens * hidden**2 + 4.0 * tokens * seq_len * hidden


def mlp_flops(tokens: int, hidden: int, mlp_ratio: int) -> float:
    """Forward matmul FLOPs of one dense MLP sublayer: 2·T·2·r·h²."""
    return 4.0 * mlp_ratio * tokens * hidden**2
