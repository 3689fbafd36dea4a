"""P² parallelism matrices (§3.1), the device order they define, and synthesis hierarchies."""

import itertools
import math

import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.p2.placement import (
    ParallelismMatrix,
    device_array,
    enumerate_matrices,
    reduction_layout,
)

LEVELS4 = ("rack", "server", "cpu", "gpu")


def test_matrices_satisfy_row_and_column_products() -> None:
    matrices = enumerate_matrices((4, 16), (8, 2, 4))
    assert len(matrices) == 5  # the 5 matrices of Appendix A's [8 2 4]
    assert len(set(matrices)) == 5
    for x in matrices:
        assert x.axes == (8, 2, 4) and x.hierarchy == (4, 16)


@pytest.mark.parametrize(
    ("hierarchy", "axes", "count"),
    [((2, 16), (2, 16), 2), ((4, 16), (4, 16), 3), ((4, 16), (64,), 1), ((4, 16), (2, 2, 16), 4)],
)
def test_matrix_counts(hierarchy: tuple, axes: tuple, count: int) -> None:
    assert len(enumerate_matrices(hierarchy, axes)) == count


@pytest.mark.parametrize(
    ("hierarchy", "axes"), [((1, 2, 2, 4), (4, 4)), ((2, 2, 2), (2, 4)), ((2, 4), (2, 2, 2))]
)
def test_matrices_match_brute_force(hierarchy: tuple, axes: tuple) -> None:
    n = max(max(hierarchy), max(axes))
    cells = len(hierarchy) * len(axes)
    brute = set()
    for flat in itertools.product(range(1, n + 1), repeat=cells):
        rows = tuple(
            tuple(flat[i * len(hierarchy) : (i + 1) * len(hierarchy)]) for i in range(len(axes))
        )
        x = ParallelismMatrix(rows)
        if x.axes == axes and x.hierarchy == hierarchy:
            brute.add(x)
    assert set(enumerate_matrices(hierarchy, axes)) == brute


def test_axes_must_cover_the_system() -> None:
    with pytest.raises(AlpaError, match="32 devices"):
        enumerate_matrices((4, 16), (4, 8))


def test_figure_2b_each_cpu_is_one_replica() -> None:
    ids = device_array(ParallelismMatrix(((1, 2, 2, 1), (1, 1, 1, 4))))
    assert ids.shape == (4, 4)
    for replica in range(4):  # data coordinate = (server, cpu): GPUs 4r .. 4r+3 of one CPU
        assert ids[replica].tolist() == [4 * replica + s for s in range(4)]


def test_figure_2c_two_replicas_per_cpu() -> None:
    ids = device_array(ParallelismMatrix(((1, 2, 1, 2), (1, 1, 2, 2))))
    cpu = ids // 4
    # every replica spans both CPUs of one server; every CPU holds two replicas x two shards
    for replica in range(4):
        assert len(set((ids[replica] // 8).tolist())) == 1
        assert len(set(cpu[replica].tolist())) == 2
    assert sorted(ids.reshape(-1).tolist()) == list(range(16))


def test_reduction_layout_groups_share_non_reduced_coordinates() -> None:
    x = ParallelismMatrix(((1, 2, 1, 2), (1, 1, 2, 2)))
    ids = device_array(x)
    layout = reduction_layout(x, (1,), LEVELS4)
    assert sorted(map(sorted, layout.reduction_groups())) == sorted(sorted(r) for r in ids.tolist())
    assert [(lv.name, lv.cardinality) for lv in layout.levels] == [("cpu", 2), ("gpu", 2)]


def test_synthesis_hierarchy_collapses_levels_table_1() -> None:
    # Table 1 (second half): reducing axes 0 and 2 of [[1 2 3] [4 5 6] [7 8 9]] gives [7 16 27]
    x = ParallelismMatrix(((1, 2, 3), (4, 5, 6), (7, 8, 9)))
    layout = reduction_layout(x, (0, 2), ("a", "b", "c"))
    assert [lv.cardinality for lv in layout.levels] == [7, 16, 27]
    assert layout.devices.shape == (math.prod((4, 5, 6)), 7 * 16 * 27)
    assert len(np.unique(layout.devices)) == layout.devices.size


def test_levels_with_factor_one_are_dropped() -> None:
    layout = reduction_layout(ParallelismMatrix(((2, 1), (1, 16))), (1,), ("node", "gpu"))
    assert [(lv.name, lv.cardinality) for lv in layout.levels] == [("gpu", 16)]
    assert layout.devices.tolist() == [list(range(16)), list(range(16, 32))]


def test_reduction_axis_out_of_range() -> None:
    with pytest.raises(AlpaError, match="out of range"):
        reduction_layout(ParallelismMatrix(((2, 1), (1, 16))), (2,), ("node", "gpu"))
