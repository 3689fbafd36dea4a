"""Hierarchical systems for P² (§2, §5): levels with cardinalities and the interconnects joining them.

A system is a hierarchy ``H = [h0 .. hn]`` of named levels (e.g. ``[("node", 4), ("gpu", 16)]``).
A device is identified by its coordinates ``(c0 .. cn)``, ``0 <= cj < hj``; its id is their
mixed-radix number with level 0 the most significant digit, so the devices of one node are
consecutive ids.

An interconnect joins the *children* of one level: interconnect at level ``j`` carries the
traffic between two devices whose first differing coordinate is ``cj`` (for level 0, the node
level, that is the network between nodes; for the GPU level, the links inside a node). Several
interconnects may serve one level; a transfer takes the first one (in the listed order) that
connects the two children:

* ``topology="switch"``: any two children are connected; every *port* has ``bandwidth`` bytes/s
  in each direction. ``port_span`` consecutive children share one port: a NIC is a port of the
  node (its GPUs share it automatically, since they are below it), an NVSwitch gives every GPU
  its own port (``port_span=1``), a CPU's PCIe uplink one port per CPU domain (``port_span=4``).
* ``topology="ring"``: only ring-adjacent children (``c`` and ``c ± 1 mod hj``) are connected,
  each directed link with ``bandwidth`` (the V100 NVLink ring).

``reach`` restricts a switch to children in the same block of ``reach`` consecutive children;
0 means the whole level. ``via`` names an interconnect of an outer level whose ports the traffic
passes through instead of ports of its own: the paper models the link between a V100 node's two
CPUs as the node's NIC (Figure 9b, :func:`gcp_v100_paper`). ``through`` names interconnects of
inner levels whose ports the traffic *also* crosses at both ends: without GPUDirect RDMA a
NIC's data is staged in host memory, so it crosses the sending GPU's PCIe path to its CPU
(that port's tx side) and the receiving GPU's (rx side) as well as the NICs.

The V100 node (:func:`gcp_v100`) is modelled as measured in the paper's Appendix A rather than
as its Figure 9b: GPUs that are not NVLink-ring neighbours exchange data through host memory
(NCCL's shared-memory transport: in a VM the GPUs' PCIe peer-to-peer traffic is not available),
so every such transfer, inside one CPU's PCIe domain or across the two CPUs, loads the PCIe
uplink of the sender's CPU (up) and of the receiver's CPU (down); network traffic loads them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from alpa_ir.errors import AlpaError

GB = 1e9


@dataclass(frozen=True)
class Level:
    """One level of the hardware hierarchy: a name and how many children each parent has."""

    name: str
    cardinality: int


@dataclass(frozen=True)
class Interconnect:
    """A link technology joining the children of hierarchy level ``level`` (see module doc)."""

    name: str
    level: int
    bandwidth: float  # bytes/s per direction, per port (switch) or per link (ring)
    latency: float  # seconds per message hop
    topology: str = "switch"  # "switch" | "ring"
    port_span: int = 1
    reach: int = 0
    via: str = ""
    through: tuple[str, ...] = ()

    def connects(self, child_a: int, child_b: int, cardinality: int) -> bool:
        """Whether this interconnect joins children ``child_a`` and ``child_b`` of its level."""
        if self.topology == "ring":
            return (child_a - child_b) % cardinality in (1, cardinality - 1)
        if self.reach:
            return child_a // self.reach == child_b // self.reach
        return True


@dataclass(frozen=True)
class System:
    """A hierarchical system: its levels (outermost first) and its interconnects."""

    name: str
    levels: tuple[Level, ...]
    interconnects: tuple[Interconnect, ...]

    @property
    def hierarchy(self) -> tuple[int, ...]:
        """The cardinalities ``H = [h0 .. hn]``."""
        return tuple(level.cardinality for level in self.levels)

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.levels)

    @property
    def num_devices(self) -> int:
        return math.prod(self.hierarchy)

    @property
    def num_nodes(self) -> int:
        """Devices of level 0 (e.g. nodes of a cluster)."""
        return self.hierarchy[0]

    def coordinates(self, device: int) -> tuple[int, ...]:
        """Mixed-radix coordinates of a device id, level 0 first."""
        coords = []
        for card in reversed(self.hierarchy):
            coords.append(device % card)
            device //= card
        return tuple(reversed(coords))

    def interconnect(self, name: str) -> Interconnect:
        """The interconnect called ``name``."""
        for link in self.interconnects:
            if link.name == name:
                return link
        raise AlpaError(f"system {self.name!r}: no interconnect {name!r}")

    def route(self, src: int, dst: int) -> tuple[Interconnect, int, int, tuple[int, ...]]:
        """The interconnect a transfer ``src -> dst`` uses, the two children it joins and
        the coordinates of their common parent (the levels above the first difference)."""
        if src == dst:
            raise AlpaError(f"system {self.name!r}: no route from device {src} to itself")
        a, b = self.coordinates(src), self.coordinates(dst)
        level = next(j for j in range(len(a)) if a[j] != b[j])
        card = self.hierarchy[level]
        for link in self.interconnects:
            if link.level == level and link.connects(a[level], b[level], card):
                return link, a[level], b[level], a[:level]
        raise AlpaError(f"system {self.name!r}: no interconnect joins devices {src} and {dst}")


def _validate(system: System) -> System:
    names = {link.name: link for link in system.interconnects}
    for link in system.interconnects:
        for name in link.through:
            if name not in names or names[name].level <= link.level:
                raise AlpaError(
                    f"system {system.name!r}: {link.name!r} goes through no inner interconnect"
                )
        if link.via and (link.via not in names or names[link.via].level >= link.level):
            raise AlpaError(f"system {system.name!r}: {link.name!r} goes via no outer interconnect")
    for level in system.levels:
        if level.cardinality < 1:
            raise AlpaError(f"system {system.name!r}: level {level.name!r} has cardinality < 1")
    for link in system.interconnects:
        if not 0 <= link.level < len(system.levels):
            raise AlpaError(f"system {system.name!r}: interconnect {link.name!r} has a bad level")
        if link.bandwidth <= 0 or link.latency < 0 or link.port_span < 1:
            raise AlpaError(f"system {system.name!r}: interconnect {link.name!r} is malformed")
    return system


# §5 assumptions: 100 Gbps NIC used at 60 % ~ 8 GB/s per node (shared by its GPUs); V100 NVLink
# ring 135 GB/s per direction (90 % of 150); A100 NVSwitch 270 GB/s per direction (90 % of 300).
# Latencies are typical NCCL per-hop values; at the paper's data sizes (GBs per device) they do
# not matter.
NIC = Interconnect("nic", level=0, bandwidth=8 * GB, latency=10e-6)
NVSWITCH = Interconnect("nvswitch", level=1, bandwidth=270 * GB, latency=3e-6)
NVLINK_RING = Interconnect("nvlink", level=1, bandwidth=135 * GB, latency=3e-6, topology="ring")

# V100 node, traffic between GPUs that are not NVLink-ring neighbours, and network traffic:
# staged through host memory (no PCIe peer-to-peer between the VM's GPUs, no GPUDirect RDMA;
# NCCL's SHM and socket transports) over the PCIe Gen3 x16 uplink of each CPU's domain of 4
# GPUs, 15.75 GB/s nominal per direction, of which GPU loads and stores to host memory get about
# half. Appendix A bounds it against the 8 GB/s NIC (S = bytes per GPU): 4 cross-CPU pairs per
# node put 4 S on a CPU uplink and take longer (tree 8.44 s) than 4 cross-node tree heads put on
# the NIC (7.42 s), so bandwidth < 8 GB/s; two cross-CPU 4-GPU rings per node put 6 S on an
# uplink and finish (ring 12.55 s, tree 13.01 s) before 8 cross-node pairs put 8 S on the NIC
# (14.53 s, 14.55 s), so bandwidth > 6 GB/s. A 4-GPU ring closing over a same-CPU pair (2.96 s)
# shows that pair is no faster than that: not a 32 GB/s PCIe switch (Figure 9b).
V100_HOST_PCIE = Interconnect("pcie", level=1, bandwidth=7.5 * GB, latency=5e-6, port_span=4)
V100_NIC = Interconnect("nic", level=0, bandwidth=8 * GB, latency=10e-6, through=("pcie",))

# The paper's Figure 9b V100 model: PCIe switches of 32 GB/s inside each CPU's domain, the link
# between the two CPUs modelled as the node's NIC.
PAPER_PCIE = Interconnect("pcie", level=1, bandwidth=32 * GB, latency=5e-6, port_span=4, reach=4)
PAPER_CROSS_CPU = Interconnect("cross-cpu", level=1, bandwidth=8 * GB, latency=10e-6, via="nic")


def gcp_a100(nodes: int) -> System:
    """GCP A100 nodes: 16 GPUs on one NVSwitch, one NIC per node (Figure 9a)."""
    levels = (Level("node", nodes), Level("gpu", 16))
    return _validate(System(f"gcp-a100-16x{nodes}", levels, (NIC, NVSWITCH)))


def gcp_v100(nodes: int) -> System:
    """GCP V100 nodes: 8 GPUs on an NVLink ring, two CPUs of 4 GPUs each; the other GPU pairs
    and the NIC reach each other through host memory over each CPU's PCIe uplink (module doc)."""
    levels = (Level("node", nodes), Level("gpu", 8))
    links = (V100_NIC, NVLINK_RING, V100_HOST_PCIE)
    return _validate(System(f"gcp-v100-8x{nodes}", levels, links))


