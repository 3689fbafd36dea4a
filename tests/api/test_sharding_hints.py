"""User sharding hints (issue #28, scope 1): ``jax.lax.with_sharding_constraint`` in a Flax
step imports as ``lax.sharding_constraint``, the ILP keeps it on the plan's mesh (by axis
name, else by position), every mode equals one device, ``why_text`` says what the hints
cost, and bad hints are one-line errors naming the user's line."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.autosharding.hints import hint_of
from alpa_ir.dialects.sharding import ShardingSpec, spec_of_value
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function

pytestmark = pytest.mark.xdist_group("hints")

MESH = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
PLAN_MESH = LogicalDeviceMesh((2, 4), axis_names=("data", "model"))


def hinted(x: jax.Array, *spec: object) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, NamedSharding(MESH, P(*spec)))


class HintedMLP(nn.Module):
    """Megatron-style hints: the hidden activations split over "model"."""

    hints: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.Dense(64)(x)
        if self.hints:
            h = hinted(h, "data", "model")
        h = nn.relu(h)
        y = nn.Dense(16)(h)
        return hinted(y, "data", None) if self.hints else y


def _step(model: nn.Module, tx: optax.GradientTransformation):
    def step(state: dict, batch: tuple[jax.Array, jax.Array]) -> tuple[dict, jax.Array]:
        def loss_fn(params: dict) -> jax.Array:
            x, y = batch
            return jnp.mean((model.apply(params, x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    return step


def _setup(hints: bool = True):
    model, tx = HintedMLP(hints), optax.adam(1e-2)
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 32))
    y = jax.random.normal(jax.random.PRNGKey(1), (16, 16))
    params = model.init(jax.random.PRNGKey(2), x)
    return _step(model, tx), {"params": params, "opt": tx.init(params)}, (x, y)


def _close(a: object, b: object) -> None:
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=2e-5, atol=2e-6)


def _three_steps(run, state, batch):
    out = []
    state = jax.tree.map(jnp.copy, state)  # a parallel step may donate its inputs
    for _ in range(3):
        state, loss = run(state, batch)
        out.append(loss)
    return state, out


def test_import_and_execute_equal_one_device() -> None:
    step, state, batch = _setup()
    module = alpa_ir.import_jax(step, state, batch)
    hints = [op for op in main_function(module).body.block.ops if hint_of(op) is not None]
    assert len(hints) >= 2 and all(op.location is not None for op in hints)
    assert {hint_of(op).text() for op in hints} >= {"P('data', 'model')", "P('data', None)"}  # type: ignore[union-attr]
    _close(alpa_ir.execute(module, state, batch), jax.jit(step)(state, batch))


def test_shard_parallel_keeps_the_hinted_specs_and_equals_one_device() -> None:
    step, state, batch = _setup()
    parallel = alpa_ir.parallelize(
        step, method=alpa_ir.ShardParallel(devices=PLAN_MESH), batch_argnums=(1,)
    )
    _close(_three_steps(parallel, state, batch), _three_steps(jax.jit(step), state, batch))
    function = parallel.get_executable(state, batch).function
    want = {
        "P('data', 'model')": ShardingSpec(((0,), (1,))),
        "P('data', None)": ShardingSpec(((0,), ())),
    }
    seen = 0
    for op in function.body.block.ops:
        hint = hint_of(op)
        if hint is not None and hint.text() in want:
            assert spec_of_value(op.results[0], function) == want[hint.text()], hint.text()
            seen += 1
    assert seen >= 4  # forward and backward of both hints


def test_pipeshard_parallel_honours_the_hints_on_every_stage() -> None:
    step, state, batch = _setup()
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=alpa_ir.UniformStageOption(num_stages=2, submesh_logical_shape=(2, 2)),
    )
    parallel = alpa_ir.parallelize(step, method=method, batch_argnums=(1,))
    _close(_three_steps(parallel, state, batch), _three_steps(jax.jit(step), state, batch))
    module = parallel.get_executable(state, batch).module
    checked = 0
    for op in module.walk():
        hint = hint_of(op)
        if hint is not None and hint.text() == "P('data', 'model')":
            function = op.parent_op()
            spec = spec_of_value(op.results[0], function)  # type: ignore[arg-type]
            assert spec == ShardingSpec(((0,), (1,))), spec  # by position on a (2, 2) mesh
            checked += 1
    assert checked >= 2


def test_why_text_reports_what_a_costly_hint_adds() -> None:
    """Pinning the output replicated over "model" of a data-parallel-friendly step costs
    all-gathers: the objective with the hint minus the reported cost is the objective of
    the same step planned without any hint."""

    def fn(w: jax.Array, x: jax.Array, pin: bool) -> jax.Array:
        h = x @ w
        if pin:
            h = hinted(h, None, "model")  # columns over "model", rows whole: not data parallel
        return w - 0.01 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w) + 0 * h.sum()

    w, x = jnp.ones((32, 64)) * 0.01, jnp.ones((64, 32))
    method = alpa_ir.ShardParallel(devices=PLAN_MESH)
    objectives, texts = {}, {}
    for pin in (False, True):
        step = jax.tree_util.Partial(fn, pin=pin)
        executable = alpa_ir.parallelize(
            lambda w, x, step=step: step(w, x), method=method, batch_argnums=(1,)
        ).get_executable(w, x)
        objectives[pin] = executable.function.attributes["sharding.objective"].value.data
        texts[pin] = executable.why_text()
    assert "sharding hints" not in texts[False]
    match = re.search(r"hints add ([\d,.e+]+) to the objective: ([\d,.e+]+) with them", texts[True])
    assert match, texts[True]
    added, total = (float(g.replace(",", "")) for g in match.groups())
    assert added > 0
    assert total == pytest.approx(objectives[True], rel=1e-5)
    assert total - added == pytest.approx(objectives[False], rel=1e-4)


def _plan(fn, *args, mesh=PLAN_MESH):
    return alpa_ir.parallelize(fn, method=alpa_ir.ShardParallel(devices=mesh)).get_executable(*args)


def test_a_hint_on_axes_the_mesh_lacks_is_one_line_naming_the_source_line() -> None:
    def fn(x: jax.Array) -> jax.Array:
        return hinted(x * 2, "data", "model").sum()

    with pytest.raises(AlpaError) as info:
        _plan(fn, jnp.ones((8, 8)), mesh=LogicalDeviceMesh((8,), axis_names=("x",)))
    text = str(info.value)
    assert "\n" not in text
    assert re.search(r"test_sharding_hints\.py:\d+", text), text
    assert "data, model" in text and "x (8)" in text


def test_a_hint_that_does_not_divide_is_one_line() -> None:
    def fn(x: jax.Array) -> jax.Array:
        return hinted(x * 2, None, "model").sum()

    with pytest.raises(AlpaError, match=r"test_sharding_hints\.py:\d+.*dimension 1 of size 6 "
                       r"into 4 parts, which does not divide it"):  # fmt: skip
        _plan(fn, jnp.ones((8, 6)))


def test_contradictory_hints_on_one_value_are_one_line() -> None:
    def fn(x: jax.Array) -> jax.Array:
        y = x * 2
        return (hinted(y, "data", None) + hinted(y, None, "data")).sum()

    with pytest.raises(
        AlpaError, match=r"contradicts the hint P\('data', None\) on the same value"
    ):
        _plan(fn, jnp.ones((8, 8)))


def test_argument_shardings_as_jax_jit_in_shardings() -> None:
    """Shardings of the step's arguments, given as ``jax.jit`` gives ``in_shardings``
    (``NamedSharding`` leaves in Alpa's ``in_axis_resources``): the planned arguments
    carry them, the JAX mesh's axes mapped by position onto a mesh named m0, m1."""
    step, state, batch = _setup()
    weights = jax.tree.map(lambda _: None, state)
    weights["params"]["params"]["Dense_0"]["kernel"] = NamedSharding(MESH, P(None, "model"))
    rows = NamedSharding(MESH, P("data"))
    option = alpa_ir.ManualShardingOption(in_axis_resources=(weights, (rows, rows)))
    method = alpa_ir.ShardParallel(devices=LogicalDeviceMesh((2, 4)), manual_sharding_option=option)
    parallel = alpa_ir.parallelize(step, method=method, batch_argnums=(1,))
    _close(_three_steps(parallel, state, batch), _three_steps(jax.jit(step), state, batch))
    placed = parallel.get_executable(state, batch).get_input_placement_specs()
    assert placed[0]["params"]["params"]["Dense_0"]["kernel"] == P(None, "m1")
    assert placed[1][0] == placed[1][1] == P("m0", None)
