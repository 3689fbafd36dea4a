"""Expert parallelism (GShard's MoE layer, Alpa's ``test_moe_layer``): the
tokens regrouped for the experts (``(B, L, M) -> (G, S, M)``, a reshape whose
dims share no boundary) keep their batch split, so the ILP finds Alpa's plan:
the experts' weights split on the expert dimension, the tokens dispatched to
them and combined back with one all-to-all each way, forward and backward
(4 in the step), and the gate's weight data parallel."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.costs.collective_accounting import hlo_collectives

TOKENS, GROUP, HIDDEN, FFN, EXPERTS = (16, 16), 32, 32, 128, 8


class _MoE(nn.Module):
    """GShard's position-wise MoE layer (soft dispatch)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal()
        wg = self.param("wg", init, (HIDDEN, EXPERTS))
        wi = self.param("wi", init, (EXPERTS, HIDDEN, FFN))
        wo = self.param("wo", init, (EXPERTS, FFN, HIDDEN))
        tokens = x.reshape(-1, GROUP, HIDDEN)  # GSM: groups of tokens
        gates = jax.nn.softmax(jnp.einsum("GSM,ME->GSE", tokens, wg))
        capacity = 2 * GROUP // EXPERTS
        combine = jnp.broadcast_to(gates[..., None], (*gates.shape, capacity))  # GSEC
        dispatched = jnp.einsum("GSEC,GSM->EGCM", combine, tokens)
        h = nn.relu(jnp.einsum("EGCM,EMH->EGCH", dispatched, wi))
        out = jnp.einsum("EGCH,EHM->GECM", h, wo)
        return jnp.einsum("GSEC,GECM->GSM", combine, out).reshape(x.shape)


def _step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((state.apply_fn({"params": p}, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_the_experts_are_split_with_four_all_to_alls_and_the_step_matches_one_device() -> None:
    rng = np.random.default_rng(0)
    batch = {
        "x": rng.standard_normal((*TOKENS, HIDDEN), np.float32),
        "y": rng.standard_normal((*TOKENS, HIDDEN), np.float32),
    }
    model = _MoE()
    params = jax.jit(model.init)(jax.random.key(0), batch["x"])["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1))
    want = jax.jit(_step)(state, batch)
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((4, 1))
    p_step = alpa_ir.parallelize(_step, method=alpa_ir.ShardParallel(devices=mesh))
    got = p_step(state, batch)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    for name in ("wi", "wo"):  # two experts per device
        w = got.params[name]
        assert w.sharding.shard_shape(w.shape) == (EXPERTS // 4, *w.shape[1:]), name
    kinds = [c.kind for c in hlo_collectives(p_step.get_last_executable().get_hlo_text())]
    assert kinds.count("all-to-all") == 4, kinds
    assert not {"all-gather", "reduce-scatter"} & set(kinds), kinds


def test_a_split_over_both_axes_moves_whole_with_one_all_to_all() -> None:
    """``S01R -> RS01`` (the tokens' split over a 2-d mesh moving to the
    experts') is one all-to-all over both axes: without all-gathers there was
    no way at all (no plan)."""
    hint_mesh = jax.make_mesh(
        (2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:4]
    )

    def move(x: jax.Array) -> jax.Array:
        rows = jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(hint_mesh, P(("a", "b"))))
        return jax.lax.with_sharding_constraint(
            rows + 1.0, NamedSharding(hint_mesh, P(None, ("a", "b")))
        )

    mesh = alpa_ir.LogicalDeviceMesh((2, 2), axis_names=("a", "b"))
    option = alpa_ir.AutoShardingOption(allow_all_gather=False)
    parallel = alpa_ir.parallelize(
        move, method=alpa_ir.ShardParallel(devices=mesh, auto_sharding_option=option)
    )
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    got = parallel(x)
    np.testing.assert_array_equal(np.asarray(got), x * 2.0 + 1.0)
    kinds = [c.kind for c in hlo_collectives(parallel.get_last_executable().get_hlo_text())]
    assert kinds == ["all-to-all"], kinds
