"""Cluster presets, the mesh.cluster round trip, Alpa's submesh space and α/β derivation."""

from __future__ import annotations

import math

import jax
import pytest
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.dialects.mesh import ClusterOp
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import (
    Cluster,
    ClusterLevel,
    GiB,
    builtin_presets,
    get_cluster,
)
from alpa_ir.ir.text import parse_module
from alpa_ir.p2.system import gcp_a100
from alpa_ir.p2.system_clusters import cluster_from_system, p2_cluster_presets
from alpa_ir.plugins.registry import default_registry

# the testbed's links as its device profile measured them (NCCL bus bandwidth:
# alpa_ir.hardware.builtin_profiles): NVLink ring 135 of 150 GB/s, the 25 Gbps
# NIC at P²'s 64 %; DGX InfiniBand at 90 % of its line rate
NVLINK, NIC = 135e9, 0.64 * 25e9 / 8
A100_IB, H100_IB, H100_NVLINK = 0.9 * 25e9, 0.9 * 50e9, 480e9


def test_presets_are_registered_through_the_plugin_hook() -> None:
    registry = default_registry()
    for name in ("alpa-testbed", "dgx-a100", "dgx-h100", "gcp-a100", "gcp-v100-8x4", "local-cpu"):
        assert registry.owners[("cluster_presets", name)] == "builtin"
    assert set(builtin_presets()) | set(p2_cluster_presets()) == set(registry.cluster_presets)


def test_alpa_testbed_sizes_from_nodes_or_gpus() -> None:
    c = get_cluster("alpa-testbed", num_nodes=4)
    assert (c.num_nodes, c.devices_per_node, c.num_devices) == (4, 8, 32)
    assert get_cluster("alpa-testbed", num_devices=16) == get_cluster("alpa-testbed", num_nodes=2)
    assert c.device_memory == 16 * GiB and c.peak_flops == 125e12
    assert [lv.bandwidth for lv in c.levels] == [NIC, NVLINK]
    assert c.levels[0].shared and not c.levels[1].shared
    assert get_cluster("dgx-h100", num_nodes=2).num_devices == 16


def test_gcp_systems_derive_from_p2() -> None:
    c = get_cluster("gcp-a100-16x2", presets=p2_cluster_presets())
    system = gcp_a100(2)
    assert c == cluster_from_system(system, "a100")
    assert [lv.cardinality for lv in c.levels] == list(system.hierarchy)
    assert c.levels[0].bandwidth == system.interconnects[0].bandwidth and c.levels[0].shared
    assert get_cluster("gcp-a100", presets=p2_cluster_presets(), num_nodes=3).num_devices == 48


def test_local_cpu_counts_the_jax_devices() -> None:
    c = get_cluster("local-cpu")
    assert c.num_devices == len(jax.local_devices())


def test_round_trip_through_the_op_and_text() -> None:
    c = get_cluster("dgx-a100", num_nodes=2)
    op = c.to_op()
    text = str(ModuleOp([op]))
    parsed = next(iter(parse_module(text).ops))
    assert isinstance(parsed, ClusterOp)
    assert parsed.num_devices() == 16
    assert Cluster.from_op(parsed) == c


def test_submesh_space_is_alpas() -> None:
    c = get_cluster("alpa-testbed", num_nodes=3)
    assert c.submesh_shapes() == ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8))


def test_logical_mesh_views_and_alpha_beta() -> None:
    c = get_cluster("alpa-testbed", num_nodes=2)
    views = {m.shape: m for m in c.submesh_logical_meshes((2, 8))}
    assert set(views) == {(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)}
    # (2, 8): axis 0 crosses nodes, the 8 GPUs of a node share its NIC; axis 1 is NVLink.
    m = views[(2, 8)]
    assert m.alpha == (50e-6, 5e-6)
    assert m.beta == pytest.approx((8 / NIC, 1 / NVLINK))
    # (4, 4): 4 groups cross each node's NIC; (8, 2): 2; (1, 16): one ring crosses it once.
    assert views[(4, 4)].beta == pytest.approx((4 / NIC, 1 / NVLINK))
    assert views[(8, 2)].beta == pytest.approx((2 / NIC, 1 / NVLINK))
    assert views[(1, 16)].beta[1] == pytest.approx(1 / NIC)
    # A submesh inside a node sees NVLink on both axes, on the devices it was given.
    inner = c.submesh_logical_meshes((1, 4), start=4)
    assert [v.shape for v in inner] == [(1, 4), (2, 2), (4, 1)]
    assert all(v.beta == pytest.approx((1 / NVLINK, 1 / NVLINK)) for v in inner)
    assert inner[1].devices == (4, 5, 6, 7)


