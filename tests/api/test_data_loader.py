"""Alpa's data loaders: a dataset read by ranges, each batch placed as the
placement specs (Alpa's ShardingSpec form) say, loaded ahead."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import alpa_ir
from alpa_ir.api.parallel_plan import PlacementSpec
from alpa_ir.errors import AlpaError


# the form of JAX 0.3's jax.interpreters.pxla sharding specs (gone from JAX since)
@dataclass(frozen=True)
class NoSharding:
    pass


@dataclass(frozen=True)
class Chunked:
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class ShardedAxis:
    axis: int


@dataclass(frozen=True)
class Replicated:
    replicas: int


@dataclass(frozen=True)
class ShardingSpec:
    sharding: tuple[Any, ...]
    mesh_mapping: tuple[Any, ...]


X = np.arange(256 * 32, dtype=np.float32).reshape(256, 32)
Y = np.arange(256, dtype=np.int32)


def _ranges(drawn: list[int]) -> Any:
    def input_iter_func(start: int, end: int, batch_size: int) -> Iterator[Any]:
        for i in range(start, end, batch_size):
            drawn.append(i)
            yield X[i : i + batch_size], Y[i : i + batch_size]

    return input_iter_func


def _placements(x_spec: ShardingSpec, y_spec: ShardingSpec) -> list[PlacementSpec]:
    mesh_id = alpa_ir.get_global_physical_mesh().mesh_id
    return [
        PlacementSpec(jax.ShapeDtypeStruct((64, 32), jnp.float32), (mesh_id,), (x_spec,)),
        PlacementSpec(jax.ShapeDtypeStruct((64,), jnp.int32), (mesh_id,), (y_spec,)),
    ]


CASES = {
    "data": (
        ShardingSpec((Chunked((8,)), NoSharding()), (ShardedAxis(0),)),
        ShardingSpec((Chunked((8,)),), (ShardedAxis(0),)),
        ({"a0": 8}, PartitionSpec("a0", None), PartitionSpec("a0")),
    ),
    "model": (
        ShardingSpec((NoSharding(), Chunked((8,))), (ShardedAxis(0),)),
        ShardingSpec((NoSharding(),), (Replicated(8),)),
        ({"a0": 8}, PartitionSpec(None, "a0"), PartitionSpec(None)),
    ),
    "data-model": (
        ShardingSpec((Chunked((2,)), Chunked((4,))), (ShardedAxis(0), ShardedAxis(1))),
        ShardingSpec((Chunked((2,)),), (ShardedAxis(0), Replicated(4))),
        ({"a0": 2, "a1": 4}, PartitionSpec("a0", "a1"), PartitionSpec("a0")),
    ),
    "two axes on one dimension": (
        ShardingSpec((Chunked((2, 4)), NoSharding()), (ShardedAxis(1), ShardedAxis(0))),
        ShardingSpec((NoSharding(),), (Replicated(4), Replicated(2))),
        ({"a0": 4, "a1": 2}, PartitionSpec(("a1", "a0"), None), PartitionSpec(None)),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_mesh_driver_loader_places_every_batch_as_its_spec_says(case: str) -> None:
    x_spec, y_spec, (mesh, want_x, want_y) = CASES[case]
    drawn: list[int] = []
    loader = alpa_ir.MeshDriverDataLoader(64, 256, _ranges(drawn), _placements(x_spec, y_spec), 2)
    batches = list(loader)
    assert len(batches) == 4 and drawn == [0, 64, 128, 192]
    for k, (x, y) in enumerate(batches):
        np.testing.assert_array_equal(np.asarray(x), X[64 * k : 64 * (k + 1)])
        np.testing.assert_array_equal(np.asarray(y), Y[64 * k : 64 * (k + 1)])
        assert (
            dict(x.sharding.mesh.shape) == mesh and y.sharding.mesh.shape == x.sharding.mesh.shape
        )
        assert x.sharding.spec == want_x and y.sharding.spec == want_y
        assert x.sharding.mesh.devices.flat[0] == jax.devices()[0]


def test_batches_are_loaded_ahead_and_epochs_repeat() -> None:
    x_spec, y_spec, _ = CASES["data"]
    drawn: list[int] = []
    loader = alpa_ir.MeshDriverDataLoader(
        64, 200, _ranges(drawn), _placements(x_spec, y_spec), prefetch_size=2, repeat=True
    )
    it = iter(loader)
    next(it)
    assert drawn == [0, 64, 128]  # the one in use and two ahead
    rest = [next(it) for _ in range(5)]  # 3 batches an epoch (200 // 64), again from 0
    np.testing.assert_array_equal(np.asarray(rest[2][0]), X[:64])
    assert drawn[:6] == [0, 64, 128, 0, 64, 128]


def test_bad_placements_name_what_is_wrong() -> None:
    x_spec, _, _ = CASES["data"]
    wrong_mesh = ShardingSpec((Chunked((4,)), NoSharding()), (ShardedAxis(0),))
    with pytest.raises(
        AlpaError, match=r"placement spec 0: the sharding spec's mesh \[4\] holds 4"
    ):
        alpa_ir.MeshDriverDataLoader(64, 256, _ranges([]), _placements(wrong_mesh, x_spec))
    other_mesh = PlacementSpec(jax.ShapeDtypeStruct((64, 32), jnp.float32), (3,), (x_spec,))
    with pytest.raises(AlpaError, match=r"global mesh \(id 0\), got mesh ids \[3\]"):
        list(alpa_ir.MeshDriverDataLoader(64, 256, _ranges([]), [other_mesh]))
    with pytest.raises(AlpaError, match="100 samples make no batch of 128"):
        alpa_ir.MeshDriverDataLoader(128, 100, _ranges([]), [])
