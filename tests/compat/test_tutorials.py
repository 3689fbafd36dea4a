"""Alpa's documentation tutorials (alpa-projects/alpa, docs/gallery/tutorials:
quickstart.py, getting_started.py, pipeshard_parallelism.py), their steps
written again here with ``import alpa_ir as alpa`` and sizes shrunk for 8
CPU devices: every line that calls Alpa runs and the tutorials' own checks
hold. Lines calling what JAX has since removed (``synchronize_all_activity``,
``runtime_executable().total_allocation_size()``, ``jax.device_put_replicated``
for the pmap comparison) are replaced by their JAX equivalents or left out,
as marked."""

from __future__ import annotations

import copy
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
from alpa_ir.api.runtime_api import session_backend
from alpa_ir.testing import assert_allclose
from alpa_ir.util import benchmark_func

DIM, BATCH = 64, 64  # the tutorials: 2048 and 2048


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


def _data() -> tuple[jax.Array, jax.Array, jax.Array]:
    """Ground truth W, b and noisy samples of y = Wx + b, as the tutorials draw them."""
    rngkey = jax.random.PRNGKey(0)
    k1, k2 = random.split(rngkey)
    W = random.normal(k1, (DIM, DIM))
    b = random.normal(k2, (DIM,))
    ksample, knoise = random.split(k1)
    x = random.normal(ksample, (BATCH, DIM))
    y = (x @ W + b) + 0.1 * random.normal(knoise, (BATCH, DIM))
    return rngkey, x, y


def _sync(state: Any) -> Any:
    # the tutorials: jax.local_devices()[0].synchronize_all_activity() (removed from JAX)
    return lambda: jax.block_until_ready(state())


def _run_intra_op_tutorial(apply_in_step: str) -> None:
    """quickstart.py (``state.apply_fn`` in the step) and getting_started.py
    (``model.apply``): one parallelized step equals one device's, then the
    speed and memory comparisons through Alpa's helpers."""
    alpa.init(cluster="local")
    rngkey, x, y = _data()
    num_layers = 4  # the tutorials: 10
    model = MLPModel(hidden_dim=DIM, num_layers=num_layers)
    params = model.init(rngkey, x)
    tx = optax.adam(learning_rate=1e-3)
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
        def loss_func(params: Any) -> jax.Array:
            out = state.apply_fn(params, batch["x"])
            loss = jnp.mean((out - batch["y"]) ** 2)
            return loss

        grads = jax.grad(loss_func)(state.params)
        new_state = state.apply_gradients(grads=grads)
        return new_state

    batch = {"x": x, "y": y}
    expected_state = train_step(state, batch)

    @alpa.parallelize
    def alpa_train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
        def loss_func(params: Any) -> jax.Array:
            apply = state.apply_fn if apply_in_step == "state" else model.apply
            out = apply(params, batch["x"])
            loss = jnp.mean((out - batch["y"]) ** 2)
            return loss

        grads = jax.grad(loss_func)(state.params)
        new_state = state.apply_gradients(grads=grads)
        return new_state

    # Test correctness
    actual_state = alpa_train_step(state, batch)
    assert_allclose(expected_state.params, actual_state.params, atol=5e-3)

    print("Input parameter type:", type(state.params["params"]["Dense_0"]["kernel"]))
    print("Output parameter type:", type(actual_state.params["params"]["Dense_0"]["kernel"]))
    kernel_np = np.array(actual_state.params["params"]["Dense_0"]["kernel"])
    assert kernel_np.shape == (DIM, 4 * DIM)

    # Execution speed comparison
    state = actual_state  # the original `state` is "donated" and freed
    jit_train_step = jax.jit(train_step, donate_argnums=(0,))
    holder = {"state": state}

    def serial_execution() -> None:
        holder["state"] = jit_train_step(holder["state"], batch)

    sync_func = _sync(lambda: holder["state"])
    costs = benchmark_func(serial_execution, sync_func, warmup=5, number=10, repeat=5) * 1e3
    print(f"Serial execution time. Mean: {np.mean(costs):.2f} ms, Std: {np.std(costs):.2f} ms")
    assert costs.shape == (5,) and np.all(costs > 0)

    # We distribute arguments in advance for the benchmarking purpose.
    holder["state"], batch = alpa_train_step.preshard_dynamic_args(holder["state"], batch)

    def alpa_execution() -> None:
        holder["state"] = alpa_train_step(holder["state"], batch)

    alpa_costs = benchmark_func(alpa_execution, sync_func, warmup=5, number=10, repeat=5) * 1e3
    print(f"Alpa execution time. Mean: {np.mean(alpa_costs):.2f} ms, Std: {np.std(alpa_costs):.2f} ms")  # fmt: skip
    assert alpa_costs.shape == (5,) and np.all(alpa_costs > 0)

    # Memory usage comparison
    GB = 1024**3
    state = holder["state"]
    # the tutorials: jit_train_step.lower(...).compile().runtime_executable().total_allocation_size()
    analysis = jit_train_step.lower(state, batch).compile().memory_analysis()
    serial = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
              - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)  # fmt: skip
    print(f"Serial execution per GPU memory usage: {serial / GB:.2f} GB")
    alpa_executable = alpa_train_step.get_executable(state, batch)
    alpa_bytes = alpa_executable.get_total_allocation_size()
    print(f"Alpa execution per GPU memory usage:   {alpa_bytes / GB:.2f} GB")
    assert 0 < alpa_bytes <= serial  # no device holds more than one device does alone
    # (the pmap comparison is left out: jax.device_put_replicated is gone from JAX)


