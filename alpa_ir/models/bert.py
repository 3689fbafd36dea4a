"""BERT encoder layers on given hidden states: post-LayerNorm, bidirectional attention.

The input is already embedded (``x[B, s, h]``), so the model is the encoder
stack alone: the smallest real transformer workload. ``head="mse"`` regresses
a target of the same shape; ``head="classify"`` mean-pools the sequence into a
dense classifier with cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.models.family import Batch, ModelFamily, Variables, require
from alpa_ir.models.layers import (
    FeedForward,
    SelfAttention,
    attention_flops,
    boundary,
    cross_entropy,
    mlp_flops,
    mse,
)


@dataclass(frozen=True)
class BertConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    head: Literal["mse", "classify"] = "mse"
    num_classes: int = 8
    mlp_ratio: int = 4
    num_gpus: int = 1
    dtype: Any = jnp.float32
    pipeline_markers: bool = False

    def __post_init__(self) -> None:
        require(
            self.hidden_size % self.num_heads == 0,
            f"BertConfig: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
        )
        require(
            self.head in ("mse", "classify"),
            f"BertConfig: head must be 'mse' or 'classify', got {self.head!r}",
        )


class BertLayer(nn.Module):
    """``ln(x + attn(x))`` then ``ln(x + mlp(x))`` (post-LayerNorm, as in BERT)."""

    hidden_size: int
    num_heads: int
    mlp_ratio: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        attn = SelfAttention(self.hidden_size, self.num_heads, False, self.dtype, name="attn")(x)
        x = nn.LayerNorm(dtype=self.dtype, name="ln_attn")(x + attn)
        mlp = FeedForward(self.hidden_size, self.mlp_ratio, self.dtype, name="mlp")(x)
        return nn.LayerNorm(dtype=self.dtype, name="ln_mlp")(x + mlp)


class BertEncoder(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        for i in range(cfg.num_layers):
            x = boundary(x, i, cfg.pipeline_markers)
            x = BertLayer(
                cfg.hidden_size, cfg.num_heads, cfg.mlp_ratio, cfg.dtype, name=f"layer_{i}"
            )(x)
        if cfg.head == "classify":
            x = nn.Dense(cfg.num_classes, dtype=cfg.dtype, name="classifier")(jnp.mean(x, axis=1))
        return x


def _init(config: BertConfig, key: jax.Array, batch: Batch) -> Variables:
    return dict(BertEncoder(config).init(key, batch["x"]))


def _loss(config: BertConfig, variables: Variables, batch: Batch) -> tuple[jax.Array, Variables]:
    out = BertEncoder(config).apply(variables, batch["x"])
    if config.head == "mse":
        return mse(out, batch["y"]), {}
    return cross_entropy(out, batch["y"]), {}


def _make_batch(config: BertConfig, key: jax.Array) -> Batch:
    kx, ky = jax.random.split(key)
    shape = (config.batch_size, config.seq_len, config.hidden_size)
    x = jax.random.normal(kx, shape, config.dtype)
    if config.head == "mse":
        y = jax.random.normal(ky, shape, config.dtype)
    else:
        y = jax.random.randint(ky, (config.batch_size,), 0, config.num_classes, jnp.int32)
    return {"x": x, "y": y}


def _flops(config: BertConfig) -> float:
    """Matmul FLOPs of one step: three times the forward, except that the first
    layer's QKV projection (2·T·3h² forward) reads the data and gets no input gradient."""
    tokens, h = config.batch_size * config.seq_len, config.hidden_size
    layer = attention_flops(tokens, config.seq_len, h) + mlp_flops(tokens, h, config.mlp_ratio)
    forward = config.num_layers * layer
    if config.head == "classify":
        forward += 2.0 * config.batch_size * h * config.num_classes
    return 3.0 * forward - 6.0 * tokens * h * h


FAMILY = ModelFamily(
    name="bert",
    config_type=BertConfig,
    init=_init,
    loss=_loss,
    make_batch=_make_batch,
    flops=_flops,
)
