"""Alpa's ``ManualStageOption`` fields in Alpa's order: physical submesh
shapes, logical views of them, and per stage the ``AutoShardingOption``
fields it changes (``submesh_autosharding_option_dicts``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xdsl.dialects import func

import alpa_ir
from alpa_ir import ManualStageOption, PipeshardParallel
from alpa_ir.dialects.attrs import BATCH_ATTR
from alpa_ir.dialects.sharding import ShardingSpec, spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import symbol_op


def _step(p: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        h = alpa_ir.mark_pipeline_boundary(jnp.tanh(x @ p["w0"]))
        return jnp.mean(jnp.tanh(h @ p["w1"]) ** 2)

    value, grads = alpa_ir.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value


def _batch_spec(executable: Any, name: str) -> ShardingSpec | None:
    function = symbol_op(executable.module, name, func.FuncOp)
    assert isinstance(function, func.FuncOp)
    (k,) = [int(i) for i in function.attributes[BATCH_ATTR].get_values()]  # type: ignore[attr-defined]
    return spec_of_value(function.args[k], function)


def test_each_stage_is_sharded_with_its_own_option_changes() -> None:
    p = {"w0": jnp.full((16, 16), 0.1), "w1": jnp.full((16, 16), 0.2)}
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 16))
    stages = ManualStageOption(
        [[0], [1]],
        [(1, 4), (1, 4)],
        [(2, 2), (2, 2)],
        [dict(force_batch_dim_to_mesh_dim=1), {}],
    )
    method = PipeshardParallel(devices=list(range(8)), num_micro_batches=1, stage_option=stages)
    step = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    (ours, our_loss), (theirs, loss) = step(p, x), jax.jit(_step)(p, x)
    np.testing.assert_allclose(our_loss, loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    executable = step.get_executable(p, x)
    assert "stage-pipelines=" in executable.pass_pipeline
    assert _batch_spec(executable, "stage0_forward") == ShardingSpec(((1,), ()))  # its option
    assert [tuple(p.mesh.shape) for p in executable.placements] == [(2, 2), (2, 2)]


def test_bad_manual_stage_options_are_one_line_errors() -> None:
    assert ManualStageOption([[0]], [(1, 4)]).submesh_logical_shapes == [(1, 4)]
    with pytest.raises(AlpaError, match="needs submesh_physical_shapes or submesh_logical"):
        ManualStageOption([[0]])
    with pytest.raises(AlpaError, match="2 stages but 1 submesh_autosharding_option_dicts"):
        ManualStageOption([[0], [1]], [(1, 2)] * 2, None, [{}])
    stages = ManualStageOption([[0], [1]], [(1, 4), (1, 4)], [(1, 4), (1, 2)])
    method = PipeshardParallel(devices=list(range(8)), stage_option=stages)
    p = {"w0": jnp.ones((4, 4)), "w1": jnp.ones((4, 4))}
    with pytest.raises(AlpaError, match=r"stage 1's physical submesh \(1, 4\) has 4 devices"):
        alpa_ir.parallelize(_step, method=method)(p, jnp.ones((8, 4)))
    wrong = ManualStageOption([[0], [1]], [(1, 4)] * 2, None, [dict(no_such=1), {}])
    method = PipeshardParallel(devices=list(range(8)), stage_option=wrong)
    with pytest.raises(
        AlpaError, match="stage 0's submesh_autosharding_option_dicts names no_such"
    ):
        alpa_ir.parallelize(_step, method=method)(p, jnp.ones((8, 4)))
