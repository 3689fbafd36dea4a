"""Device lists with one canonical form simulate to the same seconds, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.p2.calibrated import CalibratedCostModel, system_of_cluster
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.symmetry import canonical_devices, interchangeable_levels
from alpa_ir.p2.system import System, custom_system, gcp_a100, gcp_v100, gcp_v100_paper

SYSTEMS = {
    "a100x4 (switches)": gcp_a100(4),
    "v100x4 (nvlink ring, host pcie)": gcp_v100(4),
    "v100x4 paper (reach, via)": gcp_v100_paper(4),
    "custom 4x4": custom_system((4, 4)),
    "dgx-a100 320 (tiers)": system_of_cluster(get_cluster("dgx-a100", num_devices=320)),
}


def _times(system: System, groups: np.ndarray) -> list[float]:
    sim = Simulator(system)
    times = [sim.all_to_all_time(groups, 3e6)]
    for coll in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        times += [sim.program_time([(coll, groups)], nbytes) for nbytes in (0.0, 3e6)]
    tree = Simulator(system, "tree")
    return [*times, tree.program_time([(Collective.ALL_REDUCE, groups)], 3e6)]


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_canonical_devices_simulate_alike(name: str) -> None:
    system = SYSTEMS[name]
    n = system.num_devices
    rng = np.random.default_rng(7)
    for size, width in ((8, 2), (8, 4), (16, 8), (12, 3)):
        devices = rng.choice(n, size=size, replace=False)
        canonical = np.array(canonical_devices(system, devices.tolist()))
        assert canonical.max() < n and len(set(canonical.tolist())) == size
        assert canonical_devices(system, canonical.tolist()) == tuple(canonical.tolist())
        for shape in ((size // width, width), (width, size // width)):
            rows, cols = devices.reshape(shape), canonical.reshape(shape)
            for axis in (0, 1):
                raw = rows.T.copy() if axis == 0 else rows
                same = cols.T.copy() if axis == 0 else cols
                assert _times(system, raw) == _times(system, same)


def test_only_plain_switch_levels_are_renumbered() -> None:
    assert interchangeable_levels(gcp_a100(2)) == (True, True)
    assert interchangeable_levels(gcp_v100(2)) == (True, False)  # ring, shared PCIe uplinks
    v100 = gcp_v100(2)
    # GPUs 0 and 1 are ring neighbours, 0 and 2 are not: never one class
    assert canonical_devices(v100, [8, 10]) == (0, 2)
    assert canonical_devices(v100, [8, 9]) == (0, 1)
    assert _times(v100, np.array([[0, 2]])) != _times(v100, np.array([[0, 1]]))
    # ids outside the system keep their numbers (the simulator refuses them)
    assert canonical_devices(v100, [8, 40]) == (8, 40)


def test_calibrated_lines_shared_by_stage_places() -> None:
    """The replicas' all-reduce of a stage at two places of a pipeline (dgx-a100,
    4 replicas of a 10-node pipeline, units of 20 nodes): one class where the two
    places see the units alike, the same line as a fresh model's."""
    cluster = get_cluster("dgx-a100", num_devices=320)
    width = 80

    def mesh(first: int) -> object:
        grid = [r * width + d for r in range(4) for d in range(first, first + 16)]
        return cluster.logical_mesh((4, 16), grid)

    shared = CalibratedCostModel.for_cluster(cluster)
    lines = [shared.alpha_beta("all_reduce", mesh(first), (0,)) for first in (0, 16, 32)]
    fresh = [
        CalibratedCostModel.for_cluster(cluster).alpha_beta("all_reduce", mesh(first), (0,))
        for first in (0, 16, 32)
    ]
    assert lines == fresh
    system = shared.sim.system
    assert canonical_devices(system, mesh(0).devices) == canonical_devices(system, mesh(16).devices)
    assert len([key for key in shared._lines if key[0] == "canonical"]) <= 2
