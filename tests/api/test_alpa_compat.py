"""Alpa's documented usage runs as written with ``import alpa_ir as alpa``:
the quickstart (a Flax ``TrainState`` step under ``@alpa.parallelize`` with
``jax.grad``), pipeline parallelism with ``alpa.mark_pipeline_boundary()``
and ``alpa.grad`` (manual layers) and with automatic layers and stages, and
``ShardParallel``/``DataParallel``/``Zero2Parallel`` on a BERT layer with
dropout. Sizes are shrunk to run on 8 CPU devices; the code is Alpa's."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState
from jax import random

import alpa_ir as alpa

DIM, BATCH, LAYERS = 32, 32, 4


class MLPModel(nn.Module):
    hidden_dim: int
    num_layers: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.num_layers):
            if i % 2 == 0:
                x = nn.Dense(features=self.hidden_dim * 4)(x)
            else:
                x = nn.Dense(features=self.hidden_dim)(x)
            x = nn.relu(x)
        return x


def _quickstart_state() -> tuple[TrainState, dict[str, jax.Array]]:
    rngkey = jax.random.PRNGKey(0)
    k1, k2 = random.split(rngkey)
    x = random.normal(k1, (BATCH, DIM))
    y = random.normal(k2, (BATCH, DIM))
    model = MLPModel(hidden_dim=DIM, num_layers=LAYERS)
    params = model.init(rngkey, x)
    tx = optax.adam(learning_rate=1e-3)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    return state, {"x": x, "y": y}


def train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss_func(params: Any) -> jax.Array:
        out = state.apply_fn(params, batch["x"])
        return jnp.mean((out - batch["y"]) ** 2)

    grads = jax.grad(loss_func)(state.params)
    return state.apply_gradients(grads=grads)


def _assert_allclose(a: Any, b: Any, atol: float) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=atol)


def test_quickstart() -> None:
    alpa.init(cluster="local")
    state, batch = _quickstart_state()
    expected_state = train_step(state, batch)

    @alpa.parallelize
    def alpa_train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(params, batch["x"])
            return jnp.mean((out - batch["y"]) ** 2)

        grads = jax.grad(loss_func)(state.params)
        return state.apply_gradients(grads=grads)

    actual_state = alpa_train_step(state, batch)
    _assert_allclose(expected_state.params, actual_state.params, atol=5e-3)
    assert int(actual_state.step) == 1
    alpa.shutdown()


class ManualPipelineMLPModel(nn.Module):
    hidden_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(features=self.hidden_dim * 4)(x)
        x = nn.relu(x)
        x = nn.Dense(features=self.hidden_dim)(x)
        x = nn.relu(x)
        # Use this boundary marker to separate the model into two stages.
        alpa.mark_pipeline_boundary()
        x = nn.Dense(features=self.hidden_dim * 4)(x)
        x = nn.relu(x)
        x = nn.Dense(features=self.hidden_dim)(x)
        return nn.relu(x)


def _manual_pipeline_state() -> tuple[TrainState, dict[str, jax.Array]]:
    """The state and batch of Alpa's manual pipeline example (two marked layers)."""
    rngkey = jax.random.PRNGKey(0)
    k1, k2 = random.split(rngkey)
    batch = {"x": random.normal(k1, (BATCH, DIM)), "y": random.normal(k2, (BATCH, DIM))}
    model = ManualPipelineMLPModel(hidden_dim=DIM)
    params = model.init(rngkey, batch["x"])
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    return state, batch


def _alpa_grad_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    """The example's step, its gradient taken with ``alpa.grad``."""

    def loss_func(params: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=alpa.grad(loss_func)(state.params))


def test_manual_pipeline_with_alpa_grad() -> None:
    state, batch = _manual_pipeline_state()

    @alpa.parallelize(method=alpa.PipeshardParallel(num_micro_batches=4, layer_option="manual"))
    def manual_pipeline_train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(params, batch["x"])
            return jnp.mean((out - batch["y"]) ** 2)

        # We use `alpa.grad` here to separate the apply gradient stage with the
        # forward/backward stages in the pipeline.
        grads = alpa.grad(loss_func)(state.params)
        return state.apply_gradients(grads=grads)

    expected = train_step(state, batch)
    actual = manual_pipeline_train_step(state, batch)
    _assert_allclose(expected.params, actual.params, atol=5e-3)
    executable = manual_pipeline_train_step.get_executable(state, batch)
    assert len(executable.placements) == 2  # the boundary made two layers, two stages
    # one compiled program per stage function, in Alpa's order: forwards, backwards
    # from the last stage, apply-grads (the last stage too has a backward of its own)
    assert executable.stage_function_names() == [
        "stage0_forward",
        "stage1_forward",
        "stage1_backward",
        "stage0_backward",
        "stage0_apply_grad",
        "stage1_apply_grad",
    ]
    texts = executable.get_hlo_text()
    assert len(texts) == 6 and all(t.startswith("HloModule") for t in texts)


