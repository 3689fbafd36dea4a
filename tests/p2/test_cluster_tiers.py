"""A cluster's network tiers in the P² system: traffic across a tier still leaves by its NICs."""

from __future__ import annotations

import pytest

from alpa_ir.hardware.clusters import dgx_h100
from alpa_ir.p2.calibrated import CalibratedCostModel
from alpa_ir.p2.ir_system import system_from_cluster

GIB = float(2**30)


def test_tiers_go_through_the_levels_below_them() -> None:
    cluster = dgx_h100(2048)  # 16,384 GPUs: pods of scalable units of nodes of 8 GPUs
    system = system_from_cluster(cluster.to_op())
    assert system.level_names == ("pod", "su", "node", "gpu")
    through = {link.name: link.through for link in system.interconnects}
    assert through == {"pod": ("su", "node"), "su": ("node",), "node": (), "gpu": ()}


@pytest.mark.parametrize("replicas", [2, 4])
def test_replica_ring_across_units_is_bounded_by_the_nic(replicas: int) -> None:
    """The gradient ring of replicas of an 8-GPU stage, one replica per scalable unit (32
    nodes) or per 16 nodes, two in each unit: every GPU sends and receives 2(m-1)/m of its
    bytes through its own 400 Gb/s NIC, whatever tier the ring's edges cross (issue #42:
    priced 0.27 s for 11.6 GiB over 64 replicas where the NICs need 0.55 s)."""
    cluster = dgx_h100(64)  # two scalable units of 32 nodes, non-blocking between them
    model = CalibratedCostModel.for_cluster(cluster)
    stride = cluster.num_devices // replicas
    grid = [r * stride + d for r in range(replicas) for d in range(8)]
    mesh = cluster.logical_mesh((replicas, 8), grid)
    nbytes = 11.6 * GIB
    nic = cluster.levels[-2].bandwidth  # one NIC per GPU
    floor = 2 * (replicas - 1) / replicas * nbytes / nic
    priced = model.seconds("all_reduce", mesh, nbytes, (0,))
    assert floor <= priced < floor * 1.01
    zero = sum(model.seconds(k, mesh, nbytes, (0,)) for k in ("reduce_scatter", "all_gather"))
    assert floor <= zero < floor * 1.01


def test_a_ring_prices_alike_inside_a_unit_and_across_units() -> None:
    """Non-blocking tiers: two nodes in one scalable unit or in two, the same bytes."""
    cluster = dgx_h100(64)
    model = CalibratedCostModel.for_cluster(cluster)
    near = cluster.logical_mesh((2, 8), [*range(8), *range(8, 16)])
    far = cluster.logical_mesh((2, 8), [*range(8), *range(256, 264)])
    inside = model.seconds("all_reduce", near, GIB, (0,))
    across = model.seconds("all_reduce", far, GIB, (0,))
    assert across == pytest.approx(inside, rel=1e-3)
