"""Alpa's BERT (``alpa_ir.model.bert_model``): the masked-LM model equals
Hugging Face's Flax BERT given the same weights (Alpa's fused ``qvk_combined``
built from HF's query, value and key), a layer trains under ``parallelize``
as on one device, and ``add_manual_pipeline_markers`` cuts the collection
into ``pipeline_mp_size`` layers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import alpa_ir
from alpa_ir.model.bert_model import (
    BertConfig,
    FlaxBertForMaskedLMModule,
    FlaxBertLayer,
    FlaxBertLayerCollection,
    TrainState,
)
from alpa_ir.testing import assert_allclose

SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=16)  # fmt: skip


def _inputs(batch: int = 2, seq: int = 8) -> dict[str, jax.Array]:
    ids = jax.random.randint(jax.random.PRNGKey(3), (batch, seq), 0, SIZES["vocab_size"])
    mask = jnp.ones((batch, seq), jnp.int32).at[0, -2:].set(0)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": jnp.zeros_like(ids),
        "position_ids": jnp.broadcast_to(jnp.arange(seq), ids.shape),
    }


def _from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """HF Flax BERT's masked-LM parameters in Alpa's layout."""
    bert = hf["bert"]
    layers = {}
    for name, layer in bert["encoder"]["layer"].items():
        attn = layer["attention"]["self"]
        q, k, v = attn["query"], attn["key"], attn["value"]
        # Alpa's fused projection interleaves q, v, k per output feature
        kernel = jnp.stack([q["kernel"], v["kernel"], k["kernel"]], axis=-1)
        bias = jnp.stack([q["bias"], v["bias"], k["bias"]], axis=-1)
        layers[name] = {
            "attention": {
                "self": {
                    "qvk_combined": {
                        "kernel": kernel.reshape(kernel.shape[0], -1),
                        "bias": bias.reshape(-1),
                    }
                },
                "output": layer["attention"]["output"],
            },
            "intermediate": layer["intermediate"],
            "output": layer["output"],
        }
    return {
        "bert": {"embeddings": bert["embeddings"], "encoder": {"layer": layers}},
        "cls": hf["cls"],
    }


def test_masked_lm_equals_hugging_face_bert() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_flax_bert import (
        FlaxBertForMaskedLMModule as HFMaskedLM,
    )

    inputs = _inputs()
    hf_config = transformers.BertConfig(**SIZES, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)  # fmt: skip
    hf = HFMaskedLM(hf_config)
    hf_params = hf.init(jax.random.PRNGKey(0), **inputs, head_mask=None)["params"]
    expected = hf.apply({"params": hf_params}, **inputs, head_mask=None).logits
    ours = FlaxBertForMaskedLMModule(BertConfig(**SIZES))
    structure = jax.tree.structure(ours.init(jax.random.PRNGKey(0), **inputs)["params"])
    params = _from_hf(hf_params)
    assert jax.tree.structure(params) == structure  # Alpa's names, nothing left out
    out = ours.apply({"params": params}, **inputs)
    assert out.logits.shape == (2, 8, SIZES["vocab_size"])
    np.testing.assert_allclose(out.logits, expected, rtol=1e-4, atol=1e-4)
    as_tuple = ours.apply({"params": params}, **inputs, return_dict=False)
    np.testing.assert_allclose(as_tuple[0], expected, rtol=1e-4, atol=1e-4)


def test_bert_layer_trains_under_parallelize_as_on_one_device() -> None:
    config = BertConfig(**SIZES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    layer = FlaxBertLayer(config)
    k = jax.random.split(jax.random.PRNGKey(1), 2)
    x = jax.random.normal(k[0], (8, 8, SIZES["hidden_size"]))
    batch = {"x": x, "y": jax.random.normal(k[1], x.shape), "mask": jnp.ones((8, 8), jnp.int32)}
    params = layer.init(jax.random.PRNGKey(0), x, batch["mask"])
    state = TrainState.create(apply_fn=layer.apply, params=params, tx=optax.adam(1e-2))

    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(params, batch["x"], batch["mask"])[0]
            return jnp.mean((out - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_func)(state.params)
        return state.apply_gradients(grads=grads), loss

    expected, expected_loss = jax.jit(train_step)(state, batch)
    actual, loss = alpa_ir.parallelize(train_step, method=alpa_ir.ShardParallel())(state, batch)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert_allclose(expected.params, actual.params, rtol=1e-4, atol=1e-5)


def test_manual_pipeline_markers_cut_the_collection() -> None:
    config = BertConfig(**{**SIZES, "num_hidden_layers": 4}, add_manual_pipeline_markers=True,
                        pipeline_mp_size=2)  # fmt: skip
    collection = FlaxBertLayerCollection(config)
    x = jnp.ones((2, 8, SIZES["hidden_size"]))
    mask = jnp.ones((2, 8), jnp.int32)
    params = collection.init(jax.random.PRNGKey(0), x, mask)
    assert sorted(params["params"]) == ["0", "1", "2", "3"]
    text = str(jax.make_jaxpr(lambda p: collection.apply(p, x, mask).last_hidden_state)(params))
    assert text.count("pipeline_marker") == 1  # one boundary, after layer 1
