"""Alpa's ``set_seed``: after it, each call of a parallelized step draws with its
keys folded with the seed and the call's number, counted across steps from the
last ``set_seed``; every plan draws what one device draws with those keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.api.global_config import global_config
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.session_keys import fold_session_keys, session_word


@pytest.fixture(autouse=True)
def _no_seed_after() -> Iterator[None]:
    """The seed is the session's: every test leaves steps drawing with their keys."""
    alpa_ir.set_seed(None)
    yield
    alpa_ir.set_seed(None)


def _normal() -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(0), (16, 4))


def _folded(seed: int, call: int) -> jax.Array:
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(0), seed), call)
    return jax.random.normal(key, (16, 4))


def test_set_seed_draws_again_what_the_same_seed_drew() -> None:
    # Alpa's tests/runtime/test_random_seed.py::test_set_seed, plus the numbers
    func = alpa_ir.parallelize(_normal, method=alpa_ir.ShardParallel())
    func2 = alpa_ir.parallelize(lambda: _normal(), method=alpa_ir.ShardParallel())
    alpa_ir.set_seed(10)
    a, b = np.asarray(func()), np.asarray(func())
    executable = func.get_last_executable()
    alpa_ir.set_seed(10)
    c = np.asarray(func())
    assert func.get_last_executable() is executable  # compiled once
    alpa_ir.set_seed(10)
    d = np.asarray(func2())
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(c, d)
    assert not np.allclose(a, b)
    np.testing.assert_allclose(a, _folded(10, 0), rtol=1e-6)
    np.testing.assert_allclose(b, _folded(10, 1), rtol=1e-6)
    alpa_ir.set_seed(11)
    assert not np.allclose(func(), a)


def test_without_seed_a_step_draws_with_its_keys() -> None:
    func = alpa_ir.parallelize(_normal, method=alpa_ir.ShardParallel())
    np.testing.assert_allclose(func(), _normal(), rtol=1e-6)
    alpa_ir.set_seed(3)
    np.testing.assert_allclose(func(), _folded(3, 0), rtol=1e-6)
    alpa_ir.set_seed(None)
    np.testing.assert_allclose(func(), _normal(), rtol=1e-6)


def _dropout_step(params: dict[str, Any], batch: dict[str, Any]) -> tuple[Any, Any]:
    def loss(p: dict[str, Any]) -> jax.Array:
        h = jnp.tanh(batch["x"] @ p["w1"])
        keep = jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, h.shape)
        h = jnp.where(keep, h / 0.5, 0.0)
        alpa_ir.mark_pipeline_boundary()  # two stages under PipeshardParallel
        return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


@pytest.mark.parametrize(
    "method",
    [
        alpa_ir.ShardParallel(),
        alpa_ir.PipeshardParallel(num_micro_batches=2, layer_option="manual"),
    ],
    ids=["shard", "pipeshard"],
)
def test_seeded_dropout_step_equals_one_device(method: Any) -> None:
    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(16, 4)), jnp.float32),
    }
    batch = {
        "x": jnp.asarray(rng.normal(size=(32, 8)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(32, 4)), jnp.float32),
    }
    step = alpa_ir.parallelize(_dropout_step, method=method, donate_argnums=())
    one_device = jax.jit(fold_session_keys(_dropout_step, 2))
    alpa_ir.set_seed(7)
    losses = []
    for call in range(2):
        loss, new = step(params, batch)
        want_loss, want = one_device(params, batch, session_word(7, call))
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        for got, expected in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        losses.append(float(loss))
    assert losses[0] != losses[1]  # each call its own mask


def test_runtime_random_seed_of_global_config_is_set_seed() -> None:
    assert global_config.runtime_random_seed == 42  # Alpa's default
    global_config.runtime_random_seed = 5
    assert global_config.session_random() is not None
    assert global_config.runtime_random_seed == 5
    func = alpa_ir.parallelize(_normal, method=alpa_ir.ShardParallel())
    np.testing.assert_allclose(func(), _folded(5, 0), rtol=1e-6)
    with pytest.raises(AlpaError, match="the random seed must be an integer"):
        alpa_ir.set_seed("10")  # type: ignore[arg-type]


def test_a_draw_inside_a_loop_is_a_one_line_error() -> None:
    def loop(x: jax.Array) -> jax.Array:
        def body(carry: jax.Array, _: Any) -> tuple[jax.Array, None]:
            return carry + jax.random.normal(jax.random.PRNGKey(0), carry.shape), None

        return jax.lax.scan(body, x, None, length=2)[0]

    step = alpa_ir.parallelize(loop, method=alpa_ir.ShardParallel())
    alpa_ir.set_seed(1)
    with pytest.raises(AlpaError, match="inside 'scan'") as info:
        step(jnp.ones((8, 4)))
    assert "\n" not in str(info.value)
