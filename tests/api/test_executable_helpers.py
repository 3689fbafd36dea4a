"""Alpa's executable helpers: ``preshard_dynamic_args`` places the arguments
where the step reads them, and ``get_total_allocation_size`` reports XLA's
per-device allocation of the compiled programs, for one mesh and for a
pipeline."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from pipeshard_fixtures import _example, _step

import alpa_ir


def _shard_step(
    state: dict[str, Any], batch: dict[str, jax.Array]
) -> tuple[dict[str, Any], jax.Array]:
    def loss(p: dict[str, Any]) -> jax.Array:
        return jnp.mean((jnp.tanh(batch["x"] @ p["w0"]) @ p["w1"] - batch["y"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state)
    return jax.tree.map(lambda a, g: a - 0.1 * g, state, grads), value


def _shard_example() -> tuple[dict[str, Any], dict[str, jax.Array]]:
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    state = {"w0": jax.random.normal(k[0], (64, 256)), "w1": jax.random.normal(k[1], (256, 64))}
    batch = {"x": jax.random.normal(k[2], (32, 64)), "y": jax.random.normal(k[3], (32, 64))}
    return state, batch


def test_preshard_dynamic_args_places_as_the_step_reads() -> None:
    state, batch = _shard_example()
    step = alpa_ir.parallelize(_shard_step, method=alpa_ir.ShardParallel())
    expected = jax.jit(_shard_step)(state, batch)
    placed = step.preshard_dynamic_args(state, batch)
    assert isinstance(placed, tuple) and len(placed) == 2
    wanted = step.get_executable(state, batch).get_input_shardings()
    got = jax.tree.map(lambda x: x.sharding, placed)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(wanted), strict=True):
        assert a.is_equivalent_to(b, 2)
    assert any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(placed))
    # Alpa's name of an array split over a mesh's devices
    assert all(isinstance(x, alpa_ir.DistributedArray) for x in jax.tree.leaves(placed))
    assert alpa_ir.device_mesh.DistributedArray is alpa_ir.DistributedArray
    out = step(*placed)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_total_allocation_size_of_one_mesh_is_xlas_per_device_figure() -> None:
    k = jax.random.split(jax.random.PRNGKey(2), 2)
    state, _ = _shard_example()
    batch = {"x": jax.random.normal(k[0], (1024, 64)), "y": jax.random.normal(k[1], (1024, 64))}
    dp = alpa_ir.parallelize(_shard_step, method=alpa_ir.DataParallel(), donate_argnums=())
    size = dp.get_executable(state, batch).get_total_allocation_size()
    params = sum(x.nbytes for x in jax.tree.leaves(state))
    assert size >= 2 * params  # the replicated weights, read and written whole
    one = jax.jit(_shard_step).lower(state, batch).compile().memory_analysis()
    whole = one.argument_size_in_bytes + one.output_size_in_bytes + one.temp_size_in_bytes
    # the batch and the activations are split 8 ways: per device, far below one device's
    assert size < whole / 2
    donated = alpa_ir.parallelize(_shard_step, method=alpa_ir.DataParallel(), donate_argnums=(0,))
    # a donated weight is written into its own buffer: counted once
    assert donated.get_executable(state, batch).get_total_allocation_size() < size


def test_total_allocation_size_of_a_pipeline() -> None:
    state, batch = _example()
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option="manual", devices=list(range(6))
    )
    step = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable = step.get_executable(state, batch)
    sizes = executable.get_allocation_sizes()
    assert set(sizes) == set(executable.stage_function_names())
    assert all(v > 0 for v in sizes.values())
    assert executable.get_total_allocation_size() == max(sizes.values())
    placed = step.preshard_dynamic_args(state, batch)
    _, loss = step(*placed)
    _, expected_loss = jax.jit(_step)(state, batch)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-4)
