"""P² simulator (§5): α-β link model with NCCL ring / tree algorithms and shared links."""

import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.p2.explore import explore
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.simulator import Simulator, default_bytes, double_binary_tree, spearman
from alpa_ir.p2.system import GB, custom_system, gcp_v100_paper, get_system

S = 1e9  # bytes per device
AR, RS, AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER


def groups(*gs: list[int]) -> np.ndarray:
    return np.array(gs)


def test_presets_and_unknown_names() -> None:
    a100 = get_system("gcp-a100-16x4")
    assert a100.hierarchy == (4, 16) and a100.num_devices == 64
    assert get_system("gcp-v100-8x2").hierarchy == (2, 8)
    with pytest.raises(AlpaError, match="gcp-a100-16x2, gcp-a100-16x4, gcp-v100-8x2, gcp-v100-8x4"):
        get_system("dgx")


def test_routes() -> None:
    v100 = get_system("gcp-v100-8x2")
    assert v100.route(0, 1)[0].name == "nvlink" and v100.route(7, 0)[0].name == "nvlink"
    assert v100.route(0, 3)[0].name == "pcie"
    assert v100.route(1, 5)[0].name == "pcie"  # across the two CPUs: through host memory
    assert v100.route(0, 8)[0].name == "nic"
    assert v100.route(0, 8)[0].through == ("pcie",)
    assert gcp_v100_paper(2).route(1, 5)[0].name == "cross-cpu"
    assert get_system("gcp-a100-16x2").route(3, 9)[0].name == "nvswitch"


def test_ring_allreduce_inside_an_a100_node() -> None:
    sim = Simulator(get_system("gcp-a100-16x2"))
    expected = 2 * 15 / 16 * S / (270 * GB) + 2 * 15 * 3e-6
    assert sim.allreduce_time(groups(list(range(16))), S) == pytest.approx(expected)


def test_ring_across_nodes_is_bound_by_the_nic() -> None:
    sim = Simulator(get_system("gcp-a100-16x2"))
    expected = 2 * 31 / 32 * S / (8 * GB) + 2 * 31 * 10e-6  # NIC latency is the largest
    assert sim.allreduce_time(groups(list(range(32))), S) == pytest.approx(expected)


def test_concurrent_groups_share_the_nic() -> None:
    sim = Simulator(get_system("gcp-a100-16x2"))
    one = sim.allreduce_time(groups([0, 16]), S)
    sixteen = sim.allreduce_time(groups(*[[g, 16 + g] for g in range(16)]), S)
    assert sixteen == pytest.approx(16 * one, rel=1e-3)
    # groups inside different nodes' NVSwitches do not interfere
    inside = sim.allreduce_time(groups(list(range(16)), list(range(16, 32))), S)
    assert inside == pytest.approx(sim.allreduce_time(groups(list(range(16))), S))


def test_reducescatter_then_allgather_costs_an_allreduce() -> None:
    sim = Simulator(get_system("gcp-a100-16x2"))
    g = groups(list(range(32)))
    split = sim.program_time([(RS, g), (AG, g)], S)
    assert split == pytest.approx(sim.allreduce_time(g, S), rel=1e-3)


def test_program_time_follows_buffer_sizes() -> None:
    sim = Simulator(get_system("gcp-a100-16x2"))
    local = groups(list(range(16)), list(range(16, 32)))
    across = groups(*[[g, 16 + g] for g in range(16)])
    steps = [(RS, local), (AR, across), (AG, local)]
    expected = (
        sim.program_time([(RS, local)], S)
        + sim.allreduce_time(across, S / 16)
        + sim.program_time([(AG, local)], S / 16)
    )
    assert sim.program_time(steps, S) == pytest.approx(expected)
    assert sim.program_time(steps, S) < sim.allreduce_time(np.array([list(range(32))]), S) / 1.5


def test_nccl_double_binary_tree() -> None:
    first, second = double_binary_tree(4)
    assert first == [-1, 2, 0, 2]
    assert second == [1, 3, 1, -1]  # mirrored: parent(r) = 3 - first-tree parent(3 - r)
    for n in range(1, 10):
        for parents in double_binary_tree(n):
            assert parents.count(-1) == 1
            assert all(-1 <= p < n and p != r for r, p in enumerate(parents))


def test_tree_versus_ring() -> None:
    system = get_system("gcp-a100-16x4")
    ring, tree = Simulator(system, "ring"), Simulator(system, "tree")
    pairs = groups(*[[g, 16 + g] for g in range(16)])
    assert tree.allreduce_time(pairs, S) == pytest.approx(ring.allreduce_time(pairs, S), rel=1e-3)
    fours = groups(*[[g, 16 + g, 32 + g, 48 + g] for g in range(16)])
    assert tree.allreduce_time(fours, S) > ring.allreduce_time(fours, S)  # Appendix A: 89.7 vs 56.1
    spread = groups([0, 8, 16, 24], *[[g, 8 + g, 16 + g, 24 + g] for g in range(1, 8)])
    assert tree.allreduce_time(spread, S) < ring.allreduce_time(spread, S)  # 19.6 vs 28.9
    with pytest.raises(AlpaError, match="unknown algorithm"):
        Simulator(system, "butterfly")


