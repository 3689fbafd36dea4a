"""The two-stage MLP of Alpa's pipeline manual-sharding tests (hiddens 6 to
14, a layer boundary after the second dense layer): the step and its
arguments, shared by the tests of in-place accumulation and of manual
sharding on pipelines."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp

import alpa_ir

HIDDENS = (6, 8, 10, 12, 14)


def alpa_mlp_step(params: tuple[jax.Array, ...], batch: tuple[jax.Array, jax.Array]) -> Any:
    x, tgt = batch

    def loss_fn(params: tuple[jax.Array, ...]) -> jax.Array:
        w0, b0, w1, b1, w2, b2, w3, b3 = params
        z = jax.nn.relu(jax.nn.relu(x @ w0 + b0) @ w1 + b1)
        alpa_ir.mark_pipeline_boundary()
        v = jax.nn.softmax(jax.nn.relu(z @ w2 + b2) @ w3 + b3)
        return jnp.mean((v - tgt) ** 2)

    grads = alpa_ir.grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def alpa_mlp_args() -> tuple[tuple[jax.Array, ...], tuple[jax.Array, jax.Array]]:
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 10))
    params = []
    for a, b in itertools.pairwise(HIDDENS):
        params += [jax.random.normal(next(keys), (a, b)) * 0.3, jax.random.normal(next(keys), (b,))]
    x = jax.random.normal(jax.random.PRNGKey(1), (64, HIDDENS[0]))
    tgt = jax.random.normal(jax.random.PRNGKey(2), (64, HIDDENS[-1]))
    return tuple(params), (x, tgt)
