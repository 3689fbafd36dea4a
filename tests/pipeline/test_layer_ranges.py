"""Layer ranges of a marked step: ranges of identical structure share one function."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from stage_fixtures import _deep_module
from xdsl.dialects.builtin import ModuleOp

import alpa_ir
from alpa_ir.costs.function_fingerprint import function_fingerprint
from alpa_ir.frontend.jaxpr_import import import_jax
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges


def _branching_loss(p: dict[str, Any], x: jax.Array) -> jax.Array:
    """Five layers: each scales by a constant of its own (constants' values do
    not count), takes a branch (a region) and normalizes (values used twice)."""
    h = x
    for k in range(5):
        h = jnp.tanh(h @ p[f"w{k}"]) * (1.0 + 0.1 * k)
        h = jax.lax.cond(h.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, h)
        h = h - h.mean(axis=-1, keepdims=True)
        if k < 4:
            h = alpa_ir.mark_pipeline_boundary(h)
    return jnp.mean(h**2)


def _branching_module() -> ModuleOp:
    def step(p: dict[str, Any], x: jax.Array) -> tuple[dict[str, Any], jax.Array]:
        loss, grads = alpa_ir.value_and_grad(_branching_loss)(p, x)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

    p = {f"w{k}": jax.ShapeDtypeStruct((16, 16), jnp.float32) for k in range(5)}
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    return import_jax(step, p, x, batch_argnums=(1,))


@pytest.mark.parametrize(
    "make", [_deep_module, _branching_module], ids=["tanh-stack", "constants-and-branches"]
)
def test_ranges_share_a_function_exactly_when_their_functions_are_identical(make) -> None:
    """Shared: the same object for ranges whose functions, each built on its
    own, fingerprint alike with the same parameters and batch arguments."""
    main = main_function(make())
    shared = LayerRanges(main)
    spans = [(i, j) for i in range(shared.num_layers) for j in range(i, shared.num_layers)]
    alone = {}  # each range built by a LayerRanges of its own: nothing to share with
    for span in spans:
        extracted = LayerRanges(main).function(*span)
        batch = extracted.function.attributes.get("alpa.batch_args")
        alone[span] = (function_fingerprint(extracted.function), extracted.param_args, str(batch))
    functions = {span: shared.function(*span) for span in spans}
    for a, b in itertools.combinations(spans, 2):
        same = functions[a].function is functions[b].function
        assert same == (alone[a] == alone[b]), (a, b)
    # the repeated blocks are one function, the first layer (the input) another
    assert functions[(1, 1)].function is functions[(2, 2)].function
    assert functions[(0, 0)].function is not functions[(1, 1)].function
    for span in spans:  # per range: what crosses into it is its own
        extracted = LayerRanges(main).function(*span)
        assert functions[span].cross_bytes == extracted.cross_bytes
        assert functions[span].backward_bytes == extracted.backward_bytes
        assert functions[span].param_args == extracted.param_args


@pytest.mark.parametrize(
    "make", [_deep_module, _branching_module], ids=["tanh-stack", "constants-and-branches"]
)
def test_a_range_is_fingerprinted_as_its_function_would_be(make) -> None:
    main = main_function(make())
    ranges = LayerRanges(main)
    for i in range(ranges.num_layers):
        for j in range(i, ranges.num_layers):
            built = LayerRanges(main).function(i, j).function  # built, nothing shared
            assert ranges.fingerprint(i, j) == function_fingerprint(built), (i, j)
