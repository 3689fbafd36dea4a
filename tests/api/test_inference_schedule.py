"""Alpa's ``pipeline_schedule="inference"``: a forward-only step (no gradients)
runs as pipeline stages over micro-batches, its batch-shaped outputs
concatenated over the micro-batches and the others (a mean loss) averaged;
checked against ``jax.jit`` of the same step. A training step returning a
batch-shaped output gets it concatenated too."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import alpa_ir
from alpa_ir.api.pipeshard import PipeshardParallel
from alpa_ir.dialects.pipeline import PlanOp, RunOp
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import top_level_ops


class _MLP(nn.Module):
    hidden: int = 8
    layers: int = 4

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for k in range(self.layers):
            x = nn.relu(nn.Dense(self.hidden)(x))
            if k == 1:
                alpa_ir.mark_pipeline_boundary()
        return x


def _setup() -> tuple[_MLP, dict, dict]:
    model = _MLP()
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (16, 8))
    y = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
    return model, model.init(key, x), {"x": x, "y": y}


def test_inference_equals_jit() -> None:
    """4 micro-batches on 2 stages: the output (16 rows, concatenated) and the
    mean loss equal jax.jit's; each stage runs only its forward, 4 times."""
    model, params, batch = _setup()

    def infer(params: dict, batch: dict) -> tuple[jax.Array, jax.Array]:
        out = model.apply(params, batch["x"])
        return out, jnp.mean((out - batch["y"]) ** 2)

    method = PipeshardParallel(
        num_micro_batches=4, pipeline_schedule="inference", layer_option="manual"
    )
    parallel = alpa_ir.parallelize(infer, method=method, donate_argnums=(), batch_argnums=(1,))
    out, loss = parallel(params, batch)
    want_out, want_loss = jax.jit(infer)(params, batch)
    assert out.shape == (16, 8)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    module = parallel.get_executable(params, batch).module
    (plan,) = top_level_ops(module, PlanOp)
    assert isinstance(plan, PlanOp) and plan.schedule.data == "inference"
    runs = [op.function.root_reference.data for op in module.walk() if isinstance(op, RunOp)]
    assert sorted(runs) == ["stage0_forward"] * 4 + ["stage1_forward"] * 4


def test_inference_needs_a_forward_only_step() -> None:
    model, params, batch = _setup()

    def train(params: dict, batch: dict) -> dict:
        def loss(p: dict) -> jax.Array:
            return jnp.mean((model.apply(p, batch["x"]) - batch["y"]) ** 2)

        grads = alpa_ir.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    method = PipeshardParallel(
        num_micro_batches=2, pipeline_schedule="inference", layer_option="manual"
    )
    parallel = alpa_ir.parallelize(train, method=method, donate_argnums=(), batch_argnums=(1,))
    with pytest.raises(AlpaError, match="schedule 'inference' runs a forward-only step"):
        parallel(params, batch)


def test_training_step_concatenates_batch_shaped_outputs() -> None:
    """1F1B over 4 micro-batches: the step's per-example predictions come back
    whole (16 rows, as jax.jit's), the updated parameters averaged as before."""
    model, params, batch = _setup()
    tx = optax.sgd(0.1)
    opt_state = tx.init(params)

    def train(params: dict, opt_state: object, batch: dict) -> tuple:
        def loss(p: dict) -> tuple[jax.Array, jax.Array]:
            out = model.apply(p, batch["x"])
            return jnp.mean((out - batch["y"]) ** 2), out

        grads, out = alpa_ir.grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, out

    method = PipeshardParallel(num_micro_batches=4, layer_option="manual")
    parallel = alpa_ir.parallelize(train, method=method, donate_argnums=(), batch_argnums=(2,))
    new_params, _, out = parallel(params, opt_state, batch)
    want_params, _, want_out = jax.jit(train)(params, opt_state, batch)
    assert out.shape == (16, 8)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-5, atol=1e-6)
    for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)


def test_automatic_stages_plan_an_inference_step() -> None:
    """construct-stages plans a forward-only step for the inference schedule
    (Alpa's test_inference_auto, on the submeshes given)."""
    model, params, batch = _setup()

    def infer(params: dict, batch: dict) -> jax.Array:
        return model.apply(params, batch["x"])

    stages = alpa_ir.AutoStageOption(
        submesh_physical_shape_space="manual", manually_specified_submeshes=((1, 4),)
    )
    method = PipeshardParallel(
        num_micro_batches=2,
        pipeline_schedule="inference",
        layer_option="manual",
        stage_option=stages,
    )
    parallel = alpa_ir.parallelize(infer, method=method, donate_argnums=(), batch_argnums=(1,))
    out = parallel(params, batch)
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(jax.jit(infer)(params, batch)), rtol=1e-5, atol=1e-6
    )
    executable = parallel.get_executable(params, batch)
    assert "schedule=inference" in executable.pass_pipeline
    (plan,) = top_level_ops(executable.module, PlanOp)
    assert isinstance(plan, PlanOp) and plan.schedule.data == "inference"
