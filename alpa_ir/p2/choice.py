"""Choosing with the simulator: the best program of a reduction, the time of a placement.

Every synthesized program is a candidate, priced as the SPMD executor runs it
(``backends/program_collectives.py``). When every device keeps one buffer size through the
program (a ReduceScatter or AllGather has every device of the system in a group, all groups
of one size; AllReduce, Reduce and Broadcast may leave devices out), the executor runs its
steps as they are. The others (e.g. a Master form leaves devices out of a ReduceScatter,
which would give them a different buffer size) run on full-size buffers, every
ReduceScatter and AllGather as an all-reduce of the whole buffer over its groups, and are
priced so: more than the program's real traffic, which P²'s own ranking (``explore``) prices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.p2.explore import synthesis_hierarchy
from alpa_ir.p2.ir_collectives import MeshCollective
from alpa_ir.p2.lowering import LoweredProgram, lower
from alpa_ir.p2.placement import ParallelismMatrix, device_array, reduction_layout
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.synthesis import DEFAULT_MAX_SIZE, MAX_SIZE_LIMIT, synthesize
from alpa_ir.p2.system import System

_RESHAPING = (Collective.REDUCE_SCATTER, Collective.ALL_GATHER)


@dataclass(frozen=True)
class ChoiceOptions:
    max_size: int = DEFAULT_MAX_SIZE
    algorithm: str = "ring"

    def check(self, pass_name: str) -> None:
        if not 1 <= self.max_size <= MAX_SIZE_LIMIT:
            raise AlpaError(
                f"{pass_name}: max-size {self.max_size} must be between 1 and {MAX_SIZE_LIMIT}"
            )


def spmd_executable(lowered: LoweredProgram, num_devices: int) -> bool:
    """Whether every device keeps one buffer size through the program (see module doc)."""
    for step in lowered.steps:
        if step.collective in _RESHAPING and step.groups.size != num_devices:
            return False
    return True


def executed_steps(
    lowered: LoweredProgram, num_devices: int
) -> list[tuple[Collective, np.ndarray]]:
    """The program's steps as the SPMD executor runs them (see the module doc)."""
    steps = [(s.collective, s.groups) for s in lowered.steps]
    if spmd_executable(lowered, num_devices):
        return steps
    return [(Collective.ALL_REDUCE if c in _RESHAPING else c, g) for c, g in steps]


class ReductionPricer:
    """The fastest synthesized program of an all-reduce over some mesh axes of a placed
    mesh, as executed (:func:`executed_steps`), for any bytes per device.

    A program's predicted time is affine in the bytes per device: every device starts with
    the same size, every step's latency is fixed and its loads scale with the sizes. So each
    (matrix, axes) pair is synthesized, lowered and simulated once (at 0 and 1 byte), and a
    query is a minimum over ``a + b * bytes``. Caches live in the instance: make one per use.
    """

    def __init__(self, system: System, algorithm: str, max_size: int) -> None:
        self.system = system
        self.sim = Simulator(system, algorithm)
        self.max_size = max_size
        self._lines: dict[tuple, list[tuple[LoweredProgram, float, float]]] = {}

    def programs(
        self, matrix: ParallelismMatrix, axes: tuple[int, ...]
    ) -> list[tuple[LoweredProgram, float, float]]:
        """Every synthesized program with its executed time ``fixed + per_byte * bytes``, as
        ``(program, fixed, per_byte)``."""
        key = (matrix, axes)
        if key not in self._lines:
            layout = reduction_layout(matrix, axes, self.system.level_names)
            hierarchy = synthesis_hierarchy(layout)
            lines = []
            for program in synthesize(hierarchy, self.max_size):
                lowered = lower(program, hierarchy, layout)
                steps = executed_steps(lowered, self.system.num_devices)
                fixed = self.sim.program_time(steps, 0.0)
                lines.append((lowered, fixed, self.sim.program_time(steps, 1.0) - fixed))
            self._lines[key] = lines
        return self._lines[key]

    def best(
        self, matrix: ParallelismMatrix, axes: tuple[int, ...], nbytes: float
    ) -> tuple[LoweredProgram, float]:
        """The fastest program and its predicted time (ties: the smaller, earlier one)."""
        best: tuple[LoweredProgram, float] | None = None
        for lowered, fixed, per_byte in self.programs(matrix, tuple(axes)):
            time = fixed + per_byte * nbytes
            if best is None or time < best[1]:
                best = (lowered, time)
        assert best is not None  # one AllReduce over the whole group is always a program
        return best

    def collective_time(self, matrix: ParallelismMatrix, coll: MeshCollective) -> float:
        """Predicted seconds of one collective: an all-reduce by its best program, the others
        as one step over their groups."""
        groups = axis_groups(matrix, coll.axes)
        if groups.shape[1] < 2:
            return 0.0
        if coll.kind is Collective.ALL_REDUCE:
            return self.best(matrix, coll.axes, coll.nbytes)[1]
        return self.sim.program_time([(coll.kind, groups)], coll.nbytes)


def axis_groups(matrix: ParallelismMatrix, axes: tuple[int, ...]) -> np.ndarray:
    """The device groups of a collective over mesh ``axes`` (one row per group)."""
    ids = device_array(matrix)
    keep = [a for a in range(ids.ndim) if a not in axes]
    size = int(np.prod([ids.shape[a] for a in axes]))
    return ids.transpose(keep + list(axes)).reshape(-1, size)
