"""Alpa's helpers under their Alpa names: ``alpa_ir.testing.assert_allclose``
and ``alpa_ir.util`` (``benchmark_func``, ``disable_tqdm_globally``)."""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import FrozenDict
from flax.training.train_state import TrainState

from alpa_ir.testing import assert_allclose
from alpa_ir.util import benchmark_func, disable_tqdm_globally


def test_assert_allclose_walks_mappings_sequences_and_arrays() -> None:
    a = {"w": jnp.ones((2, 3)), "b": [np.zeros(2), 1.0], "name": "x"}
    assert_allclose(a, {"w": np.ones((2, 3)) + 5e-5, "b": (np.zeros(2), 1.0), "name": "x"})
    assert_allclose(FrozenDict({"k": jnp.arange(3.0)}), {"k": np.arange(3.0)})
    with pytest.raises(AssertionError, match=r"\['b'\]\[0\]"):
        assert_allclose(a, {"w": np.ones((2, 3)), "b": [np.ones(2), 1.0], "name": "x"})
    with pytest.raises(AssertionError, match="keys"):
        assert_allclose({"a": 1.0}, {"b": 1.0})
    with pytest.raises(AssertionError, match="3 elements against 2"):
        assert_allclose([1, 2, 3], [1, 2])
    assert_allclose([1.0], [1.2], atol=0.3)  # Alpa's tolerances are arguments


def test_assert_allclose_compares_train_states_by_leaves() -> None:
    params = {"w": jnp.ones((2, 2))}
    state = TrainState.create(apply_fn=None, params=params, tx=optax.sgd(0.1))
    assert_allclose(state, state.replace(params={"w": jnp.ones((2, 2)) + 1e-6}))
    with pytest.raises(AssertionError):
        assert_allclose(state, state.replace(params={"w": jnp.zeros((2, 2))}))


def test_benchmark_func_counts_warmup_rounds_and_calls() -> None:
    calls: list[str] = []
    costs = benchmark_func(
        lambda: (calls.append("run"), time.sleep(0.002)),
        lambda: calls.append("sync"),
        warmup=2,
        repeat=3,
        number=4,
    )
    assert costs.shape == (3,)
    assert calls.count("run") == 2 + 3 * 4
    assert calls.count("sync") == 2 * 3  # before and after each round
    assert np.all(costs >= 0.002)  # seconds per call, not per round
    assert np.all(costs < 0.05)
    assert benchmark_func(lambda: None).shape == (3,)  # Alpa's defaults


def test_benchmark_func_min_repeat_second_chooses_number() -> None:
    calls = []
    benchmark_func(lambda: (calls.append(1), time.sleep(0.01)), warmup=0, repeat=1,
                   number=1, min_repeat_second=0.05)  # fmt: skip
    assert len(calls) >= 1 + 4  # one timing call, then at least 0.05 / 0.01 - rounding


def test_disable_tqdm_globally() -> None:
    tqdm = pytest.importorskip("tqdm")
    disable_tqdm_globally()
    assert tqdm.tqdm(range(3)).disable


def test_count_communication_primitives_of_a_data_parallel_step() -> None:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from alpa_ir.util import count_communication_primitives, map_to_shape

    mesh = jax.make_mesh((8,), ("d",))
    rows = NamedSharding(mesh, PartitionSpec("d"))
    whole = NamedSharding(mesh, PartitionSpec())

    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.1 * grad, loss

    w, x = jnp.ones((16, 4)), jnp.ones((32, 16))
    compiled = jax.jit(step, in_shardings=(whole, rows), out_shardings=(whole, whole))
    text = compiled.lower(w, x).compile().as_text()
    total, all_reduce, all_gather, reduce_scatter, all_to_all = count_communication_primitives(text)
    assert all_reduce >= 1 and total == all_reduce + all_gather + reduce_scatter + all_to_all
    # the gradient's all-reduce stays when scalars are left out
    assert count_communication_primitives(text, ignore_scalar_all_reduce=True)[1] == all_reduce
    total_only = jax.jit(jnp.sum, in_shardings=rows, out_shardings=whole)
    scalar = total_only.lower(x).compile().as_text()
    assert count_communication_primitives(scalar)[1] == 1
    assert count_communication_primitives(scalar, ignore_scalar_all_reduce=True)[:2] == (0, 0)
    assert count_communication_primitives("HloModule empty") == (0, 0, 0, 0, 0)
    assert map_to_shape({"w": w, "n": 3}) == {"w": (16, 4), "n": None}


def test_map_to_nparray_fetches_every_array_leaf() -> None:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from alpa_ir.util import map_to_nparray

    rows = NamedSharding(jax.make_mesh((8,), ("d",)), PartitionSpec("d"))
    w = jax.device_put(jnp.arange(16.0).reshape(8, 2), rows)
    got = map_to_nparray({"w": w, "step": 3, "name": "x"})
    assert type(got["w"]) is np.ndarray and got["step"] == 3 and got["name"] == "x"
    np.testing.assert_array_equal(got["w"], np.arange(16.0).reshape(8, 2))


def test_hlo_parser_reads_the_entry_parameters_and_root() -> None:
    import jax

    from alpa_ir.testing import HloParser

    def f(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        return a @ b, a.sum()

    text = jax.jit(f).lower(jnp.ones((2, 4)), jnp.ones((4, 3))).compile().as_text()
    params = HloParser.parse_param_shapes(HloParser.get_param_line(text))
    assert params == ("f32[2,4]", "f32[4,3]")
    root = HloParser.parse_root_shapes(HloParser.get_root_line(text))
    assert root == ("f32[2,3]", "f32[]")
