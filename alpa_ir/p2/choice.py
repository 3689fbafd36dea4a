"""Choosing with the simulator: the best program of a reduction, the time of a placement.

Programs are restricted to those one SPMD program can run: every device holds a buffer of
the same size after every step, so a ReduceScatter or AllGather must have every device of
the system in a group, all groups of one size (a Master form leaves devices out, which would
give them a different buffer size). AllReduce, Reduce and Broadcast may leave devices out.
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


def best_program(
    system: System,
    matrix: ParallelismMatrix,
    axes: tuple[int, ...],
    nbytes: float,
    sim: Simulator,
    max_size: int,
) -> tuple[LoweredProgram, float]:
    """The fastest SPMD-executable synthesized program of an all-reduce over mesh ``axes``
    placed with ``matrix``, and its predicted time (ties: the smaller, earlier program)."""
    layout = reduction_layout(matrix, axes, system.level_names)
    hierarchy = synthesis_hierarchy(layout)
    best: tuple[LoweredProgram, float] | None = None
    for program in synthesize(hierarchy, max_size):
        lowered = lower(program, hierarchy, layout)
        if not spmd_executable(lowered, system.num_devices):
            continue
        steps = [(s.collective, s.groups) for s in lowered.steps]
        time = sim.program_time(steps, nbytes)
        if best is None or time < best[1]:
            best = (lowered, time)
    assert best is not None  # one AllReduce over the whole group is always a program
    return best


def axis_groups(matrix: ParallelismMatrix, axes: tuple[int, ...]) -> np.ndarray:
    """The device groups of a collective over mesh ``axes`` (one row per group)."""
    ids = device_array(matrix)
    keep = [a for a in range(ids.ndim) if a not in axes]
    size = int(np.prod([ids.shape[a] for a in axes]))
    return ids.transpose(keep + list(axes)).reshape(-1, size)


def collective_time(
    system: System,
    matrix: ParallelismMatrix,
    coll: MeshCollective,
    sim: Simulator,
    max_size: int,
) -> float:
    """Predicted seconds of one collective: an all-reduce by its best program, the others
    as one step over their groups."""
    groups = axis_groups(matrix, coll.axes)
    if groups.shape[1] < 2:
        return 0.0
    if coll.kind is Collective.ALL_REDUCE:
        return best_program(system, matrix, coll.axes, coll.nbytes, sim, max_size)[1]
    return sim.program_time([(coll.kind, groups)], coll.nbytes)
