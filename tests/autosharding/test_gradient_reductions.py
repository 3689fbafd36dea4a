"""Sums over the mesh deferred past the micro-batches
(:func:`~alpa_ir.autosharding.gradient_reductions.deferred_reductions`): only
those whose deferral leaves the step's numbers as they are."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import alpa_ir
from alpa_ir.autosharding.gradient_reductions import deferred_reductions
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.step_partition import partition_step

_RNG = np.random.default_rng(0)
W = jnp.asarray(_RNG.normal(size=(16, 16)) * 0.1, jnp.float32)
X = jnp.asarray(_RNG.normal(size=(64, 16)) + 0.5, jnp.float32)


def _step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    def loss(w: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = x @ w
        m = jnp.mean(out)  # a sum over the batch's devices
        return jnp.mean(out**2), m * m  # a metric: the square of that sum

    (value, square), g = alpa_ir.value_and_grad(loss, has_aux=True)(w)
    return w - 0.1 * g, value, square


def test_a_sum_squared_per_micro_batch_is_not_deferred() -> None:
    """``m * m`` of a batch mean ``m``, returned per micro-batch: ``m``'s sum
    over the devices cannot wait for the last micro-batch (the devices' partial
    ``m`` squared and then summed is not ``m`` squared); the loss's and the
    gradient's sums still wait. The step's outputs are the micro-batches'
    means, as one device computes them micro-batch by micro-batch."""
    b = 2
    n = X.shape[0] // b
    runs = [jax.jit(_step)(W, X[k * n : (k + 1) * n]) for k in range(b)]
    want = [sum(run[k] for run in runs) / b for k in range(3)]
    method = alpa_ir.DataParallel(num_micro_batches=b)
    parallel = alpa_ir.parallelize(_step, method=method, donate_argnums=(), batch_argnums=(1,))
    got = parallel(W, X)
    for x, y in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
    function = main_function(parallel.get_last_executable().module)
    deferred = deferred_reductions(partition_step(function, [1]), function)
    assert len(deferred) == 2  # the loss's and the gradient's, not the metric's
