"""Alpa's submesh search spaces (AutoStageOption's submesh_physical_shape_space,
manually_specified_submeshes and submesh_logical_shape_space): the submeshes
and logical views construct-stages prices."""

from __future__ import annotations

import pytest

from alpa_ir.costs.stage_table import physical_submeshes, submesh_views
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import get_cluster


@pytest.fixture(scope="module")
def eight_nodes() -> object:
    return get_cluster("alpa-testbed", num_nodes=8)  # 8 nodes of 8 GPUs


def test_physical_spaces_choose_the_whole_node_counts(eight_nodes: object) -> None:
    inner = [(1, 1), (1, 2), (1, 4), (1, 8)]
    assert physical_submeshes(eight_nodes) == (*inner, *((n, 8) for n in range(2, 9)))
    assert physical_submeshes(eight_nodes, "power-of-two") == (*inner, (2, 8), (4, 8), (8, 8))
    assert physical_submeshes(eight_nodes, "small-power-of-two") == (*inner, (2, 8), (4, 8))
    assert physical_submeshes(eight_nodes, "manual", [(1, 4), (2, 8)]) == ((1, 4), (2, 8))


def test_logical_spaces_keep_the_views_alpa_keeps(eight_nodes: object) -> None:
    same = submesh_views(eight_nodes, "same-as-physical", "small-power-of-two")
    assert {s: [v.shape for v in vs] for s, vs in same.items()} == {
        s: [s] for s in [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]
    }
    data = submesh_views(eight_nodes, "data-parallel-only", "manual", [(2, 8)])
    assert [v.shape for v in data[(2, 8)]] == [(16, 1)]
    model = submesh_views(eight_nodes, "model-parallel-only", "manual", [(1, 8)])
    assert [v.shape for v in model[(1, 8)]] == [(1, 8)]


def test_bad_spaces_name_what_is_wrong(eight_nodes: object) -> None:
    with pytest.raises(AlpaError, match="unknown physical submesh space 'tiny'"):
        physical_submeshes(eight_nodes, "tiny")
    with pytest.raises(AlpaError, match=r"submesh 3x4 is not a submesh of cluster"):
        physical_submeshes(eight_nodes, "manual", [(3, 4)])
    with pytest.raises(AlpaError, match="manual physical space needs its submeshes"):
        physical_submeshes(eight_nodes, "manual")


def test_the_pass_reads_its_manual_submeshes() -> None:
    from alpa_ir.passes.construct_stages import parse_submeshes

    assert parse_submeshes("1x2,2x8") == ((1, 2), (2, 8))
    assert parse_submeshes("") == ()
    with pytest.raises(AlpaError, match="submesh '2by8' is not NxM"):
        parse_submeshes("1x2,2by8")
