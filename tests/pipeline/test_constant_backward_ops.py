"""Backward ops computed from constants alone (the zero cotangents JAX's
transposes broadcast, e.g. ``select_n(mask, zeros, g)`` of a ReLU) go to the
layer of their readers when the compiler mirrors Alpa's operand-free
``mark_pipeline_boundary()``: the last stage no longer computes zero tensors
and sends them to the stages that read them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from xdsl.dialects import func

import alpa_ir
from alpa_ir import ManualStageOption, PipeshardParallel
from alpa_ir.ir.module_utils import symbol_op


def _step(params: tuple[jax.Array, ...], batch: tuple[jax.Array, jax.Array]) -> Any:
    x, tgt = batch

    def loss_fn(params: tuple[jax.Array, ...]) -> jax.Array:
        w0, b0, w1, b1, w2, b2, w3, b3 = params
        z = jax.nn.relu(jax.nn.relu(x @ w0 + b0) @ w1 + b1)  # two ReLUs in layer 0
        alpa_ir.mark_pipeline_boundary()
        v = jax.nn.softmax(jax.nn.relu(z @ w2 + b2) @ w3 + b3)
        return jnp.mean((v - tgt) ** 2)

    grads = alpa_ir.grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def test_zero_cotangents_stay_with_the_layer_that_reads_them() -> None:
    shapes = ((6, 8), (8,), (8, 10), (10,), (10, 12), (12,), (12, 4), (4,))
    params = tuple(jnp.ones(s) for s in shapes)
    batch = (jnp.ones((16, 6)), jnp.ones((16, 4)))
    method = PipeshardParallel(
        devices=[0, 1],
        num_micro_batches=1,
        layer_option="manual",
        stage_option=ManualStageOption([[0], [1]], [(1, 1)] * 2, [(1, 1)] * 2, [{}] * 2),
    )
    plan = alpa_ir.compile(_step, params, batch, method=method)
    backward = symbol_op(plan.module, "stage1_backward", func.FuncOp)
    assert isinstance(backward, func.FuncOp)
    # the activation's gradient and layer 1's weights', not the zeros of layer 0's ReLUs
    returned = [tuple(t.get_shape()) for t in backward.function_type.outputs.data]  # type: ignore[attr-defined]
    assert sorted(returned) == sorted([(16, 10), *shapes[4:]])
