"""The models and steps of Alpa's ``alpa.testing`` that Alpa's own tests build
on (``MLPModel``, ``BertLayerModel``, ``get_mlp_train_state_and_step``,
``get_bert_layer_train_state_and_step``, ``create_train_state``, the
inference steps) and its ``PipelineBasicTest`` (``run_mlp``,
``run_n_layer_bert``: a pipeline against one device). Sizes and defaults are
Alpa's, so that a test written against Alpa runs as written."""

from __future__ import annotations

import functools
import unittest
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from alpa_ir.api.parallel import parallelize
from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    ManualLayerOption,
    PipeshardParallel,
    StageOption,
    UniformStageOption,
)
from alpa_ir.api.runtime_api import init, shutdown
from alpa_ir.api.sharding_options import AutoShardingOption
from alpa_ir.compat.bert_model import BertConfig, FlaxBaseModelOutput, FlaxBertLayer
from alpa_ir.compat.model_util import TrainState
from alpa_ir.compat.testing import assert_allclose
from alpa_ir.frontend.markers import mark_pipeline_boundary, value_and_grad

Batch = dict[str, jax.Array]
Step = Callable[[TrainState, Batch], tuple[TrainState, jax.Array]]


class MLPModel(nn.Module):
    """``num_layers`` dense layers of ``hidden_size``; a pipeline boundary
    after the first half when ``add_manual_pipeline_marker``."""

    num_layers: int
    hidden_size: int
    use_bias: bool = True
    add_manual_pipeline_marker: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.num_layers):
            x = nn.Dense(self.hidden_size, use_bias=self.use_bias)(x)
            if self.add_manual_pipeline_marker and i == self.num_layers // 2 - 1:
                mark_pipeline_boundary()
        return x


def get_mlp_train_state_and_step(
    batch_size: int,
    hidden_size: int,
    num_layers: int = 4,
    use_bias: bool = True,
    add_manual_pipeline_marker: bool = False,
) -> tuple[TrainState, Batch, Step]:
    """An MLP regression step under SGD with momentum (``alpa_ir.value_and_grad``)."""
    key = jax.random.PRNGKey(0)
    batch = {
        "x": jax.random.normal(key, (batch_size, hidden_size)),
        "y": jax.random.normal(key, (batch_size, hidden_size)),
    }
    model = MLPModel(num_layers, hidden_size, use_bias, add_manual_pipeline_marker)
    state = TrainState.create(
        apply_fn=model.apply,
        params=model.init(key, batch["x"]),
        tx=optax.sgd(learning_rate=1e-2, momentum=0.9),
        dynamic_scale=None,
    )

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, jax.Array]:
        def loss_func(params: Any) -> jax.Array:
            return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

        val, grads = value_and_grad(loss_func)(state.params)
        return state.apply_gradients(grads=grads), val

    return state, batch, train_step


class BertLayerModel(nn.Module):
    """``num_hidden_layers`` BERT layers, a pipeline boundary between each two
    when ``add_manual_pipeline_marker``."""

    config: BertConfig
    dtype: Any = jnp.float32
    add_manual_pipeline_marker: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, attention_mask: jax.Array) -> jax.Array:
        n = self.config.num_hidden_layers
        for i in range(n):
            x = FlaxBertLayer(self.config, self.dtype, name=f"layers_{i}")(x, attention_mask)[0]
            if self.add_manual_pipeline_marker and i != n - 1:
                mark_pipeline_boundary()
        return x


def get_bert_layer_train_state_and_step(
    batch_size: int,
    seq_len: int,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    clip_by_global_norm: bool,
    use_dynamic_scale: bool,
    add_manual_pipeline_marker: bool,
) -> tuple[TrainState, Batch, Step]:
    """BERT layers regressing a random target under Adam (optionally clipped
    by global norm, optionally with a dynamic loss scale that skips the
    update when a gradient is not finite)."""
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (batch_size, seq_len, hidden_size))
    batch = {
        "x": x,
        "y": jax.random.normal(key, x.shape),
        "attention_mask": jnp.ones((batch_size, seq_len), dtype=jnp.int8),
    }
    config = BertConfig(hidden_size=hidden_size, intermediate_size=hidden_size * 4,
                        num_attention_heads=num_heads, num_hidden_layers=num_layers)  # fmt: skip
    model = BertLayerModel(config, add_manual_pipeline_marker=add_manual_pipeline_marker)
    adam = optax.adam(learning_rate=1e-2)
    tx = optax.chain(optax.clip_by_global_norm(0.05), adam) if clip_by_global_norm else adam
    dynamic_scale = None
    if use_dynamic_scale:
        from flax.training.dynamic_scale import DynamicScale

        dynamic_scale = DynamicScale()
    state = TrainState.create(
        apply_fn=model.apply,
        params=model.init(key, batch["x"], batch["attention_mask"]),
        tx=tx,
        dynamic_scale=dynamic_scale,
    )

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, jax.Array]:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(params, batch["x"], batch["attention_mask"])
            return jnp.mean((out - batch["y"]) ** 2)

        scale = state.dynamic_scale
        if scale is None:
            val, grads = value_and_grad(loss_func)(state.params)
            return state.apply_gradients(grads=grads), val
        scale, finite, val, grads = scale.value_and_grad(loss_func)(state.params)
        new = state.apply_gradients(grads=grads)
        keep = functools.partial(jnp.where, finite)
        return new.replace(
            opt_state=jax.tree.map(keep, new.opt_state, state.opt_state),
            params=jax.tree.map(keep, new.params, state.params),
            master_copy=jax.tree.map(keep, new.master_copy, state.master_copy),
            dynamic_scale=scale,
        ), val

    return state, batch, train_step


