"""Alpa's debugging aids: ``ALPA_DEBUG_PRINT_AS_STRATEGY=1`` prints the ILP's
chosen strategy per op when a step is compiled, and ``get_last_dp_result()``
returns the stages of the last automatic stage construction of the Ray
session (kept in the session's store, not in a module global)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from ray_cluster_fixture import joined_cluster
from zoo_fixtures import tiny_step

import alpa_ir
from alpa_ir.api.stage_result import NO_RESULT, get_last_dp_result
from alpa_ir.api.strategy_table import ENV, strategy_rows
from alpa_ir.dialects.sharding import STRATEGY_ATTR


def _mlp_step(w: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
    grads = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grads


def test_the_strategy_table_is_printed_when_asked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    w, x = jnp.ones((16, 16)), jnp.ones((32, 16))
    monkeypatch.delenv(ENV, raising=False)
    quiet = alpa_ir.parallelize(_mlp_step, method=alpa_ir.ShardParallel(), donate_argnums=())
    quiet.get_executable(w, x)
    assert "auto-sharding strategies" not in capsys.readouterr().out
    monkeypatch.setenv(ENV, "1")
    step = alpa_ir.parallelize(_mlp_step, method=alpa_ir.ShardParallel(), donate_argnums=())
    executable = step.get_executable(w, x)
    out = capsys.readouterr().out
    assert "auto-sharding strategies (ALPA_DEBUG_PRINT_AS_STRATEGY)" in out
    chosen = [op for op in executable.module.walk() if STRATEGY_ATTR in op.attributes]
    rows = strategy_rows(executable.module)
    assert len(rows) == len(chosen) > 0
    dot = next(r for r in rows if r[1] == "lax.dot_general")
    assert dot[0] == "main" and dot[3] and dot[4].startswith("[")
    # one line per op, under a header and a rule
    table = out.split("\n", 1)[1].strip().splitlines()
    assert len(table) == len(rows) + 2 and table[0].split()[:2] == ["function", "op"]
    step.get_executable(w, x)  # compiled once: printed once
    assert capsys.readouterr().out == ""
    out_w = step(w, x)
    executable.sync()  # Alpa's: waits for the step's work on the devices
    assert jnp.allclose(out_w, jax.jit(_mlp_step)(w, x), rtol=1e-5)


def test_without_ray_the_last_dp_result_is_alpas_empty_one() -> None:
    alpa_ir.shutdown()
    with pytest.warns(UserWarning, match="get_last_dp_result: the result is kept by the Ray"):
        assert get_last_dp_result() == NO_RESULT


def _auto_method() -> alpa_ir.PipeshardParallel:
    option = alpa_ir.AutoStageOption(
        submesh_physical_shape_space="small_power_of_two",
        submesh_logical_shape_space="same_as_physical",
    )
    return alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=option,
    )


@pytest.mark.ray
def test_the_session_keeps_the_last_automatic_stage_construction() -> None:
    fn, (state, batch) = tiny_step("mlp-tiny")
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 4}}
    with joined_cluster(host):
        assert get_last_dp_result() == NO_RESULT  # none yet in this session
        step = alpa_ir.parallelize(fn, method=_auto_method(), donate_argnums=())
        executable = step.get_executable(state, batch)  # parallelize records it
        cost_file, layer_ids, submeshes, logical, options = get_last_dp_result()
        assert cost_file is None
        stages = [s for s in executable.module.walk() if s.name == "pipeline.stage"]
        assert len(layer_ids) == len(stages) >= 1
        assert [i for ids in layer_ids for i in ids] == [0, 1]  # the 2 layers, in order
        assert all(s[0] == 1 and s[1] & (s[1] - 1) == 0 for s in submeshes)  # small powers of 2
        assert logical == submeshes  # same_as_physical
        assert options == [{}] * len(stages)
    host = {"num_cpus": 1, "resources": {"alpa_cpu_device": 2}}
    with joined_cluster(host):  # a new session starts without it
        assert get_last_dp_result() == NO_RESULT
