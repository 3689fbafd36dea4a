"""The lax dialect: every primitive imports, prints, parses back to the same
text, and executes to the numbers JAX computes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from primitive_cases import all_cases

import alpa_ir
from alpa_ir.dialects.lax import LaxOp, PrimitiveOp
from alpa_ir.dialects.lax_primitives import PRIMITIVES

CASES = all_cases()


def assert_trees_close(got, want, rtol=1e-5, atol=1e-6):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize(("name", "fn", "args"), CASES, ids=[c[0] for c in CASES])
def test_roundtrip_and_execute(name, fn, args):
    module = alpa_ir.import_jax(fn, *args)
    text = str(module)
    parsed = alpa_ir.parse_module(text)
    assert str(parsed) == text
    assert_trees_close(alpa_ir.execute(parsed, *args), fn(*args))


def test_every_table_primitive_is_exercised():
    seen: set[str] = set()
    for _, fn, args in CASES:
        for op in alpa_ir.import_jax(fn, *args).walk():
            if isinstance(op, LaxOp):
                seen.add(op.primitive_name)
            assert not isinstance(op, PrimitiveOp), "a case fell back to lax.primitive"
    assert seen == set(PRIMITIVES), sorted(set(PRIMITIVES) - seen)


def test_generic_primitive_op_roundtrips_and_runs():
    # reduce_and over an axis the table knows, bound through the generic op
    text = """
builtin.module {
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4xf32> {
    %0 = lax.primitive "reduce_max" %x {params = {axes = [1]}} : (tensor<4x8xf32>) -> tensor<4xf32>
    func.return %0 : tensor<4xf32>
  }
}
"""
    module = alpa_ir.parse_module(text)
    assert str(alpa_ir.parse_module(str(module))) == str(module)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(alpa_ir.execute(module, x)[0], x.max(1))


def test_abstract_import_allocates_nothing():
    big = jax.ShapeDtypeStruct((1 << 16, 1 << 16), np.float32)  # 16 GiB if allocated
    module = alpa_ir.import_jax(lambda a: (a * 2.0).sum(), big)
    assert "tensor<65536x65536xf32>" in str(module)


def test_constants_roundtrip_exactly():
    values = np.array([0.1, 1e-9, -3.5e20, 1 / 3, 0.0, -0.0], np.float32)
    big = np.arange(100, dtype=np.float32) / 7
    module = alpa_ir.import_jax(lambda x: x + values.sum() + big.sum(), np.float32(1))
    parsed = alpa_ir.parse_module(str(module))
    assert str(parsed) == str(module)
    np.testing.assert_array_equal(
        alpa_ir.execute(parsed, np.float32(1)), np.float32(1) + values.sum() + big.sum()
    )
