"""Alpa's mixture-of-experts model (``alpa.model.moe``): GShard's layer, as
Alpa writes it: self-attention, then a position-wise MoE feed-forward whose
tokens are grouped ``expert_group_size`` at a time and routed to two of
``expert_number`` experts (top-2 gating with capacity ``2 S / E`` per expert
and group); MoE and BERT layers alternate in ``FlaxMoELayerCollection``.

Parameter names are Alpa's (``moe/wg``, ``moe/wi``, ``moe/wo``,
``transformers/embeddings/...``, ``bias``), so that a test that looks a
weight up by its path (an expert-partitioned ``wi``) finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.compat.bert_model import (
    BertConfig,
    FlaxBertAttention,
    FlaxBertEmbeddings,
    FlaxBertLayer,
    FlaxBertLayerCollection,
    FlaxMaskedLMOutput,
)
from alpa_ir.compat.model_util import TrainState


class MoEConfig(BertConfig):
    """Alpa's MoE configuration: BERT's fields (no token types by default),
    ``expert_group_size`` (S, tokens per routing group) and
    ``expert_number`` (E)."""

    def __init__(
        self,
        expert_group_size: int = 8192,
        expert_number: int = 128,
        type_vocab_size: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(type_vocab_size=type_vocab_size, **kwargs)
        self.expert_group_size = expert_group_size
        self.expert_number = expert_number


def top2_gating(gates: jax.Array) -> tuple[jax.Array, jax.Array]:
    """GShard's top-2 routing of gate probabilities ``[G, S, E]``: each token
    goes to its two likeliest experts, in token order, while an expert has
    room (capacity ``C = 2 S / E`` per group; the second choices queue behind
    all the first ones). Returns the combine weights ``[G, S, E, C]`` (the
    two gates renormalised to sum to one) and the dispatch mask (where they
    are non-zero)."""
    _, s, e = gates.shape
    capacity = 2 * s // e
    first = jax.nn.one_hot(jnp.argmax(gates, axis=-1), e, dtype=jnp.int32)
    rest = gates * (1 - first)
    second = jax.nn.one_hot(jnp.argmax(rest, axis=-1), e, dtype=jnp.int32)
    # a token's slot at its expert: how many tokens took that expert before it
    slot_1 = jnp.cumsum(first, axis=-2) - first
    first = first * (slot_1 < capacity)
    slot_2 = jnp.cumsum(second, axis=-2) - second + jnp.sum(first, axis=-2, keepdims=True)
    second = second * (slot_2 < capacity)
    gate_1 = jnp.sum(gates * first, axis=-1)
    gate_2 = jnp.sum(rest * second, axis=-1)
    total = gate_1 + gate_2
    total = jnp.where(total > 0, total, 1.0)
    combine = jnp.zeros((*gates.shape, capacity), gates.dtype)
    for mask, slot, gate in ((first, slot_1, gate_1), (second, slot_2, gate_2)):
        position = jax.nn.one_hot(jnp.sum(slot * mask, axis=-1), capacity, dtype=gates.dtype)
        weight = (gate / total)[..., None] * mask.astype(gates.dtype)  # [G, S, E]
        combine = combine + weight[..., None] * position[:, :, None, :]
    return combine, combine.astype(jnp.bool_)


class FlaxPositionWiseMoELayer(nn.Module):
    """The experts' feed-forward: gate ``wg [M, E]``, experts' ``wi [E, M, H]``
    and ``wo [E, H, M]``."""

    config: MoEConfig
    kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        cfg = self.config
        s, m, h, e = (
            cfg.expert_group_size,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.expert_number,
        )
        wg = jnp.asarray(self.param("wg", self.kernel_init, (m, e)), self.dtype)
        wi = jnp.asarray(self.param("wi", self.kernel_init, (e, m, h)), self.dtype)
        wo = jnp.asarray(self.param("wo", self.kernel_init, (e, h, m)), self.dtype)
        tokens = jnp.reshape(jnp.asarray(inputs, self.dtype), (-1, s, m))  # [G, S, M]
        gates = jax.nn.softmax(jnp.einsum("GSM,ME->GSE", tokens, wg))
        combine, dispatch = top2_gating(gates)
        routed = jnp.einsum("GSEC,GSM->EGCM", dispatch, tokens)
        hidden = nn.relu(jnp.einsum("EGCM,EMH->EGCH", routed, wi))
        out = jnp.einsum("EGCH,EHM->GECM", hidden, wo)
        return jnp.reshape(jnp.einsum("GSEC,GECM->GSM", combine, out), inputs.shape)


class FlaxMoELayer(nn.Module):
    """Self-attention, then the MoE feed-forward with a residual LayerNorm.
    As Alpa's, a ``deterministic`` that is not a Python bool (traced) means
    deterministic, with the attention weights returned."""

    config: MoEConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        hidden_states: jax.Array,
        attention_mask: jax.Array | None,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> tuple[jax.Array, ...]:
        if not isinstance(deterministic, bool):
            deterministic, output_attentions = True, True
        cfg = self.config
        attn = FlaxBertAttention(cfg, self.dtype, name="attention")(
            hidden_states, attention_mask, deterministic, output_attentions
        )
        hidden = FlaxPositionWiseMoELayer(cfg, dtype=self.dtype, name="moe")(attn[0])
        hidden = nn.Dropout(rate=cfg.hidden_dropout_prob)(hidden, deterministic=deterministic)
        norm = nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=self.dtype, name="LayerNorm")
        return (norm(hidden + attn[0]), *attn[1:])


class FlaxMoELayerCollection(FlaxBertLayerCollection):
    """MoE layers (even indices) alternating with BERT layers (odd)."""

    def layer_type(self, index: int) -> Any:
        return FlaxMoELayer if index % 2 == 0 else FlaxBertLayer


class FlaxMoEForLMModule(nn.Module):
    """Embeddings, the alternating layers, and a language-model head (the
    word embeddings' transpose when ``tie_word_embeddings``, else a dense)
    plus a bias: Alpa's ``FlaxMoEForLMModule``."""

    config: MoEConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, position_ids: jax.Array,
                 deterministic: bool = True, output_attentions: bool = False,
                 output_hidden_states: bool = False, return_dict: bool = True) -> Any:  # fmt: skip
        cfg = self.config
        body = _MoEModule(cfg, self.dtype, name="transformers")
        outputs = body(input_ids, attention_mask, token_type_ids, position_ids, deterministic,
                       output_attentions, output_hidden_states, return_dict)  # fmt: skip
        if cfg.tie_word_embeddings:
            shared = body.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
            logits = outputs[0] @ shared.T
        else:
            logits = nn.Dense(cfg.vocab_size, dtype=self.dtype, use_bias=False, name="decoder")(
                outputs[0]
            )
        bias = self.param("bias", nn.initializers.zeros, (cfg.vocab_size,))
        logits = logits + jnp.asarray(bias, self.dtype)
        if not return_dict:
            return (logits, *outputs[1:])
        return FlaxMaskedLMOutput(logits, outputs.hidden_states, outputs.attentions)


class _MoEModule(nn.Module):
    config: MoEConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, position_ids: jax.Array,
                 deterministic: bool, output_attentions: bool,
                 output_hidden_states: bool, return_dict: bool) -> Any:  # fmt: skip
        hidden = FlaxBertEmbeddings(self.config, self.dtype, name="embeddings")(
            input_ids, token_type_ids, position_ids, attention_mask, deterministic
        )
        return _MoEEncoder(self.config, self.dtype, name="encoder")(
            hidden, attention_mask, deterministic, output_attentions, output_hidden_states,
            return_dict,
        )  # fmt: skip


class _MoEEncoder(nn.Module):
    config: MoEConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, *args: Any) -> Any:
        return FlaxMoELayerCollection(self.config, self.dtype, name="layer")(*args)


__all__ = [
    "FlaxMoEForLMModule",
    "FlaxMoELayer",
    "FlaxMoELayerCollection",
    "FlaxPositionWiseMoELayer",
    "MoEConfig",
    "TrainState",
    "top2_gating",
]
