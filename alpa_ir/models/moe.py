"""GShard mixture-of-experts language model (Lepikhin et al. 2020; Alpa §8.1).

Like GPT, but every ``moe_every``-th layer's MLP is a mixture of experts with
top-2 gating. Tokens are split into groups of ``expert_group_size`` (GShard's
groups, so that the dispatch tensor is [G, S, E, C] rather than quadratic in
all tokens); each expert takes at most C = ceil(capacity_factor·2·S/E) tokens
of a group, first choices before second choices, the rest are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.models.family import Batch, ModelFamily, Variables, require
from alpa_ir.models.gpt import Embeddings, GPTBlock, make_token_batch
from alpa_ir.models.layers import (
    SelfAttention,
    attention_flops,
    boundary,
    cross_entropy,
    dense_init,
    mlp_flops,
    softmax,
)


@dataclass(frozen=True)
class MoEConfig:
    """A GShard MoE model and the batch of one training step.

    Layer ``i`` is an MoE layer when ``i % moe_every == moe_every - 1`` (every
    other layer by default, as in GShard). ``mlp_ratio`` sets the inner size of
    the dense MLPs and of every expert ([E, h, r·h] and [E, r·h, h] weights);
    Alpa's benchmark used r = 8, which the paper's parameter counts imply.
    ``aux_loss_weight`` scales GShard's load-balancing loss (summed over MoE layers).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    num_experts: int
    expert_group_size: int = 2048
    capacity_factor: float = 1.0
    mlp_ratio: int = 4
    moe_every: int = 2
    aux_loss_weight: float = 0.01
    num_gpus: int = 1
    dtype: Any = jnp.float32
    pipeline_markers: bool = False

    def __post_init__(self) -> None:
        require(
            self.hidden_size % self.num_heads == 0,
            f"MoEConfig: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
        )
        tokens = self.batch_size * self.seq_len
        require(
            tokens % self.expert_group_size == 0,
            f"MoEConfig: batch_size*seq_len = {tokens} is not divisible by "
            f"expert_group_size {self.expert_group_size}",
        )
        require(
            self.num_experts >= 2,
            f"MoEConfig: top-2 gating needs >= 2 experts, got {self.num_experts}",
        )

    @property
    def num_groups(self) -> int:
        return self.batch_size * self.seq_len // self.expert_group_size

    @property
    def capacity(self) -> int:
        return expert_capacity(self.expert_group_size, self.num_experts, self.capacity_factor)

    def is_moe_layer(self, index: int) -> bool:
        return index % self.moe_every == self.moe_every - 1


