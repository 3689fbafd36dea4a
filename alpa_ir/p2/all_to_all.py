"""The all-to-all's load on every resource of a system, counted with arrays (P² §5).

In NCCL's point-to-point all-to-all every member of a group sends ``nbytes / m`` to each of
the other ``m - 1`` members at once, so a resource (a switch port per direction, a directed
ring link, the ports of the inner interconnects a transfer also crosses) carries
``nbytes / m`` times the number of ordered pairs routed through it. This module counts those
pairs for all groups at once without visiting them one by one: a pair's interconnect follows
from the first hierarchy level where the two devices' coordinates differ (the first listed
interconnect of that level that connects them, as :meth:`System.route` chooses), and each
resource is an integer index within its interconnect's ports (the parent's mixed-radix
prefix and the port, or the ring link's two ends). The result equals the pair-by-pair sum
of :class:`~alpa_ir.p2.simulator.Simulator` (tests) in O(pairs) array work: a 512-device
axis is 262,144 pairs, counted in milliseconds rather than seconds of Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.p2.system import Interconnect, System

PAIRS_PER_CHUNK = 1 << 21
"""Ordered pairs counted at once (bounds the arrays of a large axis: 16 bytes a pair each)."""


@dataclass(frozen=True)
class PairLoads:
    """Pairs routed through the busiest resource of each kind, per unit of bandwidth: the
    all-to-all moves ``nbytes / m`` per pair, so its time is ``latency + nbytes / m ·
    pairs_per_bandwidth``."""

    pairs_per_bandwidth: float
    """max over resources of (ordered pairs through it) / (its bandwidth in bytes/s)."""
    latency: float
    """The slowest hop's latency of any pair (seconds)."""


class _Counts:
    """Pair counts per resource space ``(kind, interconnect)``, kept as integer arrays."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.hierarchy = np.array(system.hierarchy, dtype=np.int64)
        self.counts: dict[tuple[str, str], np.ndarray] = {}
        self.bandwidth: dict[tuple[str, str], float] = {}

    def _below(self, level: int) -> int:
        return int(math.prod(self.system.hierarchy[level + 1 :]))

    def port_index(self, link: Interconnect, devices: np.ndarray) -> tuple[np.ndarray, int]:
        """Each device's port of ``link`` (its parent's prefix and its child's port) and the
        number of such ports in the system."""
        below = self._below(link.level)
        card = self.system.hierarchy[link.level]
        child = (devices // below) % card
        prefix = devices // (below * card)
        ports = -(-card // link.port_span)
        parents = self.system.num_devices // (below * card)
        return prefix * ports + child // link.port_span, parents * ports

    def add(self, kind: str, link: Interconnect, keys: np.ndarray, size: int) -> None:
        space = (kind, link.name)
        counted = np.bincount(keys, minlength=size)
        if space in self.counts:
            self.counts[space] += counted
        else:
            self.counts[space] = counted
        self.bandwidth[space] = link.bandwidth

    def add_port(self, kind: str, link: Interconnect, devices: np.ndarray) -> None:
        keys, size = self.port_index(link, devices)
        self.add(kind, link, keys, size)

    def most_loaded(self) -> float:
        return max(
            (float(c.max()) / self.bandwidth[s] for s, c in self.counts.items() if c.size),
            default=0.0,
        )


def _first_difference(system: System, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The outermost level where each pair's coordinates differ."""
    level = np.full(src.shape, -1, dtype=np.int64)
    below = system.num_devices
    for j, card in enumerate(system.hierarchy):
        below //= card
        differs = (src // below) % card != (dst // below) % card
        level[(level == -1) & differs] = j
    return level


def _choose_links(system: System, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Each pair's interconnect (index into ``system.interconnects``), as ``route`` picks it."""
    level = _first_difference(system, src, dst)
    chosen = np.full(src.shape, -1, dtype=np.int64)
    for i, link in enumerate(system.interconnects):
        on = (chosen == -1) & (level == link.level)
        if not on.any():
            continue
        card = system.hierarchy[link.level]
        below = int(math.prod(system.hierarchy[link.level + 1 :]))
        a, b = (src // below) % card, (dst // below) % card
        if link.topology == "ring":
            on &= np.isin((a - b) % card, (1, card - 1))
        elif link.reach:
            on &= a // link.reach == b // link.reach
        chosen[on] = i
    if (chosen == -1).any():
        k = int(np.argmax(chosen == -1))
        raise AlpaError(
            f"system {system.name!r}: no interconnect joins devices {int(src[k])} and {int(dst[k])}"
        )
    return chosen


def _count_pairs(counts: _Counts, src: np.ndarray, dst: np.ndarray) -> float:
    """Add the resources of pairs ``src -> dst`` to ``counts``; their slowest hop."""
    system = counts.system
    chosen = _choose_links(system, src, dst)
    latency = 0.0
    for i, link in enumerate(system.interconnects):
        on = chosen == i
        if not on.any():
            continue
        latency = max(latency, link.latency)
        s, d = src[on], dst[on]
        if link.via:  # the ports of the outer interconnect, at the common parent's child
            outer = system.interconnect(link.via)
            counts.add_port("tx", outer, s)
            counts.add_port("rx", outer, s)
        elif link.topology == "ring":
            card = system.hierarchy[link.level]
            below = int(math.prod(system.hierarchy[link.level + 1 :]))
            a, b = (s // below) % card, (d // below) % card
            prefix = s // (below * card)
            parents = system.num_devices // (below * card)
            counts.add("ring", link, (prefix * card + a) * card + b, parents * card * card)
        else:
            counts.add_port("tx", link, s)
            counts.add_port("rx", link, d)
        for name in link.through:
            inner = system.interconnect(name)
            counts.add_port("tx", inner, s)
            counts.add_port("rx", inner, d)
    return latency


def all_to_all_loads(system: System, groups: np.ndarray) -> PairLoads:
    """The busiest resource's pairs per bandwidth and the slowest hop of an all-to-all over
    every row of ``groups`` at once (module doc); rows of fewer than 2 devices move nothing."""
    groups = np.asarray(groups, dtype=np.int64)
    count, m = groups.shape
    if m < 2 or count == 0:
        return PairLoads(0.0, 0.0)
    counts = _Counts(system)
    latency = 0.0
    per_group = m * m
    rows = max(1, PAIRS_PER_CHUNK // per_group)
    sources = max(1, PAIRS_PER_CHUNK // m) if per_group > PAIRS_PER_CHUNK else m
    for g in range(0, count, rows):
        block = groups[g : g + rows]
        for s0 in range(0, m, sources):
            shape = (len(block), min(sources, m - s0), m)
            src = np.broadcast_to(block[:, s0 : s0 + sources, None], shape)
            dst = np.broadcast_to(block[:, None, :], shape)
            keep = src != dst
            latency = max(latency, _count_pairs(counts, src[keep], dst[keep]))
    return PairLoads(counts.most_loaded(), latency)


__all__ = ["PAIRS_PER_CHUNK", "PairLoads", "all_to_all_loads"]
