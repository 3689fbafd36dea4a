"""Alpa's activity trace of a pipeline (``get_stage_execution_info``, with
``global_config.collect_trace``) and Alpa's ``prefetch``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.errors import AlpaError


def _step(p: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        h = alpa_ir.mark_pipeline_boundary(jnp.tanh(x @ p["w0"]))
        return jnp.mean(jnp.tanh(h @ p["w1"]) ** 2)

    value, grads = alpa_ir.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value


def test_each_stage_program_lists_its_runs_of_every_traced_step() -> None:
    p = {"w0": jnp.full((8, 8), 0.1), "w1": jnp.full((8, 8), 0.2)}
    x = jnp.ones((8, 8))
    method = alpa_ir.PipeshardParallel(
        devices=list(range(4)), num_micro_batches=2, layer_option="manual"
    )
    step = alpa_ir.parallelize(_step, method=method, donate_argnums=())
    executable: Any = step.get_executable(p, x)
    executable.record_timeline = True  # what global_config.collect_trace sets
    state = p
    for _ in range(2):
        state, _ = step(state, x)
    info = executable.get_stage_execution_info()
    names = executable.stage_function_names()
    assert len(info) == len(names) == 6  # forward, backward, apply-grad of 2 stages
    runs = {name: len(runs) for name, runs in zip(names, info, strict=True)}
    # per step: forward and backward once per micro-batch, apply-grad once
    assert runs == {
        "stage0_forward": 4,
        "stage1_forward": 4,
        "stage1_backward": 4,
        "stage0_backward": 4,
        "stage0_apply_grad": 2,
        "stage1_apply_grad": 2,
    }
    stage_devices = [tuple(p.mesh.devices or ()) for p in executable.placements]
    for name, runs_of in zip(names, info, strict=True):
        for start, stop, nodes, devices in runs_of:
            assert start <= stop and nodes == (0,)
            assert devices == stage_devices[int(name[5])]
    assert sorted(stage_devices) == [(0, 1), (2, 3)]


def test_prefetch_copies_a_pytree_of_arrays_to_the_host() -> None:
    out = {"a": jnp.arange(4.0), "b": [jnp.ones((2, 2))]}
    alpa_ir.prefetch(out)
    np.testing.assert_array_equal(np.asarray(out["a"]), np.arange(4.0))
    with pytest.raises(AlpaError, match="prefetch: leaf 2 is a str"):
        alpa_ir.prefetch([jnp.ones(2), jnp.ones(2), "x"])
