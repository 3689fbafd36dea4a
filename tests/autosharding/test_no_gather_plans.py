"""Plans without all-gathers on a 2-d mesh (``allow_all_gather=False``,
``allow_mixed_mesh_shape=False``, Alpa's test_bert_mlm_2d_mesh options).

A bias or LayerNorm gradient summed from a batch-split activation can be
completed whole (all-reduced) or left split over the other mesh axis (a
cheaper sum over half the bytes). A group that always took the cheaper split
forced the parameter and its optimizer state split too; without all-gathers
its forward use then had no way to meet the matmuls around it, and a BERT MLM
on a (2, 2) mesh had no plan ("edge ... forbids every pair of remaining
strategies"). The group also offers the whole sum now."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import alpa_ir
from alpa_ir.compat.bert_model import BertConfig, FlaxBertForMaskedLMModule
from alpa_ir.costs.collective_accounting import hlo_collectives

VOCAB = 64


def _step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(params: Any) -> jax.Array:
        logits = state.apply_fn(
            params, batch["ids"], batch["mask"], batch["types"], batch["positions"],
            deterministic=False, rngs={"dropout": batch["rng"]},
        )[0]  # fmt: skip
        labels = jax.nn.one_hot(batch["labels"], VOCAB)
        return -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1)) / labels.shape[0]

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_a_masked_lm_head_plans_without_all_gathers_on_a_2d_mesh() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (4, 4)).astype(np.int32)
    ones = np.ones((4, 4), np.int32)
    batch = {"ids": ids, "mask": ones, "types": ones, "positions": ones, "labels": ids[:, ::-1],
             "rng": jax.random.PRNGKey(0)}  # fmt: skip
    # the embeddings, their LayerNorm and the MLM head (no encoder layer)
    model = FlaxBertForMaskedLMModule(
        BertConfig(num_hidden_layers=0, hidden_size=32, intermediate_size=128,
                   num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=4)
    )  # fmt: skip
    params = jax.jit(model.init)(jax.random.key(0), ids, ones, ones, ones)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    want = jax.jit(_step)(state, batch)
    option = alpa_ir.AutoShardingOption(allow_all_gather=False, allow_mixed_mesh_shape=False)
    mesh = alpa_ir.LogicalDeviceMesh((2, 2), (2.0, 2.0), (1.0, 0.1))
    parallel = alpa_ir.parallelize(
        _step, method=alpa_ir.ShardParallel(mesh, auto_sharding_option=option)
    )
    got = parallel(state, batch)  # the state donated: updated in its own layout; PlanError before
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    kinds = {c.kind for c in hlo_collectives(parallel.get_last_executable().get_hlo_text())}
    assert "all-gather" not in kinds, kinds
