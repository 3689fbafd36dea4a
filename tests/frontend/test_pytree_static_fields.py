"""Pytree nodes whose auxiliary data is not a literal (static fields of a
module class) are rebuilt with their own data: two instances of one class
that differ only in static fields, past the description's cut, come back
each with its own (a regression: both took the first one's, so a Flax NNX
output projection came back with the query projection's ``in_features``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

import alpa_ir
from alpa_ir.frontend.pytree_codec import decode_treedef, encode_treedef

LONG = "a static setting whose repr is longer than the description cut"


@dataclass(frozen=True)
class Setting:
    """Static data that is not a Python literal (written opaque in the text)."""

    text: str
    features: tuple[int, int]


@jax.tree_util.register_dataclass
@dataclass
class Layer:
    weight: jax.Array
    setting: Setting = field(metadata={"static": True})


def _model() -> dict[str, Layer]:
    # the settings differ only in ``features``, after 60 characters of repr
    return {
        "q": Layer(jnp.ones((8, 16)), Setting(LONG, (8, 16))),
        "o": Layer(jnp.ones((16, 8)), Setting(LONG, (16, 8))),
    }


def test_two_instances_differing_only_past_the_cut_keep_their_data() -> None:
    model = _model()
    treedef = jax.tree.structure(model)
    text = encode_treedef(treedef)
    assert text.count("opaque: ") == 2
    assert decode_treedef(text, known=[treedef]) == treedef


def _step(model: dict[str, Layer], x: jax.Array) -> Any:
    def loss(m: dict[str, Layer]) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ m["q"].weight) @ m["o"].weight)

    grads = jax.grad(loss)(model)
    return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads), loss(model)


def test_execute_returns_each_instance_with_its_static_fields() -> None:
    model, x = _model(), jnp.ones((4, 8))
    want = jax.jit(_step)(model, x)
    module = alpa_ir.parse_module(str(alpa_ir.import_jax(_step, model, x)))
    got = alpa_ir.execute(module, model, x)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert got[0]["q"].setting.features == (8, 16)
    assert got[0]["o"].setting.features == (16, 8)


def test_flax_nnx_modules_as_pytrees_keep_their_metadata() -> None:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.q = nnx.Linear(8, 16, rngs=rngs)
            self.o = nnx.Linear(16, 8, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.o(jax.nn.relu(self.q(x)))

    def step(model: Block, x: jax.Array) -> Any:
        grads = jax.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)

    model, x = Block(nnx.Rngs(0)), jnp.ones((4, 8))
    want = jax.jit(step)(model, x)
    got = alpa_ir.execute(alpa_ir.import_jax(step, model, x), model, x)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert (got.q.in_features, got.o.in_features) == (8, 16)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert jnp.allclose(a, b, atol=1e-6)
