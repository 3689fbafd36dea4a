"""A Megatron-style plan for the zoo's train steps, by array name.

The batch is split over mesh axis 0; of each pair of matmuls the first is
column-split and the second row-split over axis 1 (``qkv``/``out``,
``fc1``/``fc2``, ``dense_{even}``/``dense_{odd}``; Llama's ``wq``, ``wk``,
``wv``/``wo`` and ``gate``, ``up``/``down``); MoE expert weights are
split by expert and conv kernels by output channel over axis 1. Names are
the IR's argument names (``state.params.dense_0.kernel``, ``batch.x``); a
dimension that the axis does not divide, or an axis of size 1, stays whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alpa_ir.dialects.sharding import ShardingSpec

_COLUMN = re.compile(r"(?:^|\.)(qkv|fc1|dense_[02468]|wq|wk|wv|gate|up)\.kernel$")
_COLUMN_BIAS = re.compile(r"(qkv|fc1|dense_[02468])\.bias$")
_ROW = re.compile(r"(?:^|\.)(out|fc2|dense_[13579]|wo|down)\.kernel$")


def megatron_spec(
    name: str, shape: Sequence[int], mesh_shape: Sequence[int] = (2, 4)
) -> ShardingSpec | None:
    """The spec of array ``name`` (None: no opinion, the planner decides)."""
    rank = len(shape)

    def split(dim: int, axis: int) -> ShardingSpec | None:
        if mesh_shape[axis] == 1 or shape[dim] % mesh_shape[axis]:
            return None
        dims: list[tuple[int, ...]] = [()] * rank
        dims[dim] = (axis,)
        return ShardingSpec(tuple(dims))

    if name.startswith("batch"):
        return split(0, 0) if rank else None
    if _COLUMN.search(name) or (_COLUMN_BIAS.search(name) and rank == 1):
        return split(rank - 1, 1)
    if _ROW.search(name):
        return split(0, 1)
    if "expert" in name and rank == 3:
        return split(0, 1)
    if name.endswith("kernel") and rank == 4:
        return split(3, 1)
    return None
