"""``force_batch_dim_to_mesh_dim`` onto an axis of size 1 (Alpa's model-parallel
case: a (1, n) mesh with the batch forced onto axis 0) keeps every batch
dimension whole, as Alpa's strategy filter does: the other axis is left to
model parallelism, even where splitting the batch there would be cheaper."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import alpa_ir
from alpa_ir.dialects.sharding import spec_of_value
from alpa_ir.ir.module_utils import main_function


def _step(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> Any:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean((jnp.tanh(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2)

    return jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p))


def _plan(forced: int | None) -> Any:
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(16, 32)).astype(np.float32) * 0.1,
              "w2": rng.normal(size=(32, 16)).astype(np.float32) * 0.1}  # fmt: skip
    batch = {"x": rng.normal(size=(256, 16)).astype(np.float32),
             "y": rng.normal(size=(256, 16)).astype(np.float32)}  # fmt: skip
    option = alpa_ir.AutoShardingOption(
        force_batch_dim_to_mesh_dim=-1 if forced is None else forced
    )
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((1, 4)), auto_sharding_option=option)
    executable = alpa_ir.parallelize(_step, method=method).get_executable(params, batch)
    return executable, params, batch


def _batch_split(executable: Any) -> bool:
    function = main_function(executable.module)
    rows = [
        spec_of_value(op.results[0], function).dims[0]
        for op in function.body.ops
        if getattr(op, "primitive_name", "") == "dot_general"
        and op.results[0].type.get_shape()[0] == 256  # type: ignore[attr-defined]
    ]
    return any(rows)


def test_a_batch_forced_onto_an_axis_of_size_one_stays_whole() -> None:
    free, _, _ = _plan(None)
    assert _batch_split(free)  # without the option the batch is the cheap split
    executable, params, batch = _plan(0)
    assert not _batch_split(executable)
    want = jax.jit(_step)(params, batch)
    for a, b in zip(jax.tree.leaves(executable(params, batch)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
