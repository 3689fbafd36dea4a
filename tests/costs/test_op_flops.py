"""FLOP counts of IR ops against hand-computed values."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from alpa_ir.costs.flops import op_flops
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.frontend.jaxpr_import import import_jax
from alpa_ir.ir.module_utils import main_function


def _flops_by_primitive(fn, *args) -> dict[str, float]:
    module = import_jax(fn, *args)
    out: dict[str, float] = {}
    for op in main_function(module).body.block.ops:
        if isinstance(op, LaxOp):
            out[op.primitive_name] = out.get(op.primitive_name, 0.0) + op_flops(op)
    return out


def test_dot_general_counts_two_per_multiply_add() -> None:
    flops = _flops_by_primitive(jnp.dot, jnp.ones((4, 8)), jnp.ones((8, 16)))
    assert flops["dot_general"] == 2 * 4 * 8 * 16


def test_batched_dot_counts_the_batch() -> None:
    fn = lambda a, b: jnp.einsum("bij,bjk->bik", a, b)  # noqa: E731
    flops = _flops_by_primitive(fn, jnp.ones((3, 4, 5)), jnp.ones((3, 5, 6)))
    assert flops["dot_general"] == 2 * 3 * 4 * 5 * 6


def test_conv_counts_window_and_input_features() -> None:
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")

    flops = _flops_by_primitive(conv, jnp.ones((2, 3, 8, 8)), jnp.ones((6, 3, 3, 3)))
    assert flops["conv_general_dilated"] == 2 * (2 * 6 * 8 * 8) * 3 * 3 * 3


def test_elementwise_one_per_element_and_movement_free() -> None:
    flops = _flops_by_primitive(lambda x: jnp.tanh(x).T, jnp.ones((4, 5)))
    assert flops["tanh"] == 20
    assert flops["transpose"] == 0
