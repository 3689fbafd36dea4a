"""PipeshardParallel on steps written in plain JAX and Alpa's way: ``jax.grad``
without the project's marker, Alpa's operand-free ``mark_pipeline_boundary()``,
automatic layers on the imported step (bf16 compute, a ``while_loop`` under
``stop_gradient``), optimizer updates that couple stages (global-norm
clipping, a ``lax.cond`` that skips non-finite updates), and the warning for
batch statistics under micro-batching. Each equals one device."""

from __future__ import annotations

import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from xdsl.dialects import func

import alpa_ir
from alpa_ir.api.pipeshard import (
    AutoLayerOption,
    ManualLayerOption,
    PipeshardParallel,
    UniformStageOption,
)
from alpa_ir.dialects.pipeline import StageOp
from alpa_ir.ir.module_utils import main_function, top_level_ops

_RNG = np.random.default_rng(0)
PARAMS = {f"w{i}": jnp.asarray(_RNG.normal(size=(16, 16)) * 0.3, jnp.float32) for i in range(4)}
BATCH = {
    "x": jnp.asarray(_RNG.normal(size=(16, 16)), jnp.float32),
    "y": jnp.asarray(_RNG.normal(size=(16, 16)), jnp.float32),
}


def _mlp_loss(boundary: str | None) -> Any:
    def loss(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> jax.Array:
        h = b["x"]
        for i in range(4):
            h = jnp.tanh(h @ p[f"w{i}"])
            if i == 1 and boundary == "operand-free":
                alpa_ir.mark_pipeline_boundary()
            if i == 1 and boundary == "operand":
                h = alpa_ir.mark_pipeline_boundary(h)
        return jnp.mean((h - b["y"]) ** 2)

    return loss


def _step(loss: Any, tx: optax.GradientTransformation) -> Any:
    def step(state: Any, batch: dict[str, jax.Array]) -> Any:
        params, opt = state
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), value

    return step


def _method(layers: Any = None, schedule: str = "auto") -> PipeshardParallel:
    chunks = 2 if schedule in ("interleaved-1f1b", "zb-v") else 1
    return PipeshardParallel(
        num_micro_batches=2,
        layer_option=layers or AutoLayerOption(layer_num=2 * chunks),
        stage_option=UniformStageOption(num_stages=2),
        pipeline_schedule=schedule,  # type: ignore[arg-type]
    )


def _assert_equal_to_one_device(
    step: Any, method: PipeshardParallel, state: Any, batch: Any, rtol: float = 1e-5
) -> Any:
    parallel = alpa_ir.parallelize(step, method=method)
    got, want = state, state
    for _ in range(2):
        got, got_loss = parallel(got, batch)
        want, want_loss = jax.jit(step)(want, batch)
        np.testing.assert_allclose(got_loss, want_loss, rtol=rtol)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=rtol, atol=rtol
        )
    return parallel.get_executable(state, batch)


def _functions(executable: Any) -> dict[str, list[str]]:
    return {
        op.sym_name.data: [getattr(o, "primitive_name", o.name) for o in op.body.ops]
        for op in executable.module.ops
        if isinstance(op, func.FuncOp) and op.sym_name.data != "main"
    }


@pytest.mark.parametrize("boundary", ["operand", "operand-free"])
def test_jax_value_and_grad_with_manual_boundaries(boundary: str) -> None:
    tx = optax.adam(1e-2)
    step = _step(_mlp_loss(boundary), tx)
    executable = _assert_equal_to_one_device(
        step, _method(ManualLayerOption()), (PARAMS, tx.init(PARAMS)), BATCH
    )
    assert len(executable.placements) == 2


def test_alpas_manual_layer_construction_keeps_the_steps_boundaries() -> None:
    """Alpa's ``@manual_layer_construction`` on the loss: its boundaries are the
    layers, as without it (two stages), equal to one device."""
    tx = optax.sgd(0.1)
    loss = alpa_ir.manual_layer_construction(static_argnums=())(_mlp_loss("operand-free"))
    executable = _assert_equal_to_one_device(
        _step(loss, tx), _method(ManualLayerOption()), (PARAMS, tx.init(PARAMS)), BATCH
    )
    assert len(executable.placements) == 2
    with pytest.raises(alpa_ir.AlpaError, match=r"ManualLayerOption\(remat_layer=True\)"):
        alpa_ir.manual_layer_construction(loss, remat_layer=True)


def test_operand_free_boundaries_are_mirrored_as_jax_mirrors_marked_values() -> None:
    """Alpa's ``mark_pipeline_boundary()`` splits the backward pass exactly where
    JAX's transpose of a marked value does."""
    tx = optax.sgd(0.1)
    state = (PARAMS, tx.init(PARAMS))
    plans = []
    for boundary in ("operand", "operand-free"):
        parallel = alpa_ir.parallelize(
            _step(_mlp_loss(boundary), tx), method=_method(ManualLayerOption())
        )
        plans.append(_functions(parallel.get_executable(state, BATCH)))
    assert plans[0] == plans[1]


def test_operand_free_boundary_without_a_pipeline_is_an_identity() -> None:
    tx = optax.sgd(0.1)
    step = _step(_mlp_loss("operand-free"), tx)
    state = (PARAMS, tx.init(PARAMS))
    got = alpa_ir.execute(alpa_ir.import_jax(step, state, BATCH), state, BATCH)
    np.testing.assert_allclose(got[1], jax.jit(step)(state, BATCH)[1], rtol=1e-6)


def test_automatic_layers_with_jax_grad() -> None:
    tx = optax.adam(1e-2)
    _assert_equal_to_one_device(
        _step(_mlp_loss(None), tx), _method(), (PARAMS, tx.init(PARAMS)), BATCH
    )


