"""Alpa's ways of passing options and reading a step's program, as its users
and its test suite write them: fields set on a method and its option before
``parallelize`` (``method.devices = mesh``, ``method.as_option.prefer_reduce_scatter
= True``), ``get_last_executable()``, ``get_hlo_text()`` after a call that
donated the state, ``donate_argnums="auto"`` (Alpa's default: only
``TrainState`` arguments are donated), Alpa's ``force_zero_stage_3`` and its
α-β prices on the logical mesh."""

from __future__ import annotations

import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import alpa_ir
from alpa_ir.costs.collective_accounting import hlo_collectives
from alpa_ir.errors import AlpaError


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(16)(nn.relu(nn.Dense(64)(x)))


def _state_and_batch() -> tuple[TrainState, dict[str, jax.Array]]:
    x = jnp.ones((256, 16))  # a batch large enough that data parallelism is the plan
    params = _MLP().init(jax.random.key(0), x)
    state = TrainState.create(apply_fn=_MLP().apply, params=params, tx=optax.adam(1e-3))
    return state, {"x": x, "y": jnp.ones((256, 16))}


def _step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(p, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_fields_set_on_a_method_before_parallelize_are_read() -> None:
    method = alpa_ir.ShardParallel(auto_sharding_option=alpa_ir.AutoShardingOption())
    method.devices = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((1, 4))
    method.as_option.force_zero_stage_3 = True
    p_step = alpa_ir.parallelize(_step, method=method)
    state, batch = _state_and_batch()
    with pytest.raises(AlpaError, match="get_last_executable"):
        p_step.get_last_executable()
    p_step(state, batch)
    executable = p_step.get_last_executable()
    assert executable.mesh.shape == (1, 4)
    assert "reduce-scatter-rewrite{mode=zero3}" in executable.pass_pipeline
    kinds = {c.kind for c in hlo_collectives(executable.get_hlo_text())}
    assert "reduce-scatter" in kinds and "all-gather" in kinds, kinds


def test_donate_argnums_auto_donates_train_states_only() -> None:
    def array_step(w: jax.Array, x: jax.Array) -> jax.Array:
        return w + x.sum()

    w, x = jnp.ones((8, 8)), jnp.ones((8, 8))
    alpa_ir.parallelize(array_step, method=alpa_ir.DataParallel())(w, x)
    assert not w.is_deleted()  # Alpa's users still hold it
    alpa_ir.parallelize(array_step, method=alpa_ir.DataParallel(), donate_argnums=(0,))(w, x)
    assert w.is_deleted()

    def dict_step(state: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
        return {"w": state["w"] + x.sum()}

    state = {"w": jnp.ones((8, 8))}
    alpa_ir.parallelize(dict_step, method=alpa_ir.DataParallel())(state, x)
    assert state["w"].is_deleted()  # a state the step returns updated is donated
    state, batch = _state_and_batch()
    p_step = alpa_ir.parallelize(_step, method=alpa_ir.DataParallel())
    p_step(state, batch)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))
    # the program is lowered from its inputs' shapes and shardings, not from
    # the arrays of the first call, which it donated
    kinds = {c.kind for c in hlo_collectives(p_step.get_last_executable().get_hlo_text())}
    assert kinds == {"all-reduce"}, kinds
    with pytest.raises(AlpaError, match="donate_argnums must be argument positions or 'auto'"):
        alpa_ir.parallelize(array_step, donate_argnums="all")(jnp.ones((8, 8)), x)
    with pytest.raises(AlpaError, match="donate_argnums: 2 is not the position"):
        alpa_ir.parallelize(array_step, donate_argnums=(2,))(jnp.ones((8, 8)), x)


def test_options_without_meaning_here_are_warned_of() -> None:
    option = alpa_ir.AutoShardingOption()
    option.all_reduce_threshold = 1 << 20
    with pytest.warns(UserWarning, match="all_reduce_threshold has no effect here"):
        option.pipeline(1)
    option = alpa_ir.AutoShardingOption()
    option.allow_recompute_heavy_op = True  # has a meaning: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "allow-recompute-heavy-op=true" in option.pipeline(1)
    option.force_simple_heuristic = "shard-largest"
    assert "strategy-space=heuristic" in option.pipeline(1)


