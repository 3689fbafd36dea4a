"""Flax NNX, both documented forms, in the three modes and through a
checkpoint: ``graphdef, state = nnx.split((model, optimizer))`` with
``nnx.merge`` inside the step, and NNX modules passed straight through as
pytrees. Every result equals ``jax.jit``'s, with the same tree structure
(static fields included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest

import alpa_ir
from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

nnx = pytest.importorskip("flax.nnx")


class MLP(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.a = nnx.Linear(8, 16, rngs=rngs)
        self.b = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.b(jax.nn.relu(self.a(x)))


def _batch() -> dict[str, jax.Array]:
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
    return {"x": x, "y": jnp.tanh(x[:, :4])}


def _loss(model: MLP, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


def _split_form() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    model = MLP(nnx.Rngs(0))
    graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)))

    def step(state: Any, batch: dict[str, jax.Array]) -> Any:
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(_loss)(model, batch)
        optimizer.update(model, grads)
        return nnx.split((model, optimizer))[1], loss

    return step, (state, _batch()), {}


def _pytree_form() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    def step(model: MLP, optimizer: Any, batch: dict[str, jax.Array]) -> Any:
        loss, grads = jax.value_and_grad(_loss)(model, batch)
        optimizer.update(model, grads)
        return model, optimizer, loss

    return step, (model, optimizer, _batch()), {"batch_argnums": (2,)}


FORMS = {"split-merge": _split_form, "pytree": _pytree_form}


def _method(mode: str) -> Any:
    if mode == "shard":
        return alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((2, 4)))
    return PipeshardParallel(
        num_micro_batches=2,
        layer_option=AutoLayerOption(layer_num=2),
        stage_option=UniformStageOption(),
    )


def _same(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["execute", "shard", "pipeshard"])
@pytest.mark.parametrize("form", list(FORMS))
def test_nnx_step_equals_jit(form: str, mode: str) -> None:
    step, args, kwargs = FORMS[form]()
    # the same objects (an optimizer's static data holds its optax functions);
    # jax.jit first: parallelized steps donate their state
    want = jax.block_until_ready(jax.jit(step)(*args))
    if mode == "execute":
        got = alpa_ir.execute(alpa_ir.import_jax(step, *args), *args)
    else:
        got = alpa_ir.parallelize(step, method=_method(mode), **kwargs)(*args)
    _same(got, want)


@pytest.mark.parametrize("form", list(FORMS))
def test_nnx_state_survives_a_checkpoint(form: str, tmp_path: Path) -> None:
    _, args, _ = FORMS[form]()
    state = args[:-1]  # everything but the batch
    alpa_ir.save_checkpoint(tmp_path / "ck", state, step=1)
    back = alpa_ir.restore_checkpoint(tmp_path / "ck", target=state)
    _same(back, state)
