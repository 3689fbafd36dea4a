"""Predicting the time of collectives and reduction programs on a system (P² §5).

An α-β model at the granularity of links. A step runs every group of a collective at once;
each group's algorithm (as NCCL implements it) is a set of point-to-point transfers, each
routed over the system's interconnects (:meth:`System.route`) onto *resources*: a switch port
per direction (a node's NIC is one port shared by all its GPUs) or a directed ring link, plus
the ports of the inner interconnects it also crosses (``Interconnect.through``). The
step takes ``max over resources (bytes through it / its bandwidth)`` plus the latency of the
longest chain of hops of any group. A program takes the sum of its steps; each device's
buffer size follows the real data movement (ReduceScatter divides it by the group size,
AllGather multiplies it back, Broadcast copies the root's).

Algorithms (NCCL):

* ring: members in topology order (by device id); AllReduce sends ``2(m-1)/m·S`` over every
  ring edge, ReduceScatter / AllGather ``(m-1)/m`` of the larger buffer, half of it each way
  round the ring (NCCL's channels use the reverse ring too, on full-duplex links: an 8-GPU
  NVLink ring is faster than a 2-GPU one in Appendix A, 0.28 s vs 0.32 s); Reduce / Broadcast
  pipeline ``S`` along the ring towards / from the root (m-1 edges).
* tree (AllReduce only; NCCL runs the other collectives on rings): inside a node the members
  form a chain, across nodes the chain heads form NCCL's double binary tree; each tree carries
  half the data up (reduce) and down (broadcast), so every chain link carries ``S`` each way.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.p2.all_to_all import PairLoads, all_to_all_loads
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.system import System

ALGORITHMS = ("ring", "tree")
Edges = list[tuple[int, int, float]]  # (src device, dst device, bytes)


def default_bytes(system: System) -> float:
    """The paper's data per device: 2^29 x nodes float32 values (§4)."""
    return float(2**29 * system.num_nodes * 4)


