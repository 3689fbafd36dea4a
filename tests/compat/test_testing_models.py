"""Alpa's test helpers (``alpa_ir.testing``): the MLP and BERT-layer steps
train as Alpa's do, and ``PipelineBasicTest``'s runs check a pipeline
against one device (here on the local devices instead of Ray)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from alpa_ir.api.runtime_api import init, shutdown
from alpa_ir.testing import (
    BertLayerModel,
    MLPModel,
    PipelineBasicTest,
    create_train_state,
    get_bert_layer_train_state_and_step,
    get_mlp_train_state_and_step,
    mlp_inference_step,
)


def test_mlp_step_lowers_the_loss() -> None:
    state, batch, step = get_mlp_train_state_and_step(batch_size=16, hidden_size=8)
    assert isinstance(jax.tree.leaves(state.params)[0], jax.Array)
    state, first = jax.jit(step)(state, batch)
    _, second = jax.jit(step)(state, batch)
    assert second < first
    model = MLPModel(num_layers=2, hidden_size=8, add_manual_pipeline_marker=False)
    fresh = create_train_state(jax.random.PRNGKey(0), model, [batch["x"]])
    out, loss = mlp_inference_step(fresh, batch)
    assert out.shape == (16, 8) and np.isfinite(loss)


def test_bert_layer_step_with_a_dynamic_scale() -> None:
    state, batch, step = get_bert_layer_train_state_and_step(
        batch_size=2, seq_len=4, num_layers=2, hidden_size=16, num_heads=2,
        clip_by_global_norm=True, use_dynamic_scale=True, add_manual_pipeline_marker=False,
    )  # fmt: skip
    assert sorted(state.params["params"]) == ["layers_0", "layers_1"]  # Alpa's names
    new, loss = jax.jit(step)(state, batch)
    assert np.isfinite(loss) and int(new.step) == 1
    assert new.dynamic_scale is not None
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new.params, state.params)
    assert any(jax.tree.leaves(moved))
    marked = BertLayerModel(state.apply_fn.__self__.config, add_manual_pipeline_marker=True)
    text = str(jax.make_jaxpr(lambda p: marked.apply(p, batch["x"], batch["attention_mask"]))(
        state.params
    ))  # fmt: skip
    assert text.count("pipeline_marker") == 1


class TestPipelineBasicLocally(PipelineBasicTest):
    """Alpa's base class, on the local devices (its own setUp joins Ray)."""

    def setUp(self) -> None:
        init(cluster="local")

    def tearDown(self) -> None:
        shutdown()

    def test_run_mlp(self) -> None:
        texts = self.run_mlp()
        assert len(texts) >= 2 and all("ENTRY" in t for t in texts)

    def test_run_n_layer_bert(self) -> None:
        texts = self.run_n_layer_bert(num_layers=2, batch_size=4, seq_len=8, hidden_size=16,
                                      num_heads=2)  # fmt: skip
        assert len(texts) >= 2
