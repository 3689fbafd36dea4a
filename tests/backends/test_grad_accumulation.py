"""Gradient accumulation on one mesh as Alpa compiles it: an accumulate
program run once per micro-batch (the gradient synchronisation only in the
last call's program), and an apply program; the step equals one device."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.api.hlo_status import compiled_text
from alpa_ir.backends.grad_accumulation import AccumulatingStep
from alpa_ir.costs.collective_accounting import hlo_collectives

_RNG = np.random.default_rng(0)
_PARAMS = {
    "w1": jnp.asarray(_RNG.normal(size=(16, 16)) * 0.1, jnp.float32),
    "w2": jnp.asarray(_RNG.normal(size=(16, 16)) * 0.1, jnp.float32),
}
_BATCH = {
    "x": jnp.asarray(_RNG.normal(size=(256, 16)), jnp.float32),
    "y": jnp.asarray(_RNG.normal(size=(256, 16)), jnp.float32),
}


def _step(p: dict[str, jax.Array], b: dict[str, jax.Array]) -> Any:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean((jax.nn.relu(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2)

    value, grads = alpa_ir.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value


def _fresh() -> dict[str, jax.Array]:
    return jax.tree.map(jnp.array, _PARAMS)


def _close(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def _kinds(text: str) -> list[str]:
    return [c.kind for c in hlo_collectives(text)]


def _programs(executable: Any) -> tuple[str, str, str]:
    """The compiled text of accumulate, accumulate_last and apply."""
    step = executable._compile_local()[0]
    assert isinstance(step, AccumulatingStep)
    structs = executable._input_structs()
    accumulate = step.accumulate.lower(*step.accumulate_structs(structs)).compile()
    last, apply = (p.compile() for p in step.lowered(structs))
    return compiled_text(accumulate), compiled_text(last), compiled_text(apply)


def _mesh(shape: tuple[int, int]) -> Any:
    return alpa_ir.PhysicalDeviceMesh(jax.devices()[:4]).get_logical_mesh(shape)


def test_data_parallel_syncs_the_gradients_once_after_the_micro_batches() -> None:
    want = jax.jit(_step)(_PARAMS, _BATCH)
    method = alpa_ir.DataParallel(devices=_mesh((1, 4)), num_micro_batches=4)
    parallel = alpa_ir.parallelize(_step, method=method)
    _close(parallel(_fresh(), _BATCH), want)
    executable = parallel.get_last_executable()
    accumulate, last, apply = _programs(executable)
    # Alpa's two programs: accumulate (with the sync of its last call), apply
    text = executable.get_hlo_text()
    assert text.count("HloModule") == 2
    assert "accumulate_last" in text.split("HloModule")[1]
    assert not _kinds(accumulate)  # each device adds its own partial sums
    assert "all-reduce" in _kinds(last)
    assert not _kinds(apply)
    ids = executable.grad_sync_channel_ids
    assert ids.startswith(".") and ids.endswith(".") and len(ids) > 2
    # accumulators are added in place
    assert "input_output_alias" in accumulate.splitlines()[0]


def test_reduce_scatter_runs_once_per_step() -> None:
    """Alpa's prefer_reduce_scatter (ZeRO-2): the gradients are reduce-scattered
    once, after the micro-batches, and the updated weights all-gathered."""
    optimizer = optax.adam(1e-2)

    def step(state: Any, b: dict[str, jax.Array]) -> Any:
        params, opt_state = state

        def loss(p: dict[str, jax.Array]) -> jax.Array:
            return jnp.mean((jax.nn.relu(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2)

        grads = alpa_ir.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    def state() -> Any:
        return _fresh(), optimizer.init(_fresh())

    want = jax.jit(step)(state(), _BATCH)
    method = alpa_ir.ShardParallel(
        devices=_mesh((1, 4)),
        num_micro_batches=2,
        auto_sharding_option=alpa_ir.AutoShardingOption(prefer_reduce_scatter=True),
    )
    parallel = alpa_ir.parallelize(step, method=method)
    _close(parallel(state(), _BATCH), want)
    accumulate, last, apply = _programs(parallel.get_last_executable())
    assert not _kinds(accumulate)
    # XLA:CPU writes a reduce-scatter as all-reduce + dynamic-slice
    assert {"reduce-scatter", "all-reduce"} & set(_kinds(last))
    assert "all-gather" in _kinds(apply)


def test_the_programs_do_not_grow_with_the_micro_batches() -> None:
    """The old single program unrolled the micro-batch loop: its size (and
    compile time) grew with the number of micro-batches."""
    sizes = []
    for b in (2, 8):
        method = alpa_ir.ShardParallel(devices=_mesh((2, 2)), num_micro_batches=b)
        executable = alpa_ir.parallelize(_step, method=method).get_executable(_PARAMS, _BATCH)
        sizes.append([text.count(" dot(") for text in _programs(executable)])
    assert sizes[0] == sizes[1]
    assert sizes[0][0] > 0 and sizes[0][2] == 0  # the optimizer has no matmul


def test_propagated_specs_accumulate_in_the_parameters_layout() -> None:
    """Alpa's test_grad_acc: with the given specs only propagated, the
    accumulate program reads the parameters, one micro-batch and the
    accumulated gradients; apply reads the parameters and the gradients."""

    def step(params: tuple[jax.Array, jax.Array], batch: tuple[jax.Array, jax.Array]) -> Any:
        x, y = batch

        def loss(params: tuple[jax.Array, jax.Array]) -> jax.Array:
            return jnp.mean((jnp.tanh(x @ params[0]) @ params[1] - y) ** 2)

        grads = alpa_ir.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - g, params, grads)

    params = (_PARAMS["w1"], _PARAMS["w2"])
    batch = (_BATCH["x"], _BATCH["y"])
    specs = ((P(None, "model"), P("model", None)), (P("data", None), P("data", None)))
    method = alpa_ir.ShardParallel(
        devices=_mesh((2, 2)),
        num_micro_batches=2,
        auto_sharding_option=alpa_ir.AutoShardingOption(enable_auto_sharding=False),
        manual_sharding_option=alpa_ir.ManualShardingOption(
            ("data", "model"), in_axis_resources=specs
        ),
    )
    parallel = alpa_ir.parallelize(step, method=method, batch_argnums=(1,))
    want = jax.jit(step)(params, batch)
    _close(parallel(params, batch), want)
    text = parallel.get_last_executable().get_hlo_text()
    accumulate, apply = (
        next(line for line in part.splitlines() if line.startswith("ENTRY"))
        for part in text.split("HloModule")[1:]
    )
    local = ["f32[16,8]", "f32[8,16]"]  # each parameter split in two over "model"
    micro = ["f32[64,16]", "f32[64,16]"]  # 256 rows / 2 micro-batches / 2 over "data"
    shapes = [s.split("]")[0] + "]" for s in accumulate.split(": ")[1:]]
    assert shapes == local + micro + local
    shapes = [s.split("]")[0] + "]" for s in apply.split(": ")[1:]]
    assert shapes == local + local
