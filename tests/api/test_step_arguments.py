"""The arguments users pass: any registered pytree as state and batch (flax
``TrainState``, equinox modules, dataclasses, NamedTuples), Python scalar
leaves as 0-d arrays, static arguments (explicit and Alpa's automatic rule),
and one-line errors that name the argument by its path."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState
from zoo_fixtures import fresh

import alpa_ir
from alpa_ir.errors import AlpaError


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        h = nn.relu(nn.Dense(16)(x))
        if not train:
            h = h * 0.5
        return nn.Dense(2)(h)


def _batch() -> dict[str, jax.Array]:
    rng = np.random.default_rng(0)
    return {
        "x": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(16, 2)), jnp.float32),
    }


def _train_state() -> TrainState:
    model = _Model()
    params = model.init(jax.random.key(0), jnp.ones((1, 8)))
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


def _ts_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, jax.Array]:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(p, batch["x"]) - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(grads=grads), value


def _close(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_train_state_with_a_python_int_step() -> None:
    """flax's TrainState.create sets ``step = 0`` (a Python int); its aux data
    holds ``apply_fn`` and ``tx``."""
    state, batch = _train_state(), _batch()
    assert isinstance(state.step, int)
    step = alpa_ir.parallelize(
        _ts_step, method=alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 4)))
    )
    got, want = fresh(state), state  # the parallel step consumes (donates) its state
    for _ in range(2):
        got, got_loss = step(got, batch)
        want, want_loss = jax.jit(_ts_step)(want, batch)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    assert isinstance(got, TrainState) and int(got.step) == 2
    _close(got.params, want.params)


def test_module_text_describes_opaque_nodes_and_runs_after_parsing() -> None:
    state, batch = _train_state(), _batch()
    module = alpa_ir.import_jax(_ts_step, state, batch)
    text = str(module)
    assert "flax.training.train_state:TrainState" in text and "opaque: " in text
    parsed = alpa_ir.parse_module(text)
    got, loss = alpa_ir.execute(parsed, state, batch)
    want, want_loss = jax.jit(_ts_step)(state, batch)
    assert isinstance(got, TrainState) and got.apply_fn is state.apply_fn
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    _close(got.params, want.params)


@dataclasses.dataclass
class _DataclassState:
    w: jax.Array
    count: jax.Array


jax.tree_util.register_dataclass(_DataclassState, data_fields=["w", "count"], meta_fields=[])


class _TupleBatch(NamedTuple):
    x: jax.Array
    y: jax.Array


def _dc_step(state: _DataclassState, batch: _TupleBatch) -> tuple[_DataclassState, jax.Array]:
    value, grad = jax.value_and_grad(lambda w: jnp.mean((batch.x @ w - batch.y) ** 2))(state.w)
    return _DataclassState(state.w - 0.1 * grad, state.count + 1), value


def test_dataclass_state_and_namedtuple_batch() -> None:
    b = _batch()
    state = _DataclassState(jnp.ones((8, 2)), jnp.zeros((), jnp.int32))
    batch = _TupleBatch(b["x"], b["y"])
    step = alpa_ir.parallelize(_dc_step, method=alpa_ir.DataParallel())
    want, want_loss = jax.jit(_dc_step)(state, batch)
    got, loss = step(fresh(state), batch)
    assert isinstance(got, _DataclassState)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    _close(got, want)
    parsed = alpa_ir.parse_module(str(alpa_ir.import_jax(_dc_step, state, batch)))
    assert isinstance(alpa_ir.execute(parsed, state, batch)[0], _DataclassState)


def test_equinox_module_as_state() -> None:
    model = eqx.nn.MLP(8, 2, 16, 1, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    b = _batch()

    def step(params: Any, batch: dict[str, jax.Array]) -> tuple[Any, jax.Array]:
        def loss(p: Any) -> jax.Array:
            m = eqx.combine(p, static)
            return jnp.mean((jax.vmap(m)(batch["x"]) - batch["y"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    parallel = alpa_ir.parallelize(step, method=alpa_ir.ShardParallel())
    want, want_loss = jax.jit(step)(params, b)
    got, loss = parallel(params, b)
    assert isinstance(got, eqx.nn.MLP)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    _close(got, want)


def _flag_step(
    state: TrainState, batch: dict[str, jax.Array], train: bool
) -> tuple[TrainState, jax.Array]:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(p, batch["x"], train) - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(grads=grads), value


def test_bool_argument_is_static_by_alpas_rule() -> None:
    state, batch = _train_state(), _batch()
    step = alpa_ir.parallelize(_flag_step, method=alpa_ir.DataParallel())
    for train in (True, False):
        want, want_loss = jax.jit(_flag_step, static_argnums=2)(state, batch, train)
        got, loss = step(fresh(state), batch, train)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert len(step._cache) == 2
    module = step.get_executable(state, batch, True).module
    assert len(module.body.block.last_op.body.block.args) == len(jax.tree.leaves((state, batch)))  # type: ignore[union-attr]


def test_explicit_static_argnums_and_import() -> None:
    state, batch = _train_state(), _batch()
    module = alpa_ir.import_jax(_flag_step, state, batch, False, static_argnums=(2,))
    got = alpa_ir.execute(module, state, batch)
    want = jax.jit(_flag_step, static_argnums=2)(state, batch, False)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    step = alpa_ir.parallelize(_flag_step, method=alpa_ir.DataParallel(), static_argnums=(2,))
    np.testing.assert_allclose(step(state, batch, False)[1], want[1], rtol=1e-5)


def test_leaves_that_are_not_arrays_are_bound_at_compile_time() -> None:
    """As under ``equinox.filter_jit``: a string in the batch is a Python value
    the step sees; another value compiles again."""
    state, batch = _train_state(), _batch()

    def step(state: TrainState, batch: dict[str, Any]) -> tuple[TrainState, jax.Array]:
        new, loss = _ts_step(state, {"x": batch["x"], "y": batch["y"]})
        return new, loss * (2.0 if batch["mode"] == "double" else 1.0)

    parallel = alpa_ir.parallelize(step, method=alpa_ir.DataParallel())
    single = parallel(fresh(state), {**batch, "mode": "single"})[1]
    double = parallel(fresh(state), {**batch, "mode": "double"})[1]
    np.testing.assert_allclose(double, 2 * single, rtol=1e-6)
    assert len(parallel._cache) == 2


def test_errors_name_the_argument_path() -> None:
    state, batch = _train_state(), _batch()
    step = alpa_ir.parallelize(_ts_step, method=alpa_ir.DataParallel())
    executable = step.get_executable(state, batch)
    wide = {"x": jnp.ones((32, 8)), "y": batch["y"]}
    with pytest.raises(
        AlpaError, match=r"compiled for f32\[16, 8\] at batch\.x, called with f32\[32, 8\]"
    ):
        executable(state, wide)
    with pytest.raises(AlpaError, match=r"batch\.x: a batch array of shape \[16, 8\] cannot"):
        alpa_ir.parallelize(_ts_step, method=alpa_ir.ShardParallel(num_micro_batches=3))(
            state, batch
        )
