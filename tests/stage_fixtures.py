"""Stage functions and clusters for the stage cost and construct-stages tests:
a stack of tanh layers (forward and backward), a 4-layer marked step, the
alpa-testbed node and a small one-level cluster."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

import alpa_ir
from alpa_ir.frontend.jaxpr_import import import_jax
from alpa_ir.hardware.clusters import Cluster, ClusterLevel, get_cluster
from alpa_ir.ir.module_utils import main_function

BATCH, HIDDEN = 16, 64


def _layers(params: dict[str, Any], x: jax.Array) -> Any:
    """Forward and backward of a stack of tanh layers (one stage's ops)."""

    def loss(p: dict[str, Any]) -> jax.Array:
        h = x
        for name in sorted(p):
            h = jnp.tanh(h @ p[name])
        return jnp.mean(h**2)

    return jax.grad(loss)(params)


@functools.cache
def _stage(first: int, count: int = 2, hidden: int = HIDDEN) -> func.FuncOp:
    params = {f"layer{first + k}": jnp.full((hidden, hidden), 0.01) for k in range(count)}
    return main_function(alpa_ir.import_jax(_layers, params, jnp.ones((BATCH, hidden))))


def _cluster() -> Cluster:
    return get_cluster("alpa-testbed", num_nodes=1)


def _small_cluster(devices: int = 2, memory: float = 2**30, bandwidth: float = 10e9) -> Cluster:
    return Cluster("test", (ClusterLevel("device", devices, bandwidth, 1e-5),), memory, 1e11, 20e9)


def _deep_loss(p: dict[str, Any], x: jax.Array) -> jax.Array:
    h = x
    for k in range(4):  # four identical layers
        h = jnp.tanh(h @ p[f"w{k}"])
        if k < 3:
            h = alpa_ir.mark_pipeline_boundary(h)
    return jnp.mean(h**2)


def _deep_step(p: dict[str, Any], x: jax.Array) -> tuple[dict[str, Any], jax.Array]:
    loss, grads = alpa_ir.value_and_grad(_deep_loss)(p, x)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss


def _deep_module() -> ModuleOp:
    p = {f"w{k}": jax.ShapeDtypeStruct((16, 16), jnp.float32) for k in range(4)}
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    return import_jax(_deep_step, p, x, batch_argnums=(1,))
