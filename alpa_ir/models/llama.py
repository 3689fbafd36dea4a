"""Llama family (Llama 3): pre-RMSNorm causal transformer with rotary position
embeddings (RoPE), grouped-query attention (GQA) and a SwiGLU feed-forward,
untied input embedding and LM head (Dubey et al., "The Llama 3 Herd of
Models", 2024, Table 3; Meta's reference ``model.py``).

Written with plain jax.numpy like :mod:`alpa_ir.models.layers`: RoPE rotates
the two halves of each head (``rotate_half``), K and V heads are repeated to
the query heads' count (``jnp.repeat`` along the head axis), the causal
softmax is the shared max-shifted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.models.family import Batch, ModelFamily, Variables, require
from alpa_ir.models.gpt import make_token_batch
from alpa_ir.models.layers import INIT_STD, boundary, cross_entropy, dense_init, softmax


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama model and the batch of one training step.

    ``num_kv_heads`` key/value heads are shared by ``num_heads // num_kv_heads``
    query heads each; ``ffn_size`` is the SwiGLU's inner width; ``rope_theta``
    the base of RoPE's frequencies (500,000 for Llama 3). ``dtype`` is the
    computation dtype; parameters and optimizer state stay float32.
    ``num_gpus`` is the GPU count of the run the size is benchmarked on.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    seq_len: int
    batch_size: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    num_gpus: int = 1
    dtype: Any = jnp.float32
    pipeline_markers: bool = False

    def __post_init__(self) -> None:
        require(
            self.hidden_size % self.num_heads == 0,
            f"LlamaConfig: hidden_size {self.hidden_size} is not divisible by "
            f"num_heads {self.num_heads}",
        )
        require(
            self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0,
            f"LlamaConfig: num_heads {self.num_heads} is not a multiple of "
            f"num_kv_heads {self.num_kv_heads}",
        )
        require(
            (self.hidden_size // self.num_heads) % 2 == 0,
            f"LlamaConfig: RoPE needs an even head dimension, got "
            f"{self.hidden_size // self.num_heads}",
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) * scale``, the statistics in float32."""

    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * scale).astype(self.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin of RoPE's angles ``t · θ^(-2i/d)``, ``[seq, head_dim]`` (each
    frequency twice: for the first and the second half of a head)."""
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x[b, s, heads, d]`` by the angles of its positions (``rotate_half``)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return (x.astype(jnp.float32) * c + rotated.astype(jnp.float32) * s).astype(x.dtype)


class GroupedQueryAttention(nn.Module):
    """Causal attention with ``num_kv_heads`` K/V heads shared by groups of query heads."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        batch, seq, _ = x.shape
        d, heads, kv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads

        def dense(width: int, name: str) -> nn.Dense:
            return nn.Dense(
                width, use_bias=False, dtype=cfg.dtype, kernel_init=dense_init(), name=name
            )

        q = dense(heads * d, "wq")(x).reshape(batch, seq, heads, d)
        k = dense(kv * d, "wk")(x).reshape(batch, seq, kv, d)
        v = dense(kv * d, "wv")(x).reshape(batch, seq, kv, d)
        cos, sin = rope_tables(seq, d, cfg.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = jnp.repeat(k, heads // kv, axis=2)
        v = jnp.repeat(v, heads // kv, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(d)
        mask = jnp.tril(jnp.ones((seq, seq), dtype=jnp.bool_))
        scores = jnp.where(mask[None, None], scores, jnp.finfo(jnp.float32).min)
        probs = softmax(scores).astype(cfg.dtype)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, heads * d)
        return dense(cfg.hidden_size, "wo")(ctx)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config

        def dense(width: int, name: str) -> nn.Dense:
            return nn.Dense(
                width, use_bias=False, dtype=cfg.dtype, kernel_init=dense_init(), name=name
            )

        gate = dense(cfg.ffn_size, "gate")(x)
        up = dense(cfg.ffn_size, "up")(x)
        return dense(cfg.hidden_size, "down")(jax.nn.silu(gate) * up)


class LlamaBlock(nn.Module):
    """``x + attn(norm(x))`` then ``x + ffn(norm(x))``."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        h = RMSNorm(cfg.norm_eps, cfg.dtype, name="attn_norm")(x)
        x = x + GroupedQueryAttention(cfg, name="attn")(h)
        h = RMSNorm(cfg.norm_eps, cfg.dtype, name="ffn_norm")(x)
        return x + SwiGLU(cfg, name="ffn")(h)


class Llama(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.config
        x = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            embedding_init=nn.initializers.normal(stddev=INIT_STD),
            dtype=cfg.dtype,
            name="embed",
        )(tokens)
        for i in range(cfg.num_layers):
            x = boundary(x, i, cfg.pipeline_markers)
            x = LlamaBlock(cfg, name=f"block_{i}")(x)
        x = RMSNorm(cfg.norm_eps, cfg.dtype, name="norm")(x)
        return nn.Dense(
            cfg.vocab_size, use_bias=False, dtype=cfg.dtype, kernel_init=dense_init(), name="head"
        )(x)


def _init(config: LlamaConfig, key: jax.Array, batch: Batch) -> Variables:
    return dict(Llama(config).init(key, batch["tokens"]))


def _loss(config: LlamaConfig, variables: Variables, batch: Batch) -> tuple[jax.Array, Variables]:
    logits = Llama(config).apply(variables, batch["tokens"])
    return cross_entropy(logits, batch["labels"]), {}


def _make_batch(config: LlamaConfig, key: jax.Array) -> Batch:
    return make_token_batch(config.batch_size, config.seq_len, config.vocab_size, key)


def layer_forward_flops(config: LlamaConfig, tokens: int) -> float:
    """Forward matmul FLOPs of one block on ``tokens`` tokens (2 per multiply-add):
    Q and O projections 2·2·T·h², K and V 2·2·T·h·(kv·d), scores and context
    2·2·T·s·h (the full square, as Megatron and Llama 3 count MFU), SwiGLU
    3·2·T·h·f."""
    h, s, f = config.hidden_size, config.seq_len, config.ffn_size
    kv_width = config.num_kv_heads * config.head_dim
    return tokens * (4.0 * h * h + 4.0 * h * kv_width + 4.0 * s * h + 6.0 * h * f)


def _flops(config: LlamaConfig) -> float:
    """Matmul FLOPs of one step without recomputation: three times the forward
    (every matmul has an input and a weight gradient), the forward being the
    blocks plus the LM head 2·T·h·V."""
    tokens = config.batch_size * config.seq_len
    head = 2.0 * tokens * config.hidden_size * config.vocab_size
    return 3.0 * (config.num_layers * layer_forward_flops(config, tokens) + head)


FAMILY = ModelFamily(
    name="llama",
    config_type=LlamaConfig,
    init=_init,
    loss=_loss,
    make_batch=_make_batch,
    flops=_flops,
)
