"""Alpa's BERT (``alpa.model.bert_model``): the Hugging Face layout Alpa's
tests build on, with Alpa's two changes: one fused ``qvk_combined``
projection in self-attention, and optional pipeline boundaries every
``num_hidden_layers / pipeline_mp_size`` layers
(``add_manual_pipeline_markers``). The parameter tree has Alpa's names
(``embeddings/word_embeddings``, ``encoder/layer/<i>/attention/self/qvk_combined``,
...), so that tests that look a weight up by its path find it.

``FlaxBertLayer``, ``FlaxBertLayerCollection``, ``FlaxBertModule`` and
``FlaxBertForMaskedLMModule`` take Alpa's arguments and return Alpa's outputs
(tuples, or ``FlaxBaseModelOutput``/``FlaxMaskedLMOutput`` with
``return_dict``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from alpa_ir.compat.model_util import TrainState
from alpa_ir.frontend.markers import mark_pipeline_boundary

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
}


class BertConfig:
    """Alpa's BERT configuration (its fields and defaults: BERT-base)."""

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        gradient_checkpointing: bool = False,
        position_embedding_type: str = "absolute",
        use_cache: bool = True,
        classifier_dropout: float | None = None,
        num_labels: int | None = None,
        tie_word_embeddings: bool = True,
        add_manual_pipeline_markers: bool = False,
        pipeline_mp_size: int = 0,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.intermediate_size, self.hidden_act = intermediate_size, hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings, self.type_vocab_size = (
            max_position_embeddings,
            type_vocab_size,
        )
        self.initializer_range, self.layer_norm_eps = initializer_range, layer_norm_eps
        self.gradient_checkpointing = gradient_checkpointing
        self.position_embedding_type, self.use_cache = position_embedding_type, use_cache
        self.classifier_dropout, self.num_labels = classifier_dropout, num_labels
        self.tie_word_embeddings = tie_word_embeddings
        self.add_manual_pipeline_markers = add_manual_pipeline_markers
        self.pipeline_mp_size = pipeline_mp_size
        for key, value in kwargs.items():
            setattr(self, key, value)


@flax.struct.dataclass
class FlaxBaseModelOutput:
    last_hidden_state: Any = None
    hidden_states: Any = None
    attentions: Any = None

    def __getitem__(self, k: int) -> Any:
        return _present(self)[k]


@flax.struct.dataclass
class FlaxMaskedLMOutput:
    logits: Any = None
    hidden_states: Any = None
    attentions: Any = None

    def __getitem__(self, k: int) -> Any:
        return _present(self)[k]


def _present(output: Any) -> tuple[Any, ...]:
    """An output's fields that are set, in order (Hugging Face's indexing)."""
    return tuple(
        v for v in (getattr(output, f) for f in output.__dataclass_fields__) if v is not None
    )


def _dense(config: BertConfig, features: int, dtype: Any, name: str | None = None) -> nn.Dense:
    init = jax.nn.initializers.normal(config.initializer_range)
    return nn.Dense(features, dtype=dtype, kernel_init=init, name=name)


class FlaxBertEmbeddings(nn.Module):
    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        token_type_ids: jax.Array,
        position_ids: jax.Array,
        attention_mask: jax.Array,
        deterministic: bool = True,
    ) -> jax.Array:
        cfg = self.config
        init = jax.nn.initializers.normal(stddev=cfg.initializer_range)
        hidden = nn.Embed(cfg.vocab_size, cfg.hidden_size, embedding_init=init,
                          dtype=self.dtype, name="word_embeddings")(input_ids.astype("i4"))  # fmt: skip
        hidden = hidden + nn.Embed(
            cfg.max_position_embeddings, cfg.hidden_size, embedding_init=init,
            dtype=self.dtype, name="position_embeddings",
        )(position_ids.astype("i4"))  # fmt: skip
        if cfg.type_vocab_size > 0:
            hidden = hidden + nn.Embed(
                cfg.type_vocab_size, cfg.hidden_size, embedding_init=init, dtype=self.dtype,
                name="token_type_embeddings",
            )(token_type_ids.astype("i4"))  # fmt: skip
        hidden = nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(
            hidden
        )
        return nn.Dropout(rate=cfg.hidden_dropout_prob)(hidden, deterministic=deterministic)


