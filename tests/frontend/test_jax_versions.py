"""The frontend's table of JAX version differences (issue #28, scope 4): each row's
handler works on the installed JAX (0.10 here; the suite runs unchanged on 0.11)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.frontend import jax_versions
from alpa_ir.frontend.jax_versions import DIFFERENCES, is_jaxpr, jaxpr_and_consts


def test_every_row_names_its_release_and_handler() -> None:
    assert len(DIFFERENCES) >= 5
    for row in DIFFERENCES:
        assert row.what and row.handled_by and row.since in ("0.10", "0.11")
    assert jax_versions.version() >= (0, 10)


def test_closed_and_open_jaxprs_read_alike() -> None:
    """Row 1: a closed jaxpr (constants included) and its open jaxpr."""
    const = np.arange(3.0, dtype=np.float32)
    closed = jax.make_jaxpr(lambda x: x + const)(jnp.ones(3, jnp.float32))
    jaxpr, consts = jaxpr_and_consts(closed)
    assert is_jaxpr(closed) and is_jaxpr(jaxpr) and not is_jaxpr(consts)
    assert [np.asarray(c).tolist() for c in consts] == [const.tolist()]
    assert jaxpr_and_consts(jaxpr)[0] is jaxpr
    out = jax_versions.eval_jaxpr(jaxpr, consts, jnp.ones(3, jnp.float32))  # row 2
    np.testing.assert_allclose(out[0], const + 1)


def test_shaped_array_from_where_jax_keeps_it() -> None:
    aval = jax_versions.shaped_array((2, 3), np.dtype(np.float32))
    assert aval.shape == (2, 3) and aval.dtype == np.float32


def test_reductions_import_with_or_without_out_sharding() -> None:
    """Row 3: reductions carry out_sharding on one release or the other; both import
    and bind (the parameter is dropped)."""

    def fn(x: jax.Array) -> jax.Array:
        return jnp.sum(x, axis=0) + jnp.max(x, axis=0)

    x = jnp.arange(12.0).reshape(3, 4)
    np.testing.assert_allclose(alpa_ir.execute(alpa_ir.import_jax(fn, x), x), fn(x))


def test_a_primitive_the_table_lacks_imports_generically() -> None:
    """Row 4: a primitive a release adds and the lax table lacks imports as the generic
    ``lax.primitive`` op; binding it by name where JAX does not list it is one line."""
    from jax.extend.core import Primitive

    from alpa_ir.dialects.lax import PrimitiveOp

    new_p = Primitive("brand_new_in_a_later_jax")
    new_p.def_abstract_eval(lambda x: x)
    new_p.def_impl(lambda x: x)
    module = alpa_ir.import_jax(lambda x: new_p.bind(x) * 2, jnp.ones(2))
    assert any(isinstance(op, PrimitiveOp) for op in module.walk())
    with pytest.raises(alpa_ir.AlpaError, match="unknown JAX primitive 'brand_new_in_a_later_jax'"):
        alpa_ir.execute(module, jnp.ones(2))