def test_automatic_pipeline_with_automatic_stages() -> None:
    state, batch = _quickstart_state()
    method = alpa.PipeshardParallel(
        num_micro_batches=2, layer_option=alpa.AutoLayerOption(layer_num=2), stage_option="auto"
    )
    actual = alpa.parallelize(train_step, method=method)(state, batch)
    _assert_allclose(train_step(state, batch).params, actual.params, atol=5e-3)


def _bert_layer() -> tuple[Any, Any, Any]:
    from transformers import BertConfig
    from transformers.models.bert.modeling_flax_bert import FlaxBertLayer

    config = BertConfig(
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    layer = FlaxBertLayer(config)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8, 32))
    mask = jnp.ones((16, 8), jnp.int32)
    params = layer.init(jax.random.PRNGKey(0), x, mask, None)
    return layer, params, {"x": x, "mask": mask, "y": jnp.ones((16, 8, 32)) * 0.1}


@pytest.mark.parametrize("method", ["ShardParallel", "DataParallel", "Zero2Parallel"])
def test_bert_layer_with_dropout(method: str) -> None:
    """Alpa's shard-parallel BERT layer test, dropout active: every method
    draws the one-device dropout masks."""
    layer, params, batch = _bert_layer()
    state = TrainState.create(apply_fn=layer.apply, params=params, tx=optax.sgd(1e-2))

    def step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array) -> Any:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(
                params,
                batch["x"],
                batch["mask"],
                None,
                deterministic=False,
                rngs={"dropout": rng},
            )[0]
            return jnp.mean((out - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_func)(state.params)
        return state.apply_gradients(grads=grads), loss

    rng = jax.random.PRNGKey(7)
    expected, want = jax.jit(step)(state, batch, rng)
    parallel = alpa.parallelize(step, method=getattr(alpa, method)())
    actual, loss = parallel(state, batch, rng)  # donates the state, as in Alpa
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    _assert_allclose(expected.params, actual.params, atol=1e-5)


def test_get_hlo_text_takes_alpas_status() -> None:
    """Alpa's ``executable.get_hlo_text(HloStatus.FULLY_OPTIMIZED)``: the compiled
    per-device program with its all-reduces; as lowered (before XLA's passes) for
    ``UNOPTIMIZED`` and ``SHARDING_ANNOTATED``."""
    state, batch = _quickstart_state()
    parallel = alpa.parallelize(train_step, method=alpa.DataParallel())
    executable = parallel.get_executable(state, batch)
    optimized = executable.get_hlo_text(alpa.HloStatus.FULLY_OPTIMIZED)
    assert (
        optimized
        == executable.get_hlo_text()
        == executable.get_hlo_text(status=alpa.HloStatus.SPMD_PARTITIONED)
    )
    assert "all-reduce" in optimized
    lowered = executable.get_hlo_text(alpa.HloStatus.UNOPTIMIZED)
    assert lowered == executable.get_hlo_text(alpa.HloStatus.SHARDING_ANNOTATED)
    assert "sharding=" in lowered and lowered != optimized
    assert "is_scheduled=true" in optimized and "is_scheduled" not in lowered  # XLA's passes
    with pytest.raises(alpa.AlpaError, match=r"status must be an alpa_ir\.HloStatus"):
        executable.get_hlo_text(status="optimized")


def test_own_boundaries_with_automatic_layers() -> None:
    """A step that marks its own boundary and asks for ``AutoLayerOption(layer_num=4)``:
    as in Alpa the automatic layers replace the step's (with a warning here); the
    pipeline equals one device."""
    state, batch = _manual_pipeline_state()
    method = alpa.PipeshardParallel(
        num_micro_batches=2,
        layer_option=alpa.AutoLayerOption(layer_num=4),
        stage_option=alpa.UniformStageOption(num_stages=4, submesh_logical_shape=(1, 2)),
    )

    parallel = alpa.parallelize(_alpa_grad_step, method=method)
    with pytest.warns(UserWarning, match="marks its own layer boundaries .* replaced by 4"):
        executable = parallel.get_executable(state, batch)
    assert len(executable.placements) == 4  # the automatic layers, not the step's two
    _assert_allclose(train_step(state, batch).params, parallel(state, batch).params, atol=5e-3)


def test_local_pipeline_parallel_runs_the_steps_own_layers_one_device_each() -> None:
    state, batch = _manual_pipeline_state()

    step = alpa.parallelize(_alpa_grad_step, method=alpa.LocalPipelineParallel())

    expected = train_step(state, batch)
    executable = step.get_executable(state, batch)
    meshes = [p.mesh for p in executable.placements]
    assert [m.size for m in meshes] == [1, 1]  # the step's two layers, a device each
    assert meshes[0].devices != meshes[1].devices
    _assert_allclose(expected.params, step(state, batch).params, atol=5e-3)