def test_unshared_inter_node_links_are_not_divided() -> None:
    c = get_cluster("dgx-h100", num_nodes=2)
    m = c.logical_mesh((2, 8))
    assert m.beta == pytest.approx((1 / H100_IB, 1 / H100_NVLINK))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ClusterLevel("gpu", 8, 0.0, 1e-6), "bandwidth must be a positive"),
        (lambda: ClusterLevel("gpu", 8, -1e9, 1e-6), "bandwidth must be a positive"),
        (lambda: ClusterLevel("gpu", 8, 1e9, -1.0), "latency must be >= 0"),
        (lambda: ClusterLevel("gpu", 0, 1e9, 1e-6), "cardinality must be >= 1"),
        (lambda: Cluster("c", (), 1.0, 1.0), "needs at least one level"),
        (
            lambda: Cluster("c", (ClusterLevel("gpu", 2, 1e9, 0.0),), 0.0, 1.0),
            "device_memory must be positive",
        ),
        (
            lambda: Cluster("c", (ClusterLevel("gpu", 6, 1e9, 0.0),), 1.0, 1.0).submesh_shapes(),
            "power-of-two number of devices per node, got 6",
        ),
        (lambda: get_cluster("dgx-b300"), "unknown cluster preset 'dgx-b300'; known: alpa-testbed"),
        (
            lambda: get_cluster("alpa-testbed", num_devices=12),
            "12 devices is not a whole number of nodes of 8",
        ),
        (
            lambda: get_cluster("alpa-testbed", num_nodes=2, num_devices=32),
            "2 nodes of 8 are not 32 devices",
        ),
        (lambda: get_cluster("alpa-testbed", num_nodes=0), "number of nodes must be >= 1"),
        (
            lambda: get_cluster("gcp-a100-16x2", presets=p2_cluster_presets(), num_nodes=4),
            "has 2 nodes, got 4",
        ),
        (
            lambda: get_cluster("alpa-testbed", num_nodes=1).check_devices(16, "plan"),
            "plan: 16 devices requested but cluster 'alpa-testbed' has 8",
        ),
        (
            lambda: get_cluster("alpa-testbed", num_nodes=1).logical_mesh((2, 8)),
            "device 8 is outside the cluster's 8 devices",
        ),
        (
            lambda: get_cluster("alpa-testbed", num_nodes=2).submesh_logical_meshes((1, 8), 4),
            "must start at a multiple of 8",
        ),
        (
            lambda: get_cluster("alpa-testbed", num_nodes=2).submesh_logical_meshes((1, 3)),
            "1x3 is not a submesh",
        ),
    ],
)
def test_bad_input_is_one_line(make: object, message: str) -> None:
    with pytest.raises(AlpaError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        make()  # type: ignore[operator]
    assert "\n" not in str(err.value)


def test_paper_scale_mesh_is_cheap() -> None:
    c = get_cluster("dgx-h100", num_devices=1024)
    m = c.logical_mesh((128, 8))
    assert m.size == 1024 and math.isclose(m.beta[0], 1 / H100_IB)


def test_presets_under_one_switch_keep_two_levels() -> None:
    for preset, nodes in (("dgx-a100", 20), ("dgx-h100", 32), ("alpa-testbed", 100)):
        c = get_cluster(preset, num_nodes=nodes)
        assert [lv.name for lv in c.levels] == ["node", "gpu"]
        assert c.levels[0].cardinality == nodes


def test_llama3_cluster_has_oversubscribed_pods() -> None:
    # 16,384 H100s: 8 pods of 2,048 GPUs (384 nodes do not divide 2,048 nodes),
    # 8 scalable units of 32 nodes per pod, 1:7 between pods.
    c = get_cluster("dgx-h100", num_devices=16384)
    assert [(lv.name, lv.cardinality) for lv in c.levels] == [
        ("pod", 8),
        ("su", 8),
        ("node", 32),
        ("gpu", 8),
    ]
    assert c.num_nodes == 2048 and c.devices_per_node == 8
    # an axis inside a pod keeps the NIC's bandwidth; one across pods gets a seventh
    m = c.logical_mesh((8, 256, 8))
    assert m.beta == pytest.approx((7 / H100_IB, 1 / H100_IB, 1 / H100_NVLINK))
    assert m.alpha[0] > m.alpha[1] > m.alpha[2]
    # the calibrated model prices the oversubscribed level: the same all-reduce
    # across pods costs more than inside one
    from alpa_ir.p2.calibrated import CalibratedCostModel

    prices = CalibratedCostModel.for_cluster(c)
    across = prices.all_reduce(c.logical_mesh((8, 2048)), 2**28, (0,))
    within = prices.all_reduce(c.logical_mesh((256, 8, 8)), 2**28, (1,))
    assert across > 2 * within


def test_megatron_gpu_counts_build_on_dgx_a100() -> None:
    for gpus in (32, 64, 128, 256, 512, 1024, 1536, 1920, 2520, 3072):
        c = get_cluster("dgx-a100", num_devices=gpus)
        assert c.num_devices == gpus and c.devices_per_node == 8
        assert all(lv.bandwidth == A100_IB for lv in c.levels[:-1])  # non-blocking fat tree
    c = get_cluster("dgx-a100", num_devices=2520)  # 315 nodes: units of 15, pods of 105
    assert [lv.cardinality for lv in c.levels] == [3, 7, 15, 8]


def test_four_levels_round_trip_through_the_op_and_text() -> None:
    c = get_cluster("dgx-h100", num_devices=8192)
    assert len(c.levels) == 4
    parsed = next(iter(parse_module(str(ModuleOp([c.to_op()]))).ops))
    assert isinstance(parsed, ClusterOp)
    assert parsed.num_devices() == 8192
    assert Cluster.from_op(parsed) == c


def test_scale_out_tiers_are_a_parameter() -> None:
    from alpa_ir.hardware.clusters import FabricTier, dgx_h100

    flat = dgx_h100(64, tiers=(FabricTier("cluster", 1 << 30, 5e-6),))
    assert [lv.cardinality for lv in flat.levels] == [64, 8]
    tight = dgx_h100(64, tiers=(FabricTier("su", 8, 5e-6), FabricTier("c", 1, 9e-6, 2.0)))
    assert [(lv.name, lv.cardinality, lv.bandwidth) for lv in tight.levels[:2]] == [
        ("su", 8, H100_IB / 2),
        ("node", 8, H100_IB),
    ]