def test_v100_ring_closes_over_pcie_and_tree_chains_over_nvlink() -> None:
    system = get_system("gcp-v100-8x2")
    quads = groups([0, 1, 2, 3], [4, 5, 6, 7])
    ring = Simulator(system, "ring").allreduce_time(quads, S)
    tree = Simulator(system, "tree").allreduce_time(quads, S)
    # the closing edge 3 <-> 0 (both ring directions, 3/4 S each) goes up and down CPU 0's uplink
    assert ring == pytest.approx(1.5 * S / (7.5 * GB), rel=1e-2)
    assert tree < ring / 3  # Appendix A: 2.96 s vs 0.43 s


def test_ring_runs_both_directions() -> None:
    """NCCL's channels use the reverse ring as well: on the NVLink ring an 8-GPU AllReduce
    (7/8 S per directed link) beats a 2-GPU one (S each way), as in Appendix A (0.28 s vs
    0.32 s); on switches the per-port load is that of a one-way ring."""
    sim = Simulator(get_system("gcp-v100-8x2"))
    eight = sim.allreduce_time(groups(list(range(8))), S)
    pairs = sim.allreduce_time(groups([0, 1], [2, 3], [4, 5], [6, 7]), S)
    assert eight < pairs
    assert eight == pytest.approx(7 / 8 * S / (135 * GB) + 14 * 3e-6, rel=1e-6)


def test_v100_host_memory_paths() -> None:
    """Non-NVLink and network traffic of a V100 node crosses its CPUs' PCIe uplinks."""
    sim = Simulator(get_system("gcp-v100-8x2"))
    # one cross-CPU pair: S up CPU 0's uplink (and S down it the other way)
    assert sim.allreduce_time(groups([0, 4]), S) == pytest.approx(S / (7.5 * GB), rel=1e-2)
    # a same-CPU pair goes up and down its CPU's uplink both ways (2 S each direction) and
    # shares it with a cross-CPU pair; pairs of different CPUs do not interfere
    assert sim.allreduce_time(groups([0, 4], [1, 3]), S) == pytest.approx(
        3 * S / (7.5 * GB), rel=1e-2
    )
    assert sim.allreduce_time(groups([0, 2], [5, 7]), S) == pytest.approx(
        2 * S / (7.5 * GB), rel=1e-2
    )
    # network traffic is staged in host memory too: it adds to the CPU uplink's load
    assert sim.allreduce_time(groups([0, 8]), S) == pytest.approx(S / (7.5 * GB), rel=1e-2)
    assert sim.allreduce_time(groups([0, 8], [1, 5]), S) == pytest.approx(
        2 * S / (7.5 * GB), rel=1e-2
    )
    # the NIC binds when the node's two CPUs both send over the network
    nic = groups(*[[g, 8 + g] for g in range(8)])
    assert sim.allreduce_time(nic, S) == pytest.approx(8 * S / (8 * GB), rel=1e-2)


def test_paper_v100_model_sends_cross_cpu_traffic_through_the_nic() -> None:
    sim = Simulator(gcp_v100_paper(2))
    cross_node = sim.allreduce_time(groups([0, 8]), S)
    # both directions of a cross-CPU pair leave and re-enter the node through its NIC
    assert sim.allreduce_time(groups([0, 4]), S) == pytest.approx(2 * cross_node, rel=1e-2)
    # and compete with the node's network traffic
    both = sim.allreduce_time(groups([0, 4], [1, 9]), S)
    assert both == pytest.approx(3 * cross_node, rel=1e-2)


def test_default_bytes_are_the_papers() -> None:
    assert default_bytes(get_system("gcp-a100-16x4")) == 2**29 * 4 * 4


def test_ranking_puts_intra_node_reductions_first() -> None:
    results = explore(get_system("gcp-a100-16x4"), (4, 16), (0,))
    assert [r.matrix.rows for r in results] == [
        ((1, 4), (4, 4)),
        ((2, 2), (2, 8)),
        ((4, 1), (1, 16)),
    ]
    for r in results:
        times = [p.time for p in r.programs]
        assert times == sorted(times) and r.best_time == times[0]
        assert r.best_time <= r.allreduce_time * (1 + 1e-9)


def test_custom_system_bandwidths() -> None:
    fast = custom_system((2, 4), bandwidths=(100 * GB, 100 * GB))
    slow = custom_system((2, 4))
    g = groups(list(range(8)))
    assert Simulator(fast).allreduce_time(g, S) < Simulator(slow).allreduce_time(g, S)
    with pytest.raises(AlpaError):
        custom_system((2, 4), names=("a",))


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(
        np.corrcoef([0.5, 0.5, 2], [0, 1, 2])[0, 1]
    )