def test_global_norm_clipping_couples_the_stages_in_apply_grad_rounds() -> None:
    tx = optax.chain(optax.clip_by_global_norm(0.1), optax.adam(1e-2))
    executable = _assert_equal_to_one_device(
        _step(_mlp_loss(None), tx), _method(), (PARAMS, tx.init(PARAMS)), BATCH
    )
    stages = [op for op in top_level_ops(executable.module, StageOp)]
    assert any(isinstance(s, StageOp) and s.apply_grad_rounds is not None for s in stages)


@pytest.mark.parametrize("schedule", ["gpipe", "zb-h1", "interleaved-1f1b", "zb-v"])
def test_optimizer_steps_that_reduce_across_stages_under_every_schedule(schedule: str) -> None:
    """Global-norm clipping and an all-finite check need every stage's
    gradients: their apply-grad rounds run after the last W (zero-bubble) or
    the last chunk's backward (interleaved, V) of every micro-batch, whatever
    the order the schedule gives the rest."""
    clip = optax.chain(optax.clip_by_global_norm(0.1), optax.adam(1e-2))
    _assert_equal_to_one_device(
        _step(_mlp_loss(None), clip), _method(schedule=schedule), (PARAMS, clip.init(PARAMS)), BATCH
    )
    tx = optax.apply_if_finite(optax.adam(1e-2), max_consecutive_errors=3)
    _assert_equal_to_one_device(
        _step(_mlp_loss(None), tx), _method(schedule=schedule), (PARAMS, tx.init(PARAMS)), BATCH
    )


def test_an_update_skipped_unless_finite_is_split_per_stage() -> None:
    tx = optax.adam(1e-2)

    def step(state: Any, batch: dict[str, jax.Array]) -> Any:
        params, opt = state
        value, grads = jax.value_and_grad(_mlp_loss(None))(params, batch)
        finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))

        def update(args: Any) -> Any:
            p, o, g = args
            u, o = tx.update(g, o, p)
            return optax.apply_updates(p, u), o

        return jax.lax.cond(finite, update, lambda a: (a[0], a[1]), (params, opt, grads)), value

    executable = _assert_equal_to_one_device(step, _method(), (PARAMS, tx.init(PARAMS)), BATCH)
    conds_per_stage = {
        name.split("_")[0]: ops.count("cond")
        for name, ops in _functions(executable).items()
        if "apply_grad" in name and "cond" in ops
    }
    assert set(conds_per_stage) == {"stage0", "stage1"}


class _Bf16(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(3):
            x = nn.tanh(nn.Dense(16, dtype=jnp.bfloat16, param_dtype=jnp.float32)(x))
        return x.astype(jnp.float32)


def test_automatic_layers_with_bf16_compute() -> None:
    """bf16 activations, fp32 parameters: the cuts carry bf16 values and fp32
    gradients; nothing is blamed on markers the user never placed. bf16
    rounding (8 bits of mantissa) sets the tolerance."""
    model = _Bf16()
    params = model.init(jax.random.key(0), BATCH["x"])
    tx = optax.sgd(0.1)

    def loss(p: Any, b: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean((model.apply(p, b["x"]) - b["y"]) ** 2)

    _assert_equal_to_one_device(
        _step(loss, tx), _method(), (params, tx.init(params)), BATCH, rtol=2e-2
    )


def test_automatic_layers_with_a_while_loop_under_stop_gradient() -> None:
    def loss(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> jax.Array:
        def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            i, x = carry
            return i + 1, 0.5 * (x + b["x"] / jnp.maximum(jnp.abs(x), 1.0))

        _, scale = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, jnp.ones_like(b["x"])))
        h = b["x"] * jax.lax.stop_gradient(scale)
        for i in range(4):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean((h - b["y"]) ** 2)

    tx = optax.sgd(0.1)
    _assert_equal_to_one_device(_step(loss, tx), _method(), (PARAMS, tx.init(PARAMS)), BATCH)


class _BatchNormNet(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.BatchNorm(use_running_average=False)(nn.Dense(16)(x))
        return nn.Dense(16)(nn.relu(x))


def test_batch_statistics_under_micro_batching_warn_once() -> None:
    model = _BatchNormNet()
    variables = model.init(jax.random.key(0), BATCH["x"])
    tx = optax.sgd(0.1)

    def step(state: Any, batch: dict[str, jax.Array]) -> Any:
        def loss(p: Any) -> Any:
            out, new = model.apply(
                {"params": p, "batch_stats": state["stats"]}, batch["x"], mutable=["batch_stats"]
            )
            return jnp.mean((out - batch["y"]) ** 2), new["batch_stats"]

        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {
            "params": optax.apply_updates(state["params"], updates),
            "stats": stats,
            "opt": opt,
        }, value

    state = {
        "params": variables["params"],
        "stats": variables["batch_stats"],
        "opt": tx.init(variables["params"]),
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alpa_ir.parallelize(step, method=_method()).get_executable(state, BATCH)
    messages = [str(w.message) for w in caught if "micro-batch statistics" in str(w.message)]
    assert len(messages) == 1 and "BatchNorm" in messages[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alpa_ir.parallelize(step, method=alpa_ir.ShardParallel()).get_executable(state, BATCH)
    assert not [w for w in caught if "micro-batch statistics" in str(w.message)]


def test_grad_marker_is_inserted_for_jax_grad() -> None:
    tx = optax.sgd(0.1)
    module = alpa_ir.import_jax(_step(_mlp_loss(None), tx), (PARAMS, tx.init(PARAMS)), BATCH)
    kinds = [
        o.param("kind")
        for o in main_function(module).body.ops
        if getattr(o, "primitive_name", "") == "pipeline_marker"
    ]
    assert kinds == ["backward", "grad"]
