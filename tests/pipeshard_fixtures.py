"""A small MLP with two manual layer boundaries, for pipeline tests: the step,
example arguments, and a check that a method's steps equal one device's."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import alpa_ir
from alpa_ir.api.pipeshard import PipeshardParallel
from alpa_ir.tools.bench_schedules import method_for as tiny_gpt_method  # noqa: F401


def _loss(p: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ p["w0"])
    h = alpa_ir.mark_pipeline_boundary(h)
    h = jnp.tanh(h @ p["w1"])
    h = alpa_ir.mark_pipeline_boundary(h)
    return jnp.mean((h @ p["w2"] - y) ** 2)


def _step(state: dict[str, Any], batch: dict[str, jax.Array]) -> tuple[dict[str, Any], jax.Array]:
    loss, grads = alpa_ir.value_and_grad(_loss)(state["p"], batch["x"], batch["y"])
    params = jax.tree.map(lambda a, g: a - 0.1 * g, state["p"], grads)
    return {"p": params, "n": state["n"] + 1}, loss


def _example() -> tuple[dict[str, Any], dict[str, jax.Array]]:
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    state = {
        "p": {
            "w0": jax.random.normal(k[0], (8, 16)) * 0.5,
            "w1": jax.random.normal(k[1], (16, 16)) * 0.3,
            "w2": jax.random.normal(k[2], (16, 4)) * 0.3,
        },
        "n": jnp.zeros((), jnp.int32),
    }
    batch = {"x": jax.random.normal(k[3], (16, 8)), "y": jax.random.normal(k[4], (16, 4))}
    return state, batch


def _assert_same_steps(
    step: Any, method: PipeshardParallel, state: Any, batch: Any, steps: int = 3
) -> Any:
    """Run ``steps`` steps under ``method`` and on one device; losses and states
    agree. Returns the parallelized step."""
    parallel = alpa_ir.parallelize(step, method=method, donate_argnums=())
    reference = jax.jit(step)
    ours, theirs = state, state
    for _ in range(steps):
        theirs, loss = reference(theirs, batch)
        ours, our_loss = parallel(ours, batch)
        np.testing.assert_allclose(our_loss, loss, rtol=1e-4)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    return parallel
