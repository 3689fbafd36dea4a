"""Layouts shared by the cross-mesh plan tests and the collective transfer
tests: specs written as text, and mesh pairs of the 8 CPU devices."""

from __future__ import annotations

from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.pipeline.cross_mesh import MeshLayout


def spec(text: str) -> ShardingSpec:
    """``"S0,R"`` -> the spec ``[S0, R]``."""
    return ShardingSpec(
        tuple(() if d == "R" else tuple(int(c) for c in d[1:]) for d in text.split(","))
    )


# Replicated, split on either mesh axis, split over both, and two dims split.
SPECS = ["R,R", "S0,R", "S1,R", "R,S0", "R,S1", "S01,R", "R,S10", "S1,S0"]
EXEC_SPECS = ["R,R", "S0,R", "R,S1", "S01,R", "S1,S0"]
MESH_PAIRS = {
    "1x2-1x2": (((1, 2), (0, 1)), ((1, 2), (2, 3))),
    "1x4-2x2": (((1, 4), (0, 1, 2, 3)), ((2, 2), (4, 5, 6, 7))),
    "2x2-1x4": (((2, 2), (0, 1, 2, 3)), ((1, 4), (4, 5, 6, 7))),
}
SHAPE = (8, 8)
ITEMSIZE = 4


def layouts(pair: str, src: str, dst: str) -> tuple[MeshLayout, MeshLayout]:
    (src_shape, src_devs), (dst_shape, dst_devs) = MESH_PAIRS[pair]
    return MeshLayout(spec(src), src_shape, src_devs), MeshLayout(spec(dst), dst_shape, dst_devs)
