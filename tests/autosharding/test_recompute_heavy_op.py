"""``allow_recompute_heavy_op`` (Alpa's option): a matmul may leave a mesh axis
unused, each device of that axis computing the same product. By default a
heavy op divides its work over every axis that can split it; with the batch
forced onto axis 0 of a (2, 2) mesh, a small layer then had to split its
weights over axis 1 and sum activations there. With the option, the layer
runs data parallel on axis 0 and replicated on axis 1 (Alpa's plan of
test_bert_mlm_2d_mesh's head), for less communication."""

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


def _plan(recompute: bool) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(8, 8)).astype(np.float32) * 0.1,
              "w2": rng.normal(size=(8, 8)).astype(np.float32) * 0.1}  # fmt: skip
    batch = {"x": rng.normal(size=(64, 8)).astype(np.float32),
             "y": rng.normal(size=(64, 8)).astype(np.float32)}  # fmt: skip
    option = alpa_ir.AutoShardingOption(
        force_batch_dim_to_mesh_dim=0,
        allow_mixed_mesh_shape=False,
        allow_recompute_heavy_op=recompute,
    )
    mesh = alpa_ir.LogicalDeviceMesh((2, 2), (1.0, 1.0), (1.0, 1.0))
    method = alpa_ir.ShardParallel(mesh, auto_sharding_option=option)
    executable = alpa_ir.parallelize(_step, method=method, donate_argnums=()).get_executable(
        params, batch
    )
    return executable, params, batch


def _dot_axes(executable: Any) -> set[tuple[int, ...]]:
    """The mesh axes each matmul's result and operands use, per matmul."""
    function = main_function(executable.module)
    out = set()
    for op in function.body.ops:
        if getattr(op, "primitive_name", "") == "dot_general":
            values = [*op.operands, *op.results]
            specs = [spec_of_value(v, function) for v in values]
            out.add(tuple(sorted({a for s in specs for d in s.dims for a in d})))
    return out


def test_a_matmul_may_leave_an_axis_unused() -> None:
    default, params, batch = _plan(False)
    assert all(1 in axes for axes in _dot_axes(default))  # every matmul splits on axis 1
    executable, _, _ = _plan(True)
    assert (0,) in _dot_axes(executable)  # data parallel on axis 0, replicated on axis 1
    assert executable.auto_sharding_objective < default.auto_sharding_objective
    want = jax.jit(_step)(params, batch)
    for a, b in zip(jax.tree.leaves(executable(params, batch)), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
