"""A grouped convolution (depthwise: ``feature_group_count`` = channels) splits
its groups: a wide depthwise block (dense conv, depthwise conv, dense conv) is
planned model-parallel with one all-reduce in the whole step, as Alpa's plan
(``test_n_layer_depthwise_conv_model_parallel``), instead of running the
depthwise conv replicated between two all-reduces. Its weight gradient is a
``batch_group_count`` convolution, split the same way."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from jax import lax

import alpa_ir
from alpa_ir.autosharding.factors import FactorKind, FactorRule
from alpa_ir.autosharding.rules import RULES
from alpa_ir.costs.collective_accounting import hlo_collectives
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.ir.module_utils import main_function

P, R, N = FactorKind.PASS_THROUGH, FactorKind.REDUCTION, FactorKind.NEED_REPLICATION


def _conv_rules(fn: Any, *shapes: tuple[int, ...]) -> list[tuple[LaxOp, FactorRule]]:
    args = [np.ones(s, np.float32) for s in shapes]
    function = main_function(alpa_ir.import_jax(fn, *args))
    return [
        (op, RULES["conv_general_dilated"](op))
        for op in function.body.block.ops
        if isinstance(op, LaxOp) and op.primitive_name == "conv_general_dilated"
    ]


def test_the_groups_of_a_grouped_conv_are_a_pass_through_factor() -> None:
    def conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=4
        )

    # 4 groups of 2 input and 3 output features
    [(_, rule)] = _conv_rules(conv, (2, 5, 5, 8), (3, 3, 2, 12))
    kinds = dict(zip(rule.names, zip(rule.sizes, rule.kinds, strict=True), strict=True))
    assert kinds == {"g": (4, P), "n": (2, P), "o": (3, P), "c": (2, R)}
    g, n, o, c = (rule.names.index(k) for k in ("g", "n", "o", "c"))
    assert rule.operands == (((n,), (), (), (g, c)), ((), (), (c,), (g, o)))
    assert rule.results == (((n,), (), (), (g, o)),)
    assert rule.heavy
    # the weight gradient groups the input batch (batch_group_count = 4)
    grads = jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), (0, 1))
    [(op, rule)] = [
        (op, rule)
        for op, rule in _conv_rules(grads, (2, 5, 5, 8), (3, 3, 2, 12))
        if op.param("batch_group_count") == 4
    ]
    g, n = rule.names.index("g"), rule.names.index("n")
    assert rule.sizes[g] == 4 and rule.kinds[g] is P
    batch_dim = op.param("dimension_numbers").lhs_spec[0]
    assert rule.operands[0][batch_dim] == (g, n)


class _Depthwise(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(64, (3, 3), use_bias=False)(x)
        x = nn.Conv(64, (3, 3), feature_group_count=64, use_bias=False)(x)
        return nn.Conv(8, (3, 3), use_bias=False)(x)


def _step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(p: Any) -> jax.Array:
        return jnp.mean((state.apply_fn({"params": p}, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss)(state.params))


def test_a_depthwise_block_is_split_by_its_groups_with_one_all_reduce() -> None:
    model = _Depthwise()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 4, 8), np.float32)
    batch = {"x": x, "y": rng.standard_normal((2, 4, 4, 8), np.float32)}
    params = jax.jit(model.init)(jax.random.key(2), x)["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1))
    want = jax.jit(_step)(state, batch)
    mesh = alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh((4, 1))
    p_step = alpa_ir.parallelize(_step, method=alpa_ir.ShardParallel(devices=mesh))
    got = p_step(state, batch)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    depthwise = got.params["Conv_1"]["kernel"]  # (3, 3, 1, 64): split on its groups
    assert depthwise.sharding.shard_shape(depthwise.shape) == (3, 3, 1, 16)
    executable = p_step.get_last_executable()
    reductions = [c for c in hlo_collectives(executable.get_hlo_text()) if c.kind == "all-reduce"]
    assert len(reductions) == 1, reductions
