"""PRNG keys inside training steps: typed (``jax.random.key``) and raw
(``jax.random.PRNGKey``) keys import, print, parse and run; keys are valid
arguments and state leaves; bits drawn from a key are sharded like any new
tensor and every plan draws exactly the numbers one device draws."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.random import prng

import alpa_ir
from alpa_ir.dialects.sharding import spec_of_value
from alpa_ir.frontend.local_random import local_random_bits
from alpa_ir.ir.module_utils import main_function


def _draw(key: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    k1, k2 = jax.random.split(key)
    mask = jax.random.bernoulli(k2, 0.5, x.shape)
    k3 = jax.random.fold_in(k1, 3)
    return k3, jnp.where(mask, x, 0.0), jax.random.normal(k3, (4,))


def _same(a: Any, b: Any) -> bool:
    def data(x: Any) -> np.ndarray:
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            return np.asarray(jax.random.key_data(x))
        return np.asarray(x)

    return all(
        np.array_equal(data(x), data(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "raw"])
def test_keys_import_print_parse_and_run(typed: bool) -> None:
    key = jax.random.key(0) if typed else jax.random.PRNGKey(0)
    x = jnp.arange(32.0).reshape(4, 8)
    module = alpa_ir.import_jax(_draw, key, x)
    text = str(module)
    assert "random_split" in text and "random_bits" in text
    if typed:
        assert "tensor<!lax.key<fry>>" in text
    else:
        assert "lax.random_wrap" in text and 'impl = "fry"' in text
    parsed = alpa_ir.parse_module(text)
    assert str(parsed) == text
    assert _same(alpa_ir.execute(parsed, key, x), _draw(key, x))


def test_local_random_bits_equal_the_block_of_the_whole_draw() -> None:
    key = jax.random.key(42)
    shape = (6, 10, 4)
    for width in (8, 16, 32):
        full = prng.random_bits(key, bit_width=width, shape=shape)
        block = local_random_bits(key, width, shape, (3, 5, 4), (np.uint32(3), np.uint32(5), 0))
        assert np.array_equal(full[3:6, 5:10], block)


def test_local_random_bits_count_past_32_bits() -> None:
    """Element indices past 2**32 (a large activation) carry into the high word."""
    from jax.extend.random import threefry2x32_p

    key = jax.random.key(7)
    shape = (3, 2**20, 2**13)
    offsets = (2, 2**20 - 2, 2**13 - 4)
    block = local_random_bits(key, 32, shape, (1, 2, 4), offsets)
    index = np.array(
        [
            [
                [offsets[0] * 2**33 + (offsets[1] + b) * 2**13 + offsets[2] + c for c in range(4)]
                for b in range(2)
            ]
        ],
        dtype=object,
    )
    hi = jnp.asarray(np.array(index >> 32, dtype=np.uint32))
    lo = jnp.asarray(np.array(index & 0xFFFFFFFF, dtype=np.uint32))
    words = jax.random.key_data(key)
    b1, b2 = threefry2x32_p.bind(
        jnp.broadcast_to(words[0], hi.shape), jnp.broadcast_to(words[1], hi.shape), hi, lo
    )
    assert np.array_equal(b1 ^ b2, block)


def _dropout_step(state: dict[str, Any], batch: dict[str, jax.Array]) -> Any:
    key, sub = jax.random.split(state["key"])

    def loss(w: jax.Array) -> jax.Array:
        h = jnp.tanh(batch["x"] @ w)
        keep = jax.random.bernoulli(sub, 0.7, h.shape)
        h = jnp.where(keep, h / 0.7, 0.0)
        return jnp.mean((h.sum(-1) - batch["y"]) ** 2), keep

    (value, keep), grad = jax.value_and_grad(loss, has_aux=True)(state["w"])
    return {"w": state["w"] - 0.1 * grad, "key": key}, (value, keep)


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "raw"])
def test_sharded_dropout_draws_the_one_device_mask(typed: bool) -> None:
    """The mask (16 x 32, split over the (2, 4) mesh) equals one device's exactly."""
    rng = np.random.default_rng(0)
    key = jax.random.key(3) if typed else jax.random.PRNGKey(3)
    state = {"w": jnp.asarray(rng.normal(size=(8, 32)), jnp.float32), "key": key}
    batch = {
        "x": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(16,)), jnp.float32),
    }
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 4)))
    step = alpa_ir.parallelize(_dropout_step, method=method)
    executable = step.get_executable(state, batch)
    function = main_function(executable.module)
    bits = [op for op in function.body.ops if getattr(op, "primitive_name", "") == "random_bits"]
    assert bits and spec_of_value(bits[0].results[0], function).used_axes()
    want_state, got_state = state, state
    for _ in range(2):
        want_state, (want_loss, want_keep) = jax.jit(_dropout_step)(want_state, batch)
        got_state, (got_loss, got_keep) = step(got_state, batch)
        assert np.array_equal(np.asarray(got_keep), np.asarray(want_keep))
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
        assert _same(got_state["key"], want_state["key"])
        np.testing.assert_allclose(got_state["w"], want_state["w"], rtol=1e-5, atol=1e-6)


def test_keys_are_replicated_by_every_plan() -> None:
    rng = np.random.default_rng(1)
    state = {"w": jnp.asarray(rng.normal(size=(8, 32)), jnp.float32), "key": jax.random.key(0)}
    batch = {
        "x": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(16,)), jnp.float32),
    }
    step = alpa_ir.parallelize(_dropout_step, method=alpa_ir.DataParallel())
    specs = step.get_executable(state, batch).get_input_placement_specs()
    assert specs[0]["key"] == jax.sharding.PartitionSpec()
    assert specs[1]["x"] != jax.sharding.PartitionSpec()


@pytest.mark.parametrize("method", ["DataParallel", "PipeshardParallel"])
def test_two_row_micro_batches_split_the_key_as_one_device(method: str) -> None:
    """With 2-row micro-batches, ``jax.random.split(key)`` (2 keys) has the
    micro-batch's leading dimension but is not a per-example draw: it stays
    one split, and only the mask is drawn by rows (a regression: the split
    was taken for rows 0..8 of an 8-key split and every mask changed)."""
    rng = np.random.default_rng(2)
    state = {"w": jnp.asarray(rng.normal(size=(8, 32)), jnp.float32), "key": jax.random.PRNGKey(5)}
    batch = {
        "x": jnp.asarray(rng.normal(size=(8, 8)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(8,)), jnp.float32),
    }

    def step(state: dict[str, Any], batch: dict[str, jax.Array]) -> Any:
        new_state, (value, _) = _dropout_step(state, batch)
        return new_state, value

    if method == "DataParallel":
        parallel_method: Any = alpa_ir.DataParallel(jax.devices()[:2], num_micro_batches=4)
    else:
        parallel_method = alpa_ir.PipeshardParallel(
            num_micro_batches=4, layer_option=alpa_ir.AutoLayerOption(layer_num=1)
        )
    want_state, want_loss = jax.jit(step)(state, batch)
    got_state, got_loss = alpa_ir.parallelize(step, method=parallel_method)(state, batch)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    assert _same(got_state["key"], want_state["key"])
    np.testing.assert_allclose(got_state["w"], want_state["w"], rtol=1e-5, atol=1e-6)
