"""What communication leaves open, settled as XLA and Alpa settle it (#43):
dead code is erased before the ILP (``autosharding/dead_code.py``, as XLA's
DCE runs before Alpa's pass), and fresh outputs break ties towards fewer
bytes per device (``autosharding/tie_breaks.py``, Alpa's replicated
penalty). Alpa's ``test_weight_init``: a Flax ``init`` (whose forward pass
is dead) returns its weights and Adam state sharded, with one device's
values."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from xdsl.dialects import func

import alpa_ir
from alpa_ir import import_jax
from alpa_ir.autosharding.dead_code import dead_ops
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.dialects.sharding import CollectiveOp, spec_of_value
from alpa_ir.ir.module_utils import main_function
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry


def _planned(fn: Any, *args: Any, **kwargs: Any) -> func.FuncOp:
    module = import_jax(fn, *args, **kwargs)
    PassManager(default_registry(), "builtin.module(auto-sharding{mesh-shape=4})").run(module)
    return main_function(module)


def _names(function: func.FuncOp) -> list[str]:
    return [getattr(op, "primitive_name", op.name) for op in function.body.block.ops]


def test_dead_ops_are_the_pure_ones_nothing_returned_reads() -> None:
    mesh = jax.make_mesh((2,), ("a",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])

    def step(w: jax.Array, x: jax.Array) -> Any:
        unused = jnp.sum(x @ w)  # dead, with its operand chain
        hinted = jax.lax.with_sharding_constraint(x * 3.0, NamedSharding(mesh, P("a")))
        del unused, hinted  # the hint is dead too, but a user's hint is kept
        return jnp.tanh(w) * 2.0

    module = import_jax(step, jnp.ones((4, 4)), jnp.ones((2, 4)))
    block = main_function(module).body.block
    dead = {getattr(op, "primitive_name", op.name) for op in dead_ops(block)}
    assert dead == {"dot_general", "reduce_sum"}
    kept = [op for op in block.ops if isinstance(op, LaxOp)]
    assert {"sharding_constraint", "mul", "tanh"} <= {op.primitive_name for op in kept}


def test_a_dead_loss_is_erased_and_moves_nothing() -> None:
    """The loss of a step that does not return it is dead. Priced, its sum over
    the batch-split rows would cost an all-reduce, and the plan kept the rows
    whole instead; erased, the rows are split and nothing moves."""

    def step(w: jax.Array, x: jax.Array) -> Any:
        h = jnp.tanh(x @ w)
        loss = jnp.sum(h)  # dead: the step returns only the activations
        del loss
        return h * 2.0

    function = _planned(step, jnp.ones((16, 8)), jnp.ones((32, 16)), batch_argnums=(1,))
    assert "reduce_sum" not in _names(function)
    assert not [op for op in function.body.block.ops if isinstance(op, CollectiveOp)]
    assert function.attributes["sharding.objective"].value.data == 0.0  # type: ignore[attr-defined]
    assert spec_of_value(function.args[1], function).dims[0]  # the batch rows split


def test_a_fresh_output_breaks_its_tie_towards_sharded() -> None:
    """Zeros returned next to a doubled input: every plan moves nothing, and
    the fresh zeros come back split (as the input's own tie splits it)."""

    def fn(w: jax.Array) -> Any:
        return jnp.zeros((16, 8)), w * 2.0

    function = _planned(fn, jnp.ones((16, 8)))
    ret = function.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    zeros, doubled = (spec_of_value(v, function) for v in ret.operands)
    assert not zeros.is_replicated() and not doubled.is_replicated()
    assert function.attributes["sharding.objective"].value.data == 0.0  # type: ignore[attr-defined]


class _Model(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(16)(nn.Dense(16)(x))


def _init(key: jax.Array) -> TrainState:
    model = _Model()
    params = model.init(key, jnp.ones((64, 16)))  # runs the forward pass, drops its output
    return TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


def _split(x: jax.Array) -> bool:
    return any(e is not None for e in x.sharding.spec)  # type: ignore[attr-defined]


def test_an_init_function_returns_its_weights_and_optimizer_state_sharded() -> None:
    """Alpa's test_weight_init. Without the dead forward erased the kernels
    come back whole; without the output ties the Adam moments do too."""
    mesh = alpa_ir.LogicalDeviceMesh((4,), devices=(0, 1, 2, 3))
    parallel = alpa_ir.parallelize(_init, method=alpa_ir.ShardParallel(devices=mesh))
    key = jax.random.PRNGKey(0)
    state = parallel(key)
    for layer in ("Dense_0", "Dense_1"):
        assert _split(state.params["params"][layer]["kernel"]), layer
        assert _split(state.opt_state[0].mu["params"][layer]["kernel"]), layer
        assert _split(state.opt_state[0].nu["params"][layer]["kernel"]), layer
    assert not _split(state.step)
    want = jax.jit(_init)(key)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6),
        (state.params, state.opt_state),
        (want.params, want.opt_state),
    )
    # the objective reported is communication only: the ties are left out
    assert parallel.get_last_executable().auto_sharding_objective == 0.0