def create_train_state(rngkey: jax.Array, model: nn.Module, inputs: Any) -> TrainState:
    """``model`` initialised on ``inputs`` under Adam."""
    return TrainState.create(
        apply_fn=model.apply,
        params=model.init(rngkey, *inputs),
        tx=optax.adam(learning_rate=1e-2),
        dynamic_scale=None,
    )


def mlp_inference_step(state: TrainState, batch: Batch) -> tuple[jax.Array, jax.Array]:
    out = state.apply_fn(state.params, batch["x"])
    return out, jnp.mean((out - batch["y"]) ** 2)


def bert_layer_collection_inference_step(state: TrainState, batch: Batch) -> tuple[Any, Any]:
    """The collection's outputs with every hidden state and attention, and
    the loss; the first hidden state (the input itself) left out, as Alpa's."""
    out = state.apply_fn(state.params, batch["x"], batch["attention_mask"],
                         output_attentions=True, output_hidden_states=True)  # fmt: skip
    loss = jnp.mean((out.last_hidden_state - batch["y"]) ** 2)
    out = FlaxBaseModelOutput(out.last_hidden_state, out.hidden_states[1:], out.attentions)
    return out, loss


class PipelineBasicTest(unittest.TestCase):
    """Alpa's base class of pipeline tests: each test joins Ray
    (``init(cluster="ray")``) and leaves it; ``run_mlp`` and
    ``run_n_layer_bert`` check a pipeline against one device and return the
    stage programs' HLO."""

    def setUp(self) -> None:
        init(cluster="ray")

    def tearDown(self) -> None:
        shutdown()

    @staticmethod
    def _method(
        manual: bool, use_remat: bool, layers: int, stage_option: StageOption | None,
        as_option: AutoShardingOption | None,
    ) -> PipeshardParallel:  # fmt: skip
        layer: ManualLayerOption | AutoLayerOption = (
            ManualLayerOption(remat_layer=use_remat)
            if manual
            else AutoLayerOption(
                layer_num=layers, remat_mode="coarse_grained_remat" if use_remat else "none"
            )
        )
        return PipeshardParallel(
            num_micro_batches=4,
            default_auto_sharding_option=as_option or AutoShardingOption(),
            layer_option=layer,
            stage_option=stage_option or UniformStageOption(),
        )

    @staticmethod
    def _check(
        train_step: Step, method: PipeshardParallel, state: TrainState, batch: Batch,
        steps: int, atol: float,
    ) -> Any:  # fmt: skip
        parallel = parallelize(train_step, method=method)
        executable = parallel.get_executable(state, batch)
        expected, actual = state, state
        for _ in range(steps):
            expected, expected_val = train_step(expected, batch)
            actual, actual_val = parallel(actual, batch)
            assert_allclose(expected.params, actual.params, 1e-3, atol)
            assert_allclose(expected_val, actual_val, 1e-3, 1e-3)
        return executable.get_hlo_text()

    def run_mlp(
        self,
        manual_pipeline_layer: bool = True,
        use_remat: bool = False,
        stage_option: StageOption | None = None,
        as_option: AutoShardingOption | None = None,
        do_numerical_test: bool = True,
    ) -> Any:
        method = self._method(manual_pipeline_layer, use_remat, 2, stage_option, as_option)
        state, batch, train_step = get_mlp_train_state_and_step(
            batch_size=64, hidden_size=16, num_layers=4,
            add_manual_pipeline_marker=manual_pipeline_layer,
        )  # fmt: skip
        return self._check(train_step, method, state, batch, 3 if do_numerical_test else 0, 1e-3)

    def run_n_layer_bert(
        self,
        num_layers: int,
        batch_size: int = 16,
        seq_len: int = 256,
        hidden_size: int = 512,
        num_heads: int = 512 // 64,
        use_remat: bool = False,
        clip_by_global_norm: bool = False,
        use_dynamic_scale: bool = False,
        inject_train_step: Step | None = None,
        manual_pipeline_layer: bool = True,
        stage_option: StageOption | None = None,
        as_option: AutoShardingOption | None = None,
        do_numerical_test: bool = True,
    ) -> Any:
        method = self._method(manual_pipeline_layer, use_remat, num_layers, stage_option,
                              as_option)  # fmt: skip
        state, batch, train_step = get_bert_layer_train_state_and_step(
            batch_size=batch_size, seq_len=seq_len, num_layers=num_layers,
            hidden_size=hidden_size, num_heads=num_heads,
            clip_by_global_norm=clip_by_global_norm, use_dynamic_scale=use_dynamic_scale,
            add_manual_pipeline_marker=manual_pipeline_layer,
        )  # fmt: skip
        if inject_train_step is not None:
            train_step = inject_train_step
        return self._check(train_step, method, state, batch, 1 if do_numerical_test else 0, 1.5e-3)


__all__ = [
    "BertLayerModel",
    "MLPModel",
    "PipelineBasicTest",
    "bert_layer_collection_inference_step",
    "create_train_state",
    "get_bert_layer_train_state_and_step",
    "get_mlp_train_state_and_step",
    "mlp_inference_step",
]
