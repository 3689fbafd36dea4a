"""FollowParallel of a pipelined step (Alpa's FollowLayerOption): the eval step
is cut where the stage of the parameters it reads rises, runs as a
forward-only pipeline on the train step's stage meshes, keeps every
parameter where the train step keeps it, and equals jax.jit."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import alpa_ir
from alpa_ir.api.follow_pipeline import follow_layers
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.dialects.types import shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.markers import pipeline_marker_p
from alpa_ir.pipeline.stage_specs import stage_input_functions

HIDDEN = 64


def test_the_cut_follows_the_stage_of_the_parameters() -> None:
    def fn(w: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
        h = jnp.tanh(x * 2.0)  # reads no parameter: the first stage
        h = jnp.tanh(h @ w[0])
        return jnp.sum(h @ w[1])

    args = ((jnp.ones((4, 4)), jnp.full((4, 4), 0.5)), jnp.ones((2, 4)))
    cut, count = follow_layers(fn, [0, 1, None])
    assert count(*args) == 2
    jaxpr = jax.make_jaxpr(cut)(*args).jaxpr
    prims = [e.primitive for e in jaxpr.eqns]
    marker = prims.index(pipeline_marker_p)
    assert prims.count(pipeline_marker_p) == 1
    # the marker sits just before the op that reads w[1]
    reads = [i for i, e in enumerate(jaxpr.eqns) if jaxpr.invars[1] in e.invars]
    assert reads == [marker + 1]
    np.testing.assert_allclose(cut(*args), fn(*args), rtol=1e-6)
    cut_all, count_all = follow_layers(fn, [0, 0, None])
    assert count_all(*args) == 1
    assert pipeline_marker_p not in [e.primitive for e in jax.make_jaxpr(cut_all)(*args).eqns]


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(3):
            x = nn.Dense(HIDDEN)(x)
        return nn.Dense(HIDDEN)(x)


def _create_state() -> TrainState:
    model = _Model()
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, HIDDEN)))
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


def _train_step(state: TrainState, batch: dict[str, jax.Array]) -> TrainState:
    def loss(params: Any) -> jax.Array:
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=alpa_ir.grad(loss)(state.params))


def _eval_step(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean((_Model().apply(params, batch["x"]) - batch["y"]) ** 2)


def _batch(rows: int) -> dict[str, jax.Array]:
    rng = np.random.default_rng(rows)
    return {
        "x": jnp.asarray(rng.normal(size=(rows, HIDDEN)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(rows, HIDDEN)), jnp.float32),
    }


def _split_one_kernel(specs: Any, module: Any) -> list[list[ShardingSpec | None]]:
    """The train plan's stage input specs with stage 0's first square kernel
    split by its columns over mesh axis 1."""
    out = [list(s) for s in specs]
    args = [a for f in stage_input_functions(module)[0] for a in f.args]
    k = next(i for i, a in enumerate(args) if tuple(shape_of(a.type)) == (HIDDEN, HIDDEN))
    out[0][k] = ShardingSpec(((), (1,)))
    return out


def test_an_eval_step_follows_a_pipelined_train_step() -> None:
    state, batch = _create_state(), _batch(16)
    layers = alpa_ir.AutoLayerOption(layer_num=2)
    first = alpa_ir.PipeshardParallel(num_micro_batches=2, layer_option=layers)
    planned = alpa_ir.parallelize(_train_step, method=first).get_executable(state, batch)
    # a train plan with a split kernel, so that following it means something
    specs = _split_one_kernel(planned.stage_input_shard_specs, planned.module)
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option=layers, stage_input_shardings=specs
    )
    train = alpa_ir.parallelize(_train_step, method=method)
    evaluate = alpa_ir.parallelize(
        _eval_step, method=alpa_ir.FollowParallel(train, num_micro_batches=2)
    )
    state = train(state, batch)
    eval_batch = _batch(64)
    loss = evaluate(state.params, eval_batch)
    np.testing.assert_allclose(
        loss, jax.jit(_eval_step)(jax.device_get(state.params), eval_batch), rtol=1e-5
    )
    executable = evaluate.get_last_executable()
    assert "schedule=inference" in executable.pass_pipeline
    followed = jax.tree.leaves(executable.get_input_placement_specs()[0])
    kept = train.get_last_executable().get_input_placement_specs()[0].params
    assert followed == jax.tree.leaves(kept)
    assert any(not s.is_fully_replicated for s in followed)  # the split kernel is kept
    np.testing.assert_allclose(evaluate(state.params, eval_batch), loss)  # called again
    given = alpa_ir.FollowParallel(train, get_input_placement_specs=lambda: None)
    with pytest.raises(AlpaError, match="get_input_placement_specs is not taken for a pipelined"):
        alpa_ir.parallelize(_eval_step, method=given)(state.params, eval_batch)