class FlaxBertSelfAttention(nn.Module):
    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        hidden_states: jax.Array,
        attention_mask: jax.Array | None,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> tuple[jax.Array, ...]:
        cfg = self.config
        heads = cfg.num_attention_heads
        if cfg.hidden_size % heads:
            raise ValueError(
                f"hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads {heads}"
            )
        head_dim = cfg.hidden_size // heads
        fused = _dense(cfg, 3 * cfg.hidden_size, self.dtype, "qvk_combined")(hidden_states)
        # Alpa's layout: the last axis interleaves q, v, k per feature
        fused = fused.reshape((*fused.shape[:2], -1, 3))
        shape = (*hidden_states.shape[:2], heads, head_dim)
        query, value, key = (fused[..., k].reshape(shape) for k in range(3))
        bias = None
        if attention_mask is not None:
            mask = jnp.expand_dims(attention_mask, axis=(-3, -2))
            bias = jnp.where(mask > 0, 0.0, -1e10).astype(self.dtype)
        dropout_rng = None
        if not deterministic and cfg.attention_probs_dropout_prob > 0.0:
            dropout_rng = self.make_rng("dropout")
        weights = nn.attention.dot_product_attention_weights(
            query, key, bias=bias, dropout_rng=dropout_rng,
            dropout_rate=cfg.attention_probs_dropout_prob, broadcast_dropout=False,
            deterministic=deterministic, dtype=self.dtype,
        )  # fmt: skip
        out = jnp.einsum("...hqk,...khd->...qhd", weights, value)
        out = out.reshape((*out.shape[:2], -1))
        return (out, weights) if output_attentions else (out,)


class FlaxBertResidualOutput(nn.Module):
    """Dense, dropout, then LayerNorm of the sum with the block's input
    (Hugging Face's ``BertSelfOutput`` and ``BertOutput``)."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self, hidden_states: jax.Array, residual: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        cfg = self.config
        hidden = _dense(cfg, cfg.hidden_size, self.dtype, "dense")(hidden_states)
        hidden = nn.Dropout(rate=cfg.hidden_dropout_prob)(hidden, deterministic=deterministic)
        norm = nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=self.dtype, name="LayerNorm")
        return norm(hidden + residual)


class FlaxBertAttention(nn.Module):
    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        hidden_states: jax.Array,
        attention_mask: jax.Array | None,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> tuple[jax.Array, ...]:
        attn = FlaxBertSelfAttention(self.config, self.dtype, name="self")(
            hidden_states, attention_mask, deterministic, output_attentions
        )
        out = FlaxBertResidualOutput(self.config, self.dtype, name="output")(
            attn[0], hidden_states, deterministic
        )
        return (out, *attn[1:])


class FlaxBertLayer(nn.Module):
    """One encoder layer: ``(hidden_states, attention_mask, deterministic,
    output_attentions) -> (hidden_states[, attention weights])``."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        hidden_states: jax.Array,
        attention_mask: jax.Array | None,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> tuple[jax.Array, ...]:
        cfg = self.config
        attn = FlaxBertAttention(cfg, self.dtype, name="attention")(
            hidden_states, attention_mask, deterministic, output_attentions
        )
        intermediate = ACTIVATIONS[cfg.hidden_act](
            _Intermediate(cfg, self.dtype, name="intermediate")(attn[0])
        )
        out = FlaxBertResidualOutput(cfg, self.dtype, name="output")(
            intermediate, attn[0], deterministic
        )
        return (out, *attn[1:])


class _Intermediate(nn.Module):
    """The feed-forward's first projection (``intermediate/dense``)."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        cfg = self.config
        return _dense(cfg, cfg.intermediate_size, self.dtype, "dense")(hidden_states)


class FlaxBertLayerCollection(nn.Module):
    """``num_hidden_layers`` layers named ``"0"``, ``"1"``, ...; with
    ``add_manual_pipeline_markers`` a pipeline boundary after every
    ``num_hidden_layers / pipeline_mp_size`` of them."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        hidden_states: jax.Array,
        attention_mask: jax.Array | None,
        deterministic: bool = True,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
    ) -> Any:
        cfg = self.config
        attentions: tuple[Any, ...] | None = () if output_attentions else None
        states: tuple[Any, ...] | None = () if output_hidden_states else None
        n = cfg.num_hidden_layers
        per_stage = n // cfg.pipeline_mp_size if cfg.add_manual_pipeline_markers else 0
        if per_stage and n % cfg.pipeline_mp_size:
            raise ValueError(
                f"num_hidden_layers {n} is not a multiple of pipeline_mp_size "
                f"{cfg.pipeline_mp_size}"
            )
        for i in range(n):
            if states is not None:
                states += (hidden_states,)
            layer_type = self.layer_type(i)
            if cfg.gradient_checkpointing:
                layer_type = nn.remat(layer_type, static_argnums=(3, 4))
            outs = layer_type(cfg, self.dtype, name=str(i))(
                hidden_states, attention_mask, deterministic, output_attentions
            )
            hidden_states = outs[0]
            if attentions is not None:
                attentions += (outs[1],)
            if per_stage and i % per_stage == per_stage - 1 and i != n - 1:
                mark_pipeline_boundary()
        if states is not None:
            states += (hidden_states,)
        if not return_dict:
            return (hidden_states,)
        return FlaxBaseModelOutput(hidden_states, states, attentions)

    def layer_type(self, index: int) -> Any:
        """The module of layer ``index`` (a BERT layer; MoE alternates)."""
        del index
        return FlaxBertLayer