def test_quickstart() -> None:
    _run_intra_op_tutorial("state")


def test_getting_started() -> None:
    _run_intra_op_tutorial("model")


class FourLayerMLP(nn.Module):
    hidden_dim: int
    manual_boundary: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(features=self.hidden_dim * 4)(x)
        x = nn.relu(x)
        x = nn.Dense(features=self.hidden_dim)(x)
        x = nn.relu(x)
        if self.manual_boundary:
            # Use this boundary marker to separate the model into two stages.
            alpa.mark_pipeline_boundary()
        x = nn.Dense(features=self.hidden_dim * 4)(x)
        x = nn.relu(x)
        x = nn.Dense(features=self.hidden_dim)(x)
        x = nn.relu(x)
        return x


def test_pipeshard_parallelism(monkeypatch: pytest.MonkeyPatch) -> None:
    """pipeshard_parallelism.py: ``ray.init()``, ``alpa.init(cluster="ray")``,
    a manual pipeline (``mark_pipeline_boundary``, ``alpa.grad``), shutdown,
    then automatic layers and stages; both equal one device's step."""
    ray = pytest.importorskip("ray")
    # the tutorial's ray.init() joins a cluster running here, else starts one:
    # in the suite always a fresh one, never a cluster another test runs
    monkeypatch.setenv("RAY_ADDRESS", "local")
    alpa.shutdown()
    alpa.util.disable_tqdm_globally()
    ray.init(include_dashboard=False)  # the tutorial: ray.init()
    try:
        alpa.init(cluster="ray")
        assert session_backend(None) == "ray"  # the steps below run on Ray's workers
        rngkey, x, y = _data()
        model = FourLayerMLP(hidden_dim=DIM)
        params = model.init(rngkey, x)
        tx = optax.adam(learning_rate=1e-3)
        state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)

        def train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
            def loss_func(params: Any) -> jax.Array:
                out = model.apply(params, batch["x"])
                loss = jnp.mean((out - batch["y"]) ** 2)
                return loss

            grads = jax.grad(loss_func)(state.params)
            new_state = state.apply_gradients(grads=grads)
            return new_state

        batch = {"x": x, "y": y}
        expected_state = train_step(state, batch)

        manual_pipeline_model = FourLayerMLP(hidden_dim=DIM, manual_boundary=True)
        manual_pipeline_state = TrainState.create(
            apply_fn=manual_pipeline_model.apply, params=copy.deepcopy(params), tx=tx
        )

        @alpa.parallelize(
            method=alpa.PipeshardParallel(num_micro_batches=16, layer_option="manual")
        )
        def manual_pipeline_train_step(state: TrainState, batch: dict[str, jax.Array]) -> Any:
            def loss_func(params: Any) -> jax.Array:
                out = state.apply_fn(params, batch["x"])
                loss = jnp.mean((out - batch["y"]) ** 2)
                return loss

            grads = alpa.grad(loss_func)(state.params)
            new_state = state.apply_gradients(grads=grads)
            return new_state

        manual_pipeline_actual_state = manual_pipeline_train_step(manual_pipeline_state, batch)
        assert_allclose(expected_state.params, manual_pipeline_actual_state.params, atol=5e-3)
        alpa.shutdown()

        alpa.init(cluster="ray")
        assert session_backend(None) == "ray"
        method = alpa.PipeshardParallel(
            num_micro_batches=16,
            layer_option=alpa.AutoLayerOption(layer_num=2),
            stage_option="auto",
        )

        @alpa.parallelize(method=method)
        def auto_pipeline_train_step(state: TrainState, batch: dict[str, jax.Array]) -> Any:
            def loss_func(params: Any) -> jax.Array:
                out = state.apply_fn(params, batch["x"])
                loss = jnp.mean((out - batch["y"]) ** 2)
                return loss

            grads = alpa.grad(loss_func)(state.params)
            new_state = state.apply_gradients(grads=grads)
            return new_state

        auto_pipeline_actual_state = auto_pipeline_train_step(state, batch)
        assert_allclose(expected_state.params, auto_pipeline_actual_state.params, atol=5e-3)
    finally:
        alpa.shutdown()
