"""A plugin that contributes a cluster preset: two nodes of four small devices."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from alpa_ir.hardware.clusters import Cluster, ClusterLevel
from alpa_ir.plugins.hookspecs import hookimpl


def _lab_cluster(num_nodes: int | None = None) -> Cluster:
    return Cluster(
        "lab-2x4",
        (
            ClusterLevel("node", num_nodes or 2, 12.5e9, 5e-6),
            ClusterLevel("device", 4, 100e9, 1e-6),
        ),
        device_memory=8 * 1024**3,
        peak_flops=50e12,
    )


@hookimpl
def alpa_ir_cluster_presets() -> Mapping[str, Callable[..., Any]]:
    return {"lab-2x4": _lab_cluster}
