"""Parallelism placement (P² §3.1): parallelism matrices and the device order they define.

A parallelism matrix ``X`` for hierarchy ``H = [h0 .. hn]`` and parallelism axes
``P = [p0 .. pm]`` has integer factors with ``prod_i X[i][j] = h_j`` (every column) and
``prod_j X[i][j] = p_i`` (every row): ``X[i][j]`` is how many ways axis ``i`` is split on
level ``j``.

Device order (the convention used throughout P² here):

* a device's coordinate ``c_j`` on hardware level ``j`` is split into one sub-coordinate per
  parallelism axis, ``u[i][j] in [0, X[i][j])``, axis 0 the most significant:
  ``c_j = sum_i u[i][j] * prod_{i' > i} X[i'][j]``;
* the logical coordinate on axis ``i`` is the mixed-radix number of its sub-coordinates,
  level 0 the most significant: ``l_i = sum_j u[i][j] * prod_{j' > j} X[i][j']``.

So for ``H = [1, 2, 2, 4]``, ``P = [4, 4]`` (data, shards), ``X = [[1, 2, 2, 1], [1, 1, 1, 4]]``
(the paper's Figure 2b) the data coordinate is (server, CPU) and the shard coordinate the GPU:
every CPU holds one data-parallel replica with its 4 shards on its 4 GPUs. With
``X = [[1, 2, 1, 2], [1, 1, 2, 2]]`` (Figure 2c) a CPU's 4 GPUs hold two replicas (GPU
sub-coordinate of the data axis outer) of two shards each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from alpa_ir.errors import AlpaError


@dataclass(frozen=True)
class ParallelismMatrix:
    """Rows are parallelism axes, columns hierarchy levels (as printed in the paper)."""

    rows: tuple[tuple[int, ...], ...]

    @property
    def axes(self) -> tuple[int, ...]:
        return tuple(math.prod(row) for row in self.rows)

    @property
    def hierarchy(self) -> tuple[int, ...]:
        return tuple(math.prod(col) for col in zip(*self.rows, strict=True))

    def as_lists(self) -> list[list[int]]:
        return [list(row) for row in self.rows]

    def __str__(self) -> str:
        return "[" + " ".join("[" + " ".join(map(str, r)) + "]" for r in self.rows) + "]"


@cache
def _column_splits(value: int, limits: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Ordered factorizations of ``value`` into ``len(limits)`` factors, factor i dividing
    ``limits[i]``."""
    if not limits:
        return ((),) if value == 1 else ()
    out = []
    for d in range(1, value + 1):
        if value % d == 0 and limits[0] % d == 0:
            out.extend((d, *rest) for rest in _column_splits(value // d, limits[1:]))
    return tuple(out)


def enumerate_matrices(
    hierarchy: tuple[int, ...] | list[int], axes: tuple[int, ...] | list[int]
) -> list[ParallelismMatrix]:
    """All parallelism matrices for ``hierarchy`` and ``axes`` (§3.1, Eq. 1-2)."""
    hierarchy, axes = tuple(hierarchy), tuple(axes)
    if not axes or any(a < 1 for a in axes):
        raise AlpaError(f"parallelism axes {list(axes)} must be positive integers")
    if math.prod(axes) != math.prod(hierarchy):
        raise AlpaError(
            f"parallelism axes {list(axes)} have {math.prod(axes)} devices but the system "
            f"hierarchy {list(hierarchy)} has {math.prod(hierarchy)}"
        )
    columns: list[tuple[int, ...]] = []
    found: list[ParallelismMatrix] = []

    def fill(j: int, remaining: tuple[int, ...]) -> None:
        if j == len(hierarchy):
            if all(r == 1 for r in remaining):
                found.append(ParallelismMatrix(tuple(zip(*columns, strict=True))))
            return
        for col in _column_splits(hierarchy[j], remaining):
            columns.append(col)
            fill(j + 1, tuple(r // c for r, c in zip(remaining, col, strict=True)))
            columns.pop()

    fill(0, axes)
    return found


def _level_major_ids(matrix: ParallelismMatrix) -> np.ndarray:
    """Physical ids as an array with one axis per factor X[i][j], ordered level-major
    (j outer, i inner): exactly the mixed-radix split of a device id described above."""
    shape = [
        matrix.rows[i][j] for j in range(len(matrix.hierarchy)) for i in range(len(matrix.rows))
    ]
    return np.arange(math.prod(matrix.hierarchy)).reshape(shape)


def device_array(matrix: ParallelismMatrix) -> np.ndarray:
    """``ids[l0, .., lm]`` = the physical device holding logical coordinate ``(l0 .. lm)``."""
    m, n = len(matrix.rows), len(matrix.hierarchy)
    ids = _level_major_ids(matrix)
    order = [j * m + i for i in range(m) for j in range(n)]  # axis-major
    return ids.transpose(order).reshape(matrix.axes)


@dataclass(frozen=True)
class SynthesisLevel:
    """A level of the synthesis hierarchy: the hardware level it comes from and its factor."""

    hardware_level: int
    name: str
    cardinality: int


@dataclass(frozen=True)
class ReductionLayout:
    """How a reduction over some axes of a placed mesh maps onto the hardware.

    ``levels`` is the synthesis hierarchy (§3.4, Table 1 option 3): per hardware level the
    product of the reduction axes' factors on it, levels whose product is 1 dropped.
    ``devices[r, t]`` is the physical device of synthesis index ``t`` (mixed radix over
    ``levels``) in reduction group ``r``; every row is one reduction group.
    """

    levels: tuple[SynthesisLevel, ...]
    devices: np.ndarray

    @property
    def group_size(self) -> int:
        return int(self.devices.shape[1])

    def reduction_groups(self) -> list[list[int]]:
        return self.devices.tolist()


def reduction_layout(
    matrix: ParallelismMatrix,
    reduce_axes: tuple[int, ...] | list[int],
    level_names: tuple[str, ...],
) -> ReductionLayout:
    """The synthesis hierarchy and device groups of a reduction over ``reduce_axes``."""
    m, n = len(matrix.rows), len(matrix.hierarchy)
    reduce_axes = tuple(sorted(set(reduce_axes)))
    if not reduce_axes or any(not 0 <= a < m for a in reduce_axes):
        raise AlpaError(f"reduction axes {list(reduce_axes)} out of range for {m} parallelism axes")
    ids = _level_major_ids(matrix)
    keep = [j * m + i for i in range(m) if i not in reduce_axes for j in range(n)]
    red = [j * m + i for j in range(n) for i in reduce_axes]
    k = math.prod(matrix.axes[i] for i in reduce_axes)
    devices = ids.transpose(keep + red).reshape(-1, k)
    levels = []
    for j in range(n):
        factor = math.prod(matrix.rows[i][j] for i in reduce_axes)
        if factor > 1:
            levels.append(SynthesisLevel(j, level_names[j], factor))
    return ReductionLayout(tuple(levels), devices)