def test_alpa_prices_on_the_logical_mesh() -> None:
    mesh = alpa_ir.LogicalDeviceMesh((2, 4), (1.0, 1.0), (1.0, 0.1))
    assert mesh.all_reduce_cost(1024, 1) == pytest.approx(1 + 0.1 * 2 * 3 / 4 * 1024 + 0.01)
    assert mesh.all_gather_cost(1024, 0) == pytest.approx(1 + 1 / 2 * 1024 + 0.1)
    assert mesh.reduce_scatter_cost(1024, 0) == pytest.approx(1 + 1 / 2 * 1024 + 0.001)
    assert mesh.all_to_all_cost(1024, 1) == pytest.approx(1 + 0.1 * 3 / 16 * 1024 * 2 + 0.001)
    assert mesh.all_reduce_cost(1, 0) + mesh.all_reduce_cost(1, 1) > 3  # Alpa's penalty
    flat = mesh.flatten()  # Alpa's: (n, 1), the largest alpha, the smallest beta
    assert (flat.shape, flat.alpha, flat.beta) == ((8, 1), (1.0, 1.0), (0.1, 0.1))
    with pytest.raises(AlpaError, match="mesh_dim 2 is not an axis"):
        mesh.all_reduce_cost(1, 2)


class _Wide(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(8)(nn.relu(nn.Dense(512)(x)))


def _wide_step(params: Any, batch: dict[str, jax.Array]) -> Any:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((_Wide().apply(p, batch["x"]) - batch["y"]) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def test_force_data_parallel_is_alpa_data_parallelism() -> None:
    """Alpa's ``force_data_parallel``: the mesh flattened, every op's batch
    dimension split over it, no all-gather or all-to-all: the compiled step
    reduces the gradients and nothing else (a small batch and a wide layer,
    where the free ILP would rather split the layer)."""
    x, y = jnp.ones((16, 8)), jnp.ones((16, 8))
    params = _Wide().init(jax.random.key(0), x)
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:8]).get_logical_mesh((2, 4))
    option = alpa_ir.AutoShardingOption(force_data_parallel=True)
    executable = alpa_ir.parallelize(
        _wide_step, method=alpa_ir.ShardParallel(mesh, auto_sharding_option=option)
    ).get_executable(params, {"x": x, "y": y})
    assert executable.mesh.shape == (1, 8)
    kinds = {c.kind for c in hlo_collectives(executable.get_hlo_text())}
    assert kinds <= {"all-reduce", "reduce-scatter"} and kinds, kinds
    want = jax.jit(_wide_step)(params, {"x": x, "y": y})  # first: the step donates params
    got = executable(params, {"x": x, "y": y})
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_a_batch_leaf_without_rows_is_not_forced_to_split() -> None:
    """A PRNG key passed with the batch (shape (2,)) holds no rows: Alpa's
    ``force_batch_dim_to_mesh_dim`` splits the batch, not the key."""

    def step(params: Any, batch: dict[str, jax.Array]) -> Any:
        keep = jax.random.bernoulli(batch["rng"], 0.9, batch["x"].shape)
        return jax.tree.map(lambda p: p + jnp.mean(batch["x"] * keep), params)

    params = {"w": jnp.ones((8, 8))}
    batch = {"x": jnp.ones((16, 8)), "rng": jax.random.PRNGKey(0)}
    option = alpa_ir.AutoShardingOption(force_batch_dim_to_mesh_dim=0)
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:8]).get_logical_mesh((4, 2))
    want = jax.jit(step)(params, batch)  # first: the step donates params
    got = alpa_ir.parallelize(
        step, method=alpa_ir.ShardParallel(mesh, auto_sharding_option=option)
    )(params, batch)
    np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(want["w"]))


def test_gradients_are_reduce_scattered_only_when_preferred() -> None:
    """Alpa's default ``prefer_reduce_scatter=False``: one all-reduce per
    gradient (XLA combines them); with it, ZeRO-2's reduce-scatters."""
    state, batch = _state_and_batch()
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((1, 4))
    kinds = []
    for prefer in (False, True):
        option = alpa_ir.AutoShardingOption(prefer_reduce_scatter=prefer)
        executable = alpa_ir.parallelize(
            _step, method=alpa_ir.ShardParallel(mesh, auto_sharding_option=option)
        ).get_executable(state, batch)
        kinds.append({c.kind for c in hlo_collectives(executable.get_hlo_text())})
    assert kinds[0] == {"all-reduce"}
    assert "reduce-scatter" in kinds[1]