def expert_capacity(group_size: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert and group: ceil(capacity_factor · 2 · S / E), at least 1, at most S."""
    return max(1, min(group_size, math.ceil(capacity_factor * 2 * group_size / num_experts)))


class Gating(NamedTuple):
    """``combine`` [G, S, E, C] gate weights, ``dispatch`` [G, S, E, C] 0/1, ``aux_loss`` scalar."""

    combine: jax.Array
    dispatch: jax.Array
    aux_loss: jax.Array


def top2_gating(logits: jax.Array, capacity: int) -> Gating:
    """GShard top-2 gating (Lepikhin et al. 2020, Algorithm 1) without random routing.

    ``logits`` is [G, S, E]. A token's first choice is its arg-max expert, its
    second the arg-max of the others. Positions in an expert's buffer come from
    a cumulative sum over the group, first choices of all tokens before any
    second choice; a choice whose position is >= ``capacity`` is dropped. The
    two kept gates are renormalised to sum to 1. The auxiliary loss is
    E² · mean_{g,e}(fraction of first choices to e · mean gate of e), which is
    1 for a uniform router.
    """
    num_experts = logits.shape[-1]
    gates = softmax(logits.astype(jnp.float32))
    index_1 = jnp.argmax(gates, axis=-1)
    mask_1 = jax.nn.one_hot(index_1, num_experts, dtype=jnp.float32)
    masked_logits = jnp.where(mask_1 > 0, -jnp.inf, logits.astype(jnp.float32))
    index_2 = jnp.argmax(masked_logits, axis=-1)
    mask_2 = jax.nn.one_hot(index_2, num_experts, dtype=jnp.float32)
    gate_1 = jnp.sum(gates * mask_1, axis=-1)
    gate_2 = jnp.sum(gates * mask_2, axis=-1)

    density = jnp.mean(mask_1, axis=1)
    density_proxy = jnp.mean(gates, axis=1)
    aux_loss = jnp.mean(density * density_proxy) * float(num_experts * num_experts)

    # Exclusive cumulative count of earlier tokens choosing the same expert.
    position_1 = jnp.cumsum(mask_1, axis=1) - mask_1
    mask_1 = mask_1 * (position_1 < capacity)
    kept_first = jnp.sum(mask_1, axis=1, keepdims=True)
    position_2 = jnp.cumsum(mask_2, axis=1) - mask_2 + kept_first
    mask_2 = mask_2 * (position_2 < capacity)

    denom = gate_1 + gate_2 + jnp.finfo(jnp.float32).eps
    gate_1, gate_2 = gate_1 / denom, gate_2 / denom

    def slots(mask: jax.Array, position: jax.Array) -> jax.Array:
        token_position = jnp.sum(position * mask, axis=-1).astype(jnp.int32)
        return (
            mask[..., None]
            * jax.nn.one_hot(token_position, capacity, dtype=jnp.float32)[:, :, None, :]
        )

    dispatch_1 = slots(mask_1, position_1)
    dispatch_2 = slots(mask_2, position_2)
    combine = gate_1[..., None, None] * dispatch_1 + gate_2[..., None, None] * dispatch_2
    return Gating(combine=combine, dispatch=dispatch_1 + dispatch_2, aux_loss=aux_loss)


class MoELayer(nn.Module):
    """Gate, dispatch, per-expert GELU MLP by einsum over [E, G, C, h], combine."""

    hidden_size: int
    num_experts: int
    mlp_ratio: int
    group_size: int
    capacity_factor: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        batch, seq, hidden = x.shape
        experts, inner = self.num_experts, self.mlp_ratio * hidden
        groups = batch * seq // self.group_size
        xg = x.reshape(groups, self.group_size, hidden)
        logits = nn.Dense(
            experts, use_bias=False, dtype=jnp.float32, kernel_init=dense_init(), name="gate"
        )(xg)
        capacity = expert_capacity(self.group_size, experts, self.capacity_factor)
        gating = top2_gating(logits, capacity)

        wi = self.param("wi", dense_init(), (experts, hidden, inner))
        bi = self.param("bi", nn.initializers.zeros, (experts, inner))
        wo = self.param("wo", dense_init(), (experts, inner, hidden))
        bo = self.param("bo", nn.initializers.zeros, (experts, hidden))
        wi, bi, wo, bo = (w.astype(self.dtype) for w in (wi, bi, wo, bo))

        expert_in = jnp.einsum("gsec,gsm->egcm", gating.dispatch.astype(self.dtype), xg)
        h = jnp.einsum("egcm,emf->egcf", expert_in, wi) + bi[:, None, None, :]
        h = jax.nn.gelu(h, approximate=True)
        out = jnp.einsum("egcf,efm->egcm", h, wo) + bo[:, None, None, :]
        y = jnp.einsum("gsec,egcm->gsm", gating.combine.astype(self.dtype), out)
        return y.reshape(batch, seq, hidden), gating.aux_loss


class MoEBlock(nn.Module):
    """Pre-LayerNorm block whose MLP is an MoE layer; returns (x, aux_loss)."""

    config: MoEConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        h = nn.LayerNorm(dtype=cfg.dtype, name="ln_1")(x)
        x = x + SelfAttention(cfg.hidden_size, cfg.num_heads, True, cfg.dtype, name="attn")(h)
        h = nn.LayerNorm(dtype=cfg.dtype, name="ln_2")(x)
        y, aux = MoELayer(
            cfg.hidden_size,
            cfg.num_experts,
            cfg.mlp_ratio,
            cfg.expert_group_size,
            cfg.capacity_factor,
            cfg.dtype,
            name="moe",
        )(h)
        return x + y, aux


class MoETransformer(nn.Module):
    """Returns (logits [B, s, V], summed auxiliary loss of all MoE layers)."""

    config: MoEConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        embed = Embeddings(cfg.vocab_size, cfg.hidden_size, cfg.seq_len, cfg.dtype, name="embed")
        x = embed(tokens)
        aux_total = jnp.zeros((), jnp.float32)
        for i in range(cfg.num_layers):
            x = boundary(x, i, cfg.pipeline_markers)
            if cfg.is_moe_layer(i):
                x, aux = MoEBlock(cfg, name=f"block_{i}")(x)
                aux_total = aux_total + aux
            else:
                x = GPTBlock(
                    cfg.hidden_size, cfg.num_heads, cfg.mlp_ratio, cfg.dtype, name=f"block_{i}"
                )(x)
        x = nn.LayerNorm(dtype=cfg.dtype, name="ln_f")(x)
        return embed.attend(x), aux_total


def _init(config: MoEConfig, key: jax.Array, batch: Batch) -> Variables:
    return dict(MoETransformer(config).init(key, batch["tokens"]))


def _loss(config: MoEConfig, variables: Variables, batch: Batch) -> tuple[jax.Array, Variables]:
    logits, aux = MoETransformer(config).apply(variables, batch["tokens"])
    return cross_entropy(logits, batch["labels"]) + config.aux_loss_weight * aux, {}


def _make_batch(config: MoEConfig, key: jax.Array) -> Batch:
    return make_token_batch(config.batch_size, config.seq_len, config.vocab_size, key)


def _flops(config: MoEConfig) -> float:
    """Matmul FLOPs of one step (no recomputation), 2 FLOPs per multiply-add.

    Per MoE layer forward, with T tokens, E experts, C capacity, G groups:
    gate 2·T·h·E, dispatch einsum 2·T·E·C·h, experts 2·(E·G·C)·2·r·h², combine
    2·T·E·C·h. Backward doubles every matmul except the dispatch einsum, whose
    0/1 dispatch tensor has no gradient (only the token gradient is computed).
    Attention, dense MLPs and the tied LM head as in GPT.
    """
    h, r = config.hidden_size, config.mlp_ratio
    tokens = config.batch_size * config.seq_len
    slots = config.num_experts * config.num_groups * config.capacity
    num_moe = sum(config.is_moe_layer(i) for i in range(config.num_layers))
    num_dense = config.num_layers - num_moe
    dispatch = 2.0 * tokens * config.num_experts * config.capacity * h
    differentiable = (
        config.num_layers * attention_flops(tokens, config.seq_len, h)
        + num_dense * mlp_flops(tokens, h, r)
        + num_moe * (2.0 * tokens * h * config.num_experts + 4.0 * slots * r * h * h + dispatch)
        + 2.0 * tokens * h * config.vocab_size
    )
    return 3.0 * differentiable + 2.0 * num_moe * dispatch


FAMILY = ModelFamily(
    name="moe",
    config_type=MoEConfig,
    init=_init,
    loss=_loss,
    make_batch=_make_batch,
    flops=_flops,
)
