"""A pipeline's gradient sums over a stage's mesh run once per step, after the
micro-batches are accumulated (Alpa's behaviour, what the stage cost model
prices): the programs run per micro-batch hold no reduction, each reduction
runs once on the accumulated partial sums, and the step equals jax.jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import alpa_ir
from alpa_ir.api.pipeshard import PipeshardParallel
from alpa_ir.costs.collective_accounting import hlo_collectives

_RNG = np.random.default_rng(0)


def _step() -> tuple:
    params = {
        "w1": jnp.asarray(_RNG.normal(size=(16, 64)) * 0.1, jnp.float32),
        "w2": jnp.asarray(_RNG.normal(size=(64, 16)) * 0.1, jnp.float32),
    }
    batch = {
        "x": jnp.asarray(_RNG.normal(size=(32, 16)), jnp.float32),
        "y": jnp.asarray(_RNG.normal(size=(32, 16)), jnp.float32),
    }
    tx = optax.adam(1e-2)

    def step(p: dict, o: object, b: dict) -> tuple:
        def loss(p: dict) -> jax.Array:
            h = jax.nn.relu(b["x"] @ p["w1"])
            alpa_ir.mark_pipeline_boundary()
            return jnp.mean((h @ p["w2"] - b["y"]) ** 2)

        value, grads = alpa_ir.value_and_grad(loss)(p)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, value

    return step, params, tx.init(params), batch


def _reductions(text: str) -> int:
    return sum(c.kind in ("all-reduce", "reduce-scatter") for c in hlo_collectives(text))


def test_gradient_sums_wait_for_the_last_micro_batch() -> None:
    step, params, opt_state, batch = _step()
    option = alpa_ir.AutoShardingOption(force_data_parallel=True)
    want = jax.jit(step)(params, opt_state, batch)
    counts = {}
    for b in (1, 4):
        method = PipeshardParallel(
            num_micro_batches=b, layer_option="manual", auto_sharding_option=option
        )
        parallel = alpa_ir.parallelize(step, method=method, donate_argnums=(), batch_argnums=(2,))
        executable = parallel.get_executable(params, opt_state, batch)
        texts = dict(zip(executable.stage_function_names(), executable.get_hlo_text(), strict=True))
        counts[b] = {name: _reductions(text) for name, text in texts.items()}
        once = {n: sum(map(_reductions, executable.deferred_hlo_texts(n))) for n in texts}
        got = parallel(params, opt_state, batch)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
        # an output completed once per step is placed as the step returns it
        placed = jax.tree.leaves(
            executable.get_output_placement_specs(),
            is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
        )
        for sharding, out in zip(placed, jax.tree.leaves(got), strict=True):
            assert len(sharding.shard_shape(out.shape)) == out.ndim
        deferred = executable.program.once_per_step
        if b == 1:
            assert deferred == {} and not any(once.values())
        else:  # the weight gradients of both stages (and the loss) are read once per step
            assert set(deferred) == {"stage0_backward", "stage1_forward", "stage1_backward"}
            assert once["stage0_backward"] >= 1 and once["stage1_backward"] >= 1
            assert once["stage1_forward"] >= 1  # the loss
    # one device's part of the data-parallel gradient is summed over the mesh:
    # inside the backward programs with one micro-batch, after them with four
    assert counts[1]["stage0_backward"] >= 1 and counts[1]["stage1_backward"] >= 1
    assert all(n == 0 for n in counts[4].values())
