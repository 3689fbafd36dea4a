"""Alpa's ``PipeshardExecutable.stage_input_shard_specs`` and
``PipeshardParallel(stage_input_shardings=...)``: a plan for another batch
size keeps an earlier plan's input layouts when given them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir import AutoShardingOption, PipeshardParallel
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.stage_specs import format_stage_specs, parse_stage_specs

H = 64


def _infer(p: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    h = jnp.tanh(batch["x"] @ p["w0"])
    h = jnp.tanh(h @ p["w1"])
    h = alpa_ir.mark_pipeline_boundary(h)
    h = jnp.tanh(h @ p["w2"])
    return h @ p["w3"]


def _method(specs: Any = None) -> PipeshardParallel:
    return PipeshardParallel(
        devices=list(range(8)),
        num_micro_batches=1,
        pipeline_schedule="inference",
        layer_option="manual",
        default_auto_sharding_option=AutoShardingOption(
            force_batch_dim_to_mesh_dim=None, allow_all_to_all=False, allow_all_gather=False
        ),
        stage_input_shardings=specs,
    )


def _params() -> dict[str, jax.Array]:
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    return {f"w{i}": jax.random.normal(k[i], (H, H)) * 0.1 for i in range(4)}


def _batch(n: int) -> dict[str, jax.Array]:
    return {"x": jax.random.normal(jax.random.PRNGKey(1), (n, H))}


def test_a_plan_for_another_batch_size_keeps_the_given_input_specs() -> None:
    p = _params()
    one = alpa_ir.parallelize(_infer, batch_argnums=(1,), method=_method())
    first = one.get_executable(p, _batch(1)).stage_input_shard_specs
    assert len(first) == 2 and all(len(s) == 3 for s in first)  # w0, w1, x; w2, w3, h
    assert all(isinstance(s, ShardingSpec) for stage in first for s in stage)
    free = alpa_ir.parallelize(_infer, batch_argnums=(1,), method=_method())
    # batch 8 splits the batch, batch 1 cannot
    assert free.get_executable(p, _batch(8)).stage_input_shard_specs != first
    kept = alpa_ir.parallelize(_infer, batch_argnums=(1,), method=_method(first))
    assert kept.get_executable(p, _batch(8)).stage_input_shard_specs == first
    np.testing.assert_allclose(
        kept(p, _batch(8)), jax.jit(_infer)(p, _batch(8)), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(AlpaError, match="stage 1 has 3 inputs, 2 specs given"):
        alpa_ir.parallelize(_infer, batch_argnums=(1,), method=_method((first[0], first[1][:2])))(
            p, _batch(8)
        )


def test_the_option_text_round_trips_and_bad_specs_are_named() -> None:
    specs = (
        (ShardingSpec(((0,), ())), None, ShardingSpec(())),
        (ShardingSpec(((), (0, 1))),),
    )
    assert format_stage_specs(specs) == "S0.R,*,();R.S01"
    assert parse_stage_specs(format_stage_specs(specs)) == specs
    with pytest.raises(AlpaError, match="input-specs of stage 0: bad spec 'Q0'"):
        parse_stage_specs("Q0")
    with pytest.raises(AlpaError, match="stage_input_shardings must be, per stage"):
        PipeshardParallel(stage_input_shardings=(("[S0, R]",),))  # type: ignore[arg-type]
