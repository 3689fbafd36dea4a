"""The all-to-all's resource loads counted with arrays equal the pair-by-pair sum."""

from __future__ import annotations

import numpy as np
import pytest

from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.p2.all_to_all import all_to_all_loads
from alpa_ir.p2.calibrated import system_of_cluster
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.system import System, custom_system, gcp_a100, gcp_v100, gcp_v100_paper


def _pairwise_seconds(system: System, groups: np.ndarray, nbytes: float) -> float:
    """The simulator's all-to-all as it was priced before: every ordered pair visited."""
    sim = Simulator(system)
    m = groups.shape[1]
    loads: dict[tuple, float] = {}
    bandwidth: dict[tuple, float] = {}
    latency = 0.0
    for group in groups.tolist():
        for src in group:
            for dst in group:
                if src == dst:
                    continue
                resources, lat = sim._route(src, dst)
                latency = max(latency, lat)
                for res, bw in resources:
                    loads[res] = loads.get(res, 0.0) + nbytes / m
                    bandwidth[res] = bw
    return latency + max(loads[r] / bandwidth[r] for r in loads)


def _groups(n: int, shape: tuple[int, ...], axes: tuple[int, ...], seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).permutation(n).reshape(shape)
    keep = [a for a in range(ids.ndim) if a not in axes]
    size = int(np.prod([shape[a] for a in axes]))
    return ids.transpose(keep + list(axes)).reshape(-1, size)


SYSTEMS = {
    "a100x2 (switches)": gcp_a100(2),
    "v100x2 (nvlink ring, host pcie)": gcp_v100(2),
    "v100x2 paper (reach, via)": gcp_v100_paper(2),
    "custom 2x4": custom_system((2, 4)),
    "dgx-a100 64 (tiers)": system_of_cluster(get_cluster("dgx-a100", num_devices=64)),
}


@pytest.mark.parametrize("name", sorted(SYSTEMS))
@pytest.mark.parametrize("seed", range(3))
def test_counted_equals_pair_by_pair(name: str, seed: int) -> None:
    system = SYSTEMS[name]
    n = system.num_devices
    ordered = np.arange(n)
    cases = [ordered.reshape(1, n), ordered.reshape(-1, 2), ordered.reshape(2, -1).T.copy()]
    cases.append(_groups(n, (2, n // 4, 2), (0, 2), seed))
    cases.append(_groups(n, (n // 2, 2), (0,), seed))
    for groups in cases:
        for nbytes in (0.0, 3e6, 2.0**30):
            counted = Simulator(system).all_to_all_time(groups, nbytes)
            assert counted == pytest.approx(_pairwise_seconds(system, groups, nbytes), rel=1e-12)


def test_chunks_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting in chunks smaller than a group's pairs gives the same loads."""
    import alpa_ir.p2.all_to_all as module

    system = SYSTEMS["v100x2 (nvlink ring, host pcie)"]
    groups = np.arange(16).reshape(2, 8)
    whole = all_to_all_loads(system, groups)
    monkeypatch.setattr(module, "PAIRS_PER_CHUNK", 5)
    assert all_to_all_loads(system, groups) == whole
    assert whole.pairs_per_bandwidth > 0 and whole.latency > 0


def test_single_device_groups_move_nothing() -> None:
    loads = all_to_all_loads(gcp_a100(1), np.arange(16).reshape(16, 1))
    assert loads.pairs_per_bandwidth == 0.0 and loads.latency == 0.0
    assert Simulator(gcp_a100(1)).all_to_all_time(np.arange(16).reshape(16, 1), 1e6) == 0.0