class FlaxBertEncoder(nn.Module):
    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array | None,
                 deterministic: bool = True, output_attentions: bool = False,
                 output_hidden_states: bool = False, return_dict: bool = True) -> Any:  # fmt: skip
        return FlaxBertLayerCollection(self.config, self.dtype, name="layer")(
            hidden_states, attention_mask, deterministic, output_attentions,
            output_hidden_states, return_dict,
        )  # fmt: skip


class FlaxBertModule(nn.Module):
    """Embeddings and encoder (Alpa's ``FlaxBertModule``; no pooler here:
    ``add_pooling_layer`` is accepted for the masked-LM model, which has none)."""

    config: BertConfig
    dtype: Any = jnp.float32
    add_pooling_layer: bool = False

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, position_ids: jax.Array,
                 deterministic: bool = True, output_attentions: bool = False,
                 output_hidden_states: bool = False, return_dict: bool = True) -> Any:  # fmt: skip
        if self.add_pooling_layer:
            raise ValueError("alpa_ir's FlaxBertModule has no pooling layer")
        hidden = FlaxBertEmbeddings(self.config, self.dtype, name="embeddings")(
            input_ids, token_type_ids, position_ids, attention_mask, deterministic
        )
        return FlaxBertEncoder(self.config, self.dtype, name="encoder")(
            hidden, attention_mask, deterministic, output_attentions,
            output_hidden_states, return_dict,
        )  # fmt: skip


class FlaxBertForMaskedLMModule(nn.Module):
    """BERT with the masked-LM head (Alpa's): ``logits`` over the vocabulary,
    the decoder tied to the word embeddings when ``tie_word_embeddings``."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, position_ids: jax.Array,
                 deterministic: bool = True, output_attentions: bool = False,
                 output_hidden_states: bool = False, return_dict: bool = True) -> Any:  # fmt: skip
        cfg = self.config
        bert = FlaxBertModule(cfg, self.dtype, name="bert")
        outputs = bert(input_ids, attention_mask, token_type_ids, position_ids, deterministic,
                       output_attentions, output_hidden_states, return_dict)  # fmt: skip
        shared = None
        if cfg.tie_word_embeddings:
            shared = bert.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
        logits = _MLMHead(cfg, self.dtype, name="cls")(outputs[0], shared)
        if not return_dict:
            return (logits, *outputs[1:])
        return FlaxMaskedLMOutput(logits, outputs.hidden_states, outputs.attentions)


class _MLMHead(nn.Module):
    """``cls/predictions``: dense, activation, LayerNorm, then the decoder
    (the shared embedding's transpose, or a dense) plus a bias."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden_states: jax.Array, shared_embedding: jax.Array | None) -> jax.Array:
        return _Predictions(self.config, self.dtype, name="predictions")(
            hidden_states, shared_embedding
        )


class _Predictions(nn.Module):
    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden_states: jax.Array, shared_embedding: jax.Array | None) -> jax.Array:
        cfg = self.config
        hidden = _Transform(cfg, self.dtype, name="transform")(hidden_states)
        if shared_embedding is not None:
            hidden = hidden @ shared_embedding.T
        else:
            hidden = nn.Dense(cfg.vocab_size, dtype=self.dtype, use_bias=False, name="decoder")(
                hidden
            )
        bias = self.param("bias", jax.nn.initializers.zeros, (cfg.vocab_size,))
        return hidden + bias


class _Transform(nn.Module):
    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        cfg = self.config
        hidden = nn.Dense(cfg.hidden_size, dtype=self.dtype, name="dense")(hidden_states)
        hidden = ACTIVATIONS[cfg.hidden_act](hidden)
        return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(hidden)


__all__ = [
    "BertConfig",
    "FlaxBaseModelOutput",
    "FlaxBertForMaskedLMModule",
    "FlaxBertLayer",
    "FlaxBertLayerCollection",
    "FlaxBertModule",
    "FlaxMaskedLMOutput",
    "TrainState",
]
