"""GPT-3 family: pre-LayerNorm causal transformer with a tied LM head (Alpa §8.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.models.family import Batch, ModelFamily, Variables, require
from alpa_ir.models.layers import (
    INIT_STD,
    FeedForward,
    SelfAttention,
    attention_flops,
    boundary,
    cross_entropy,
    mlp_flops,
)


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-3 model and the batch of one training step.

    ``dtype`` is the computation dtype; parameters and optimizer state stay
    float32 (the usual mixed-precision recipe). ``num_gpus`` is the GPU count
    the Alpa paper trained this size on (Appendix B), for benchmarks.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    mlp_ratio: int = 4
    num_gpus: int = 1
    dtype: Any = jnp.float32
    pipeline_markers: bool = False

    def __post_init__(self) -> None:
        require(
            self.hidden_size % self.num_heads == 0,
            f"GPTConfig: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
        )


class GPTBlock(nn.Module):
    """``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    hidden_size: int
    num_heads: int
    mlp_ratio: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm(dtype=self.dtype, name="ln_1")(x)
        x = x + SelfAttention(self.hidden_size, self.num_heads, True, self.dtype, name="attn")(h)
        h = nn.LayerNorm(dtype=self.dtype, name="ln_2")(x)
        return x + FeedForward(self.hidden_size, self.mlp_ratio, self.dtype, name="mlp")(h)


class Embeddings(nn.Module):
    """Token embedding (shared with the LM head) plus a learned position embedding."""

    vocab_size: int
    hidden_size: int
    seq_len: int
    dtype: Any

    def setup(self) -> None:
        self.wte = nn.Embed(
            self.vocab_size,
            self.hidden_size,
            embedding_init=nn.initializers.normal(stddev=INIT_STD),
            dtype=self.dtype,
        )
        self.wpe = self.param(
            "wpe", nn.initializers.normal(stddev=INIT_STD / 2), (self.seq_len, self.hidden_size)
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        seq = tokens.shape[1]
        return self.wte(tokens) + self.wpe[None, :seq].astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied LM head: ``logits = x @ wte^T``."""
        return self.wte.attend(x)


class GPT(nn.Module):
    config: GPTConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.config
        embed = Embeddings(cfg.vocab_size, cfg.hidden_size, cfg.seq_len, cfg.dtype, name="embed")
        x = embed(tokens)
        for i in range(cfg.num_layers):
            x = boundary(x, i, cfg.pipeline_markers)
            x = GPTBlock(
                cfg.hidden_size, cfg.num_heads, cfg.mlp_ratio, cfg.dtype, name=f"block_{i}"
            )(x)
        x = nn.LayerNorm(dtype=cfg.dtype, name="ln_f")(x)
        return embed.attend(x)


def make_token_batch(batch_size: int, seq_len: int, vocab_size: int, key: jax.Array) -> Batch:
    """Random token ids with next-token labels (``labels[:, t] == tokens[:, t + 1]``)."""
    seq = jax.random.randint(key, (batch_size, seq_len + 1), 0, vocab_size, jnp.int32)
    return {"tokens": seq[:, :-1], "labels": seq[:, 1:]}


def _init(config: GPTConfig, key: jax.Array, batch: Batch) -> Variables:
    return dict(GPT(config).init(key, batch["tokens"]))


def _loss(config: GPTConfig, variables: Variables, batch: Batch) -> tuple[jax.Array, Variables]:
    logits = GPT(config).apply(variables, batch["tokens"])
    return cross_entropy(logits, batch["labels"]), {}


def _make_batch(config: GPTConfig, key: jax.Array) -> Batch:
    return make_token_batch(config.batch_size, config.seq_len, config.vocab_size, key)


def _flops(config: GPTConfig) -> float:
    """Matmul FLOPs of one step without activation recomputation.

    Forward: l transformer layers (``attention_flops`` + ``mlp_flops``) plus the LM
    head 2·B·s·h·V; backward is twice the forward (every matmul has an input
    and a weight gradient; the embedding output is differentiated, so even the
    first layer's input gradient is computed). For r = 4 this is Megatron's
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)); with full recomputation Megatron
    counts the layers four times, 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
    """
    tokens = config.batch_size * config.seq_len
    layer = attention_flops(tokens, config.seq_len, config.hidden_size) + mlp_flops(
        tokens, config.hidden_size, config.mlp_ratio
    )
    head = 2.0 * tokens * config.hidden_size * config.vocab_size
    return 3.0 * (config.num_layers * layer + head)


FAMILY = ModelFamily(
    name="gpt",
    config_type=GPTConfig,
    init=_init,
    loss=_loss,
    make_batch=_make_batch,
    flops=_flops,
)
