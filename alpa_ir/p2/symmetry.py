"""Device lists that the P² simulator cannot tell apart: one canonical form per class.

The simulator (:mod:`alpa_ir.p2.simulator`) sees devices only through their coordinates in the
system's hierarchy (routes, ports, rings) and through their order (a ring runs its members
sorted by id). At a level whose interconnects are all plain switches (``topology="switch"``,
``port_span`` 1, no ``reach``), the children of one parent are interchangeable: permuting
them is an automorphism of the system, so every route keeps its kind of interconnect and every
port its load. :func:`canonical_devices` renumbers, at each such level and under each parent,
the children a device list uses as ``0, 1, ...`` in their order: a monotone renaming, so every
group keeps its members' order too. Two device lists with the same canonical form then have
the same simulated time for every collective, bit for bit (the same sums in the same order).

Levels with rings, shared ports or reach limits keep their coordinates as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from alpa_ir.p2.system import System


def interchangeable_levels(system: System) -> tuple[bool, ...]:
    """Per level (outermost first): whether its children are interchangeable (module doc)."""
    return tuple(
        all(
            link.topology == "switch" and link.port_span == 1 and not link.reach
            for link in system.interconnects
            if link.level == j
        )
        for j in range(len(system.levels))
    )


def canonical_devices(system: System, devices: Sequence[int]) -> tuple[int, ...]:
    """``devices`` renumbered level by level (module doc): equal results, equal
    simulated times of any collective over the same positions of the list."""
    ids = np.asarray(devices, dtype=np.int64).reshape(-1)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= system.num_devices:
        return tuple(int(d) for d in ids)  # no device of the system: left as it is (and refused)
    cards = system.hierarchy
    digits = []
    rest = ids
    for card in reversed(cards):
        digits.append(rest % card)
        rest = rest // card
    digits.reverse()
    code = np.zeros_like(ids)
    for card, digit, free in zip(cards, digits, interchangeable_levels(system), strict=True):
        if free:
            combined = code * card + digit
            used, inverse = np.unique(combined, return_inverse=True)
            parents = used // card
            first = np.searchsorted(parents, parents, side="left")
            digit = (np.arange(len(used)) - first)[inverse.reshape(-1)]
        code = code * card + digit
    return tuple(code.tolist())


__all__ = ["canonical_devices", "interchangeable_levels"]