def _btree(nranks: int, rank: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over ``nranks`` ranks (-1 for the root)."""
    if rank == 0:
        return -1
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= nranks else up


def double_binary_tree(nranks: int) -> tuple[list[int], list[int]]:
    """Parents of every rank in NCCL's two trees (the second shifted or mirrored)."""
    first = [_btree(nranks, r) for r in range(nranks)]
    if nranks % 2:
        second = []
        for r in range(nranks):
            u = _btree(nranks, (r - 1) % nranks)
            second.append(-1 if u == -1 else (u + 1) % nranks)
    else:
        second = []
        for r in range(nranks):
            u = _btree(nranks, nranks - 1 - r)
            second.append(-1 if u == -1 else nranks - 1 - u)
    return first, second


def _depth(parents: list[int]) -> int:
    best = 0
    for r in range(len(parents)):
        d, u = 0, parents[r]
        while u != -1:
            d, u = d + 1, parents[u]
        best = max(best, d)
    return best


class Simulator:
    """Time of collectives and programs on one system, with one NCCL algorithm for
    AllReduce. Memoizes routes and step times (instances are cheap; make one per query)."""

    def __init__(self, system: System, algorithm: str = "ring") -> None:
        if algorithm not in ALGORITHMS:
            raise AlpaError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
        self.system = system
        self.algorithm = algorithm
        self._routes: dict[tuple[int, int], tuple[tuple[tuple[tuple, float], ...], float]] = {}
        self._steps: dict[tuple, float] = {}
        self._pair_loads: dict[tuple, PairLoads] = {}
        self._gpus_per_node = system.num_devices // system.num_nodes

    def _route(self, src: int, dst: int) -> tuple[tuple[tuple[tuple, float], ...], float]:
        """The resources a transfer ``src -> dst`` loads, each with its bandwidth, and the
        latency of its hop."""
        key = (src, dst)
        if key not in self._routes:
            link, a, b, parent = self.system.route(src, dst)
            if link.via:  # through the ports of an outer interconnect (of the common parent)
                outer = self.system.interconnect(link.via)
                port = parent[outer.level] // outer.port_span
                tx = ("tx", outer.name, parent[: outer.level], port)
                rx = ("rx", outer.name, parent[: outer.level], port)
                resources = [(tx, outer.bandwidth), (rx, outer.bandwidth)]
            elif link.topology == "ring":
                resources = [(("ring", link.name, parent, a, b), link.bandwidth)]
            else:
                tx = ("tx", link.name, parent, a // link.port_span)
                rx = ("rx", link.name, parent, b // link.port_span)
                resources = [(tx, link.bandwidth), (rx, link.bandwidth)]
            # the inner interconnects the transfer also crosses at both ends (e.g. a GPU's
            # PCIe path to host memory, where a NIC without GPUDirect RDMA picks data up)
            ca, cb = self.system.coordinates(src), self.system.coordinates(dst)
            for name in link.through:
                inner = self.system.interconnect(name)
                j = inner.level
                up = ("tx", inner.name, ca[:j], ca[j] // inner.port_span)
                down = ("rx", inner.name, cb[:j], cb[j] // inner.port_span)
                resources += [(up, inner.bandwidth), (down, inner.bandwidth)]
            self._routes[key] = (tuple(resources), link.latency)
        return self._routes[key]

    def _group_edges(self, coll: Collective, group: list[int], size: float) -> tuple[Edges, int]:
        """Transfers of one group and its number of sequential hops."""
        m = len(group)
        ring = sorted(group)
        if coll is Collective.ALL_REDUCE and self.algorithm == "tree":
            return self._tree_edges(ring, size)
        if coll in (Collective.REDUCE, Collective.BROADCAST):
            r = ring.index(group[0])
            chain = ring[r:] + ring[:r]  # root first
            if coll is Collective.REDUCE:  # towards the root, ending there
                chain = chain[1:] + chain[:1]
            return [(chain[i], chain[i + 1], size) for i in range(m - 1)], m - 1
        if coll is Collective.ALL_REDUCE:
            per_edge, hops = 2 * (m - 1) / m * size, 2 * (m - 1)
        elif coll is Collective.REDUCE_SCATTER:
            per_edge, hops = (m - 1) / m * size, m - 1
        else:  # AllGather: size is the gathered (output) size
            per_edge, hops = (m - 1) / m * size, m - 1
        # NCCL's channels run the ring in both directions (its search takes the reverse ring
        # for the bandwidth the forward one leaves on full-duplex links): half the data each
        half = per_edge / 2
        edges = [(ring[i], ring[(i + 1) % m], half) for i in range(m)]
        return edges + [(ring[(i + 1) % m], ring[i], half) for i in range(m)], hops

    def _tree_edges(self, ring: list[int], size: float) -> tuple[Edges, int]:
        nodes: dict[int, list[int]] = {}
        for d in ring:
            nodes.setdefault(d // self._gpus_per_node, []).append(d)
        edges: Edges = []
        chain_len = 0
        for members in nodes.values():
            chain_len = max(chain_len, len(members) - 1)
            for a, b in itertools.pairwise(members):
                edges += [(b, a, size), (a, b, size)]
        heads = [members[0] for members in nodes.values()]
        depth = 0
        if len(heads) > 1:
            for parents in double_binary_tree(len(heads)):
                depth = max(depth, _depth(parents))
                for r, u in enumerate(parents):
                    if u != -1:
                        edges += [(heads[r], heads[u], size / 2), (heads[u], heads[r], size / 2)]
        return edges, 2 * (chain_len + depth)

    def step_time(self, coll: Collective, groups: np.ndarray, sizes: np.ndarray) -> float:
        """Seconds for ``coll`` over all ``groups`` at once; ``sizes`` = bytes per device."""
        if groups.shape[1] < 2:
            return 0.0  # single-device groups move nothing
        key = (coll, groups.shape, groups.tobytes(), sizes[groups].tobytes())
        if key in self._steps:
            return self._steps[key]
        loads: dict[tuple, float] = {}
        bandwidth: dict[tuple, float] = {}
        latency = 0.0
        for group in groups.tolist():
            size = float(sizes[group].max())
            if coll is Collective.BROADCAST:
                size = float(sizes[group[0]])
            elif coll is Collective.ALL_GATHER:
                size *= len(group)
            edges, hops = self._group_edges(coll, group, size)
            alpha = 0.0
            for src, dst, nbytes in edges:
                resources, lat = self._route(src, dst)
                alpha = max(alpha, lat)
                for res, bw in resources:
                    loads[res] = loads.get(res, 0.0) + nbytes
                    bandwidth[res] = bw
            latency = max(latency, hops * alpha)
        time = latency + max((loads[r] / bandwidth[r] for r in loads), default=0.0)
        self._steps[key] = time
        return time

    def all_to_all_time(self, groups: np.ndarray, nbytes: float) -> float:
        """Seconds for an all-to-all over all ``groups`` at once, ``nbytes`` per device:
        every member sends ``nbytes / m`` to each of the other ``m - 1`` at once (NCCL's
        point-to-point all-to-all), so the step takes the most loaded resource's time plus
        one hop of the slowest link. The pairs through each resource are counted with
        arrays (:func:`~alpa_ir.p2.all_to_all.all_to_all_loads`), once per set of groups."""
        m = groups.shape[1]
        if m < 2:
            return 0.0
        key = ("all_to_all", groups.shape, groups.tobytes())
        loads = self._pair_loads.get(key)
        if loads is None:
            loads = self._pair_loads[key] = all_to_all_loads(self.system, groups)
        return loads.latency + nbytes / m * loads.pairs_per_bandwidth

    def program_time(self, steps: list[tuple[Collective, np.ndarray]], nbytes: float) -> float:
        """Seconds for a lowered program, every device starting with ``nbytes``."""
        sizes = np.full(self.system.num_devices, float(nbytes))
        total = 0.0
        for coll, groups in steps:
            total += self.step_time(coll, groups, sizes)
            sizes = sizes.copy()
            if coll is Collective.REDUCE_SCATTER:
                sizes[groups] = sizes[groups] / groups.shape[1]
            elif coll is Collective.ALL_GATHER:
                sizes[groups] = sizes[groups] * groups.shape[1]
            elif coll is Collective.BROADCAST:
                sizes[groups] = sizes[groups[:, :1]]
        return total

    def allreduce_time(self, groups: np.ndarray, nbytes: float) -> float:
        """Seconds for one plain AllReduce over ``groups``."""
        return self.program_time([(Collective.ALL_REDUCE, groups)], nbytes)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""

    def ranks(v: list[float]) -> np.ndarray:
        arr = np.asarray(v, dtype=float)
        order = np.argsort(arr, kind="stable")
        out = np.empty(len(arr))
        i = 0
        while i < len(arr):
            j = i
            while j + 1 < len(arr) and arr[order[j + 1]] == arr[order[i]]:
                j += 1
            out[order[i : j + 1]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    if len(xs) < 2 or rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])
