"""P²'s systems as clusters: the GCP systems of the P² paper (§5) as cluster
presets (``gcp-a100``, ``gcp-v100`` and the paper's fixed ``gcp-a100-16x2``
etc.), registered by the built-in plugin beside the presets of
:mod:`alpa_ir.hardware.clusters`."""

from __future__ import annotations

from collections.abc import Mapping

from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import (
    GB,
    Cluster,
    ClusterFactory,
    ClusterLevel,
    GiB,
    preset_nodes,
)
from alpa_ir.p2.system import PRESETS, System, gcp_a100, gcp_v100

# Devices of the P² paper's GCP systems (§5): a2-megagpu-16g has 16 x A100 40 GB,
# n1 V100 nodes 8 x V100 16 GB. Figures from the NVIDIA datasheets.
_GCP_DEVICES: Mapping[str, tuple[float, float, float, str]] = {
    "a100": (40 * GiB, 312e12, 1555 * GB, "A100-SXM4-40GB"),
    "v100": (16 * GiB, 125e12, 900 * GB, "V100-SXM2-16GB"),
}


def cluster_from_system(system: System, device: str) -> Cluster:
    """A cluster from a P² system: each level takes
    the first interconnect listed for it (the primary one: NVLink over PCIe on a
    V100 node); a level with devices below it whose interconnect has one port per
    unit (a NIC) is shared. Device figures from ``device`` (``a100``/``v100``)."""
    levels = []
    last = len(system.levels) - 1
    for j, level in enumerate(system.levels):
        link = next((c for c in system.interconnects if c.level == j), None)
        if link is None:
            raise AlpaError(f"system '{system.name}': no interconnect joins level '{level.name}'")
        levels.append(
            ClusterLevel(level.name, level.cardinality, link.bandwidth, link.latency, j < last)
        )
    memory, flops, hbm, name = _GCP_DEVICES[device]
    return Cluster(system.name, tuple(levels), memory, flops, hbm, name)


def _gcp(kind: str, fixed_nodes: int | None, preset: str) -> ClusterFactory:
    def make(num_nodes: int | None = None) -> Cluster:
        if fixed_nodes is not None and num_nodes not in (None, fixed_nodes):
            raise AlpaError(f"cluster preset '{preset}' has {fixed_nodes} nodes, got {num_nodes}")
        n = preset_nodes(preset, num_nodes if fixed_nodes is None else fixed_nodes, 2)
        system = gcp_a100(n) if kind == "a100" else gcp_v100(n)
        return cluster_from_system(system, kind)

    return make


def p2_cluster_presets() -> dict[str, ClusterFactory]:
    """``gcp-a100``, ``gcp-v100`` (any number of nodes) and the P² paper's fixed
    systems (``gcp-a100-16x2`` etc.)."""
    presets: dict[str, ClusterFactory] = {
        "gcp-a100": _gcp("a100", None, "gcp-a100"),
        "gcp-v100": _gcp("v100", None, "gcp-v100"),
    }
    for name in PRESETS:
        kind = name.split("-")[1]
        presets[name] = _gcp(kind, int(name.rsplit("x", 1)[1]), name)
    return presets


__all__ = ["cluster_from_system", "p2_cluster_presets"]