def gcp_v100_paper(nodes: int) -> System:
    """The paper's model of the GCP V100 nodes (Figure 9b): NVLink ring, a 32 GB/s PCIe switch
    per CPU, the link between the CPUs as the node's NIC. Ranks the Appendix A AllReduce times
    worse than :func:`gcp_v100`; kept for comparison."""
    levels = (Level("node", nodes), Level("gpu", 8))
    links = (NIC, NVLINK_RING, PAPER_PCIE, PAPER_CROSS_CPU)
    return _validate(System(f"gcp-v100-8x{nodes}", levels, links))


PRESETS = {
    "gcp-a100-16x2": lambda: gcp_a100(2),
    "gcp-a100-16x4": lambda: gcp_a100(4),
    "gcp-v100-8x2": lambda: gcp_v100(2),
    "gcp-v100-8x4": lambda: gcp_v100(4),
}


def get_system(name: str) -> System:
    """A preset system by name, or ``custom-AxBx..`` for :func:`custom_system` with these
    cardinalities (its own name); an unknown name raises AlpaError listing the known ones."""
    if name not in PRESETS:
        cards = name.removeprefix("custom-").split("x")
        if name.startswith("custom-") and all(c.isdigit() and int(c) > 0 for c in cards):
            return custom_system([int(c) for c in cards])
        known = ", ".join(sorted(PRESETS))
        raise AlpaError(f"unknown system {name!r}; known: {known} (or custom-AxB..)")
    return PRESETS[name]()


def custom_system(
    cardinalities: tuple[int, ...] | list[int],
    names: tuple[str, ...] | list[str] | None = None,
    bandwidths: tuple[float, ...] | list[float] | None = None,
    latency: float = 5e-6,
) -> System:
    """A system with one switched interconnect per level (one port per child), for tests and
    what-if studies. Default bandwidths grow 10x per level inward, from 10 GB/s."""
    cards = tuple(int(c) for c in cardinalities)
    names = tuple(names) if names else tuple(f"l{j}" for j in range(len(cards)))
    if len(names) != len(cards):
        raise AlpaError("custom system: as many level names as cardinalities are needed")
    bws = tuple(bandwidths) if bandwidths else tuple(10 * GB * 10**j for j in range(len(cards)))
    if len(bws) != len(cards):
        raise AlpaError("custom system: as many bandwidths as levels are needed")
    levels = tuple(Level(n, c) for n, c in zip(names, cards, strict=True))
    links = tuple(
        Interconnect(f"link{j}", level=j, bandwidth=bw, latency=latency) for j, bw in enumerate(bws)
    )
    label = "x".join(str(c) for c in cards)
    return _validate(System(f"custom-{label}", levels, links))
