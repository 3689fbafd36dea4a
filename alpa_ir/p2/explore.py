"""P² end to end: enumerate placements, synthesize and lower reductions, simulate, rank.

This is the library entry point behind ``alpa-p2`` and the benchmarks: for a system,
parallelism axes and reduction axes it returns every parallelism matrix with its synthesized
programs, each lowered to the whole system and timed by the simulator, fastest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alpa_ir.errors import AlpaError
from alpa_ir.p2.dsl import SynthesisHierarchy
from alpa_ir.p2.lowering import LoweredProgram, check_lowered, lower
from alpa_ir.p2.placement import (
    ParallelismMatrix,
    ReductionLayout,
    enumerate_matrices,
    reduction_layout,
)
from alpa_ir.p2.simulator import Simulator, default_bytes
from alpa_ir.p2.synthesis import DEFAULT_MAX_SIZE, synthesize
from alpa_ir.p2.system import System


@dataclass(frozen=True)
class ExploreOptions:
    max_size: int = DEFAULT_MAX_SIZE
    algorithm: str = "ring"  # NCCL algorithm used for AllReduce: ring | tree
    bytes_per_device: float | None = None  # None: the paper's 2^29 x nodes float32
    simulate: bool = True
    verify: bool = False  # re-check every lowered program on the whole system (check_lowered)


@dataclass(frozen=True)
class TimedProgram:
    lowered: LoweredProgram
    time: float | None

    @property
    def instructions(self) -> tuple[str, ...]:
        return self.lowered.instructions


@dataclass(frozen=True)
class MatrixResult:
    matrix: ParallelismMatrix
    layout: ReductionLayout
    hierarchy: SynthesisHierarchy
    allreduce_time: float | None
    programs: tuple[TimedProgram, ...] = field(default=())

    @property
    def best_time(self) -> float | None:
        times = [p.time for p in self.programs if p.time is not None]
        return min(times) if times else None

    @property
    def speedup(self) -> float | None:
        best = self.best_time
        if best is None or self.allreduce_time is None or best <= 0:
            return None
        return self.allreduce_time / best


def synthesis_hierarchy(layout: ReductionLayout) -> SynthesisHierarchy:
    return SynthesisHierarchy(
        tuple(level.name for level in layout.levels),
        tuple(level.cardinality for level in layout.levels),
    )


def explore(
    system: System,
    axes: tuple[int, ...] | list[int],
    reduce_axes: tuple[int, ...] | list[int],
    options: ExploreOptions | None = None,
) -> list[MatrixResult]:
    """Every parallelism matrix with its programs; programs fastest first, matrices by their
    fastest program (unsimulated: in enumeration order)."""
    options = options or ExploreOptions()
    axes = tuple(axes)
    reduce_axes = tuple(sorted(set(reduce_axes)))
    if not reduce_axes or any(not 0 <= a < len(axes) for a in reduce_axes):
        raise AlpaError(f"reduction axes {list(reduce_axes)} out of range for axes {list(axes)}")
    matrices = enumerate_matrices(system.hierarchy, axes)
    sim = Simulator(system, options.algorithm) if options.simulate else None
    nbytes = options.bytes_per_device or default_bytes(system)
    if nbytes <= 0:
        raise AlpaError(f"bytes per device must be positive, got {nbytes}")
    results = []
    for matrix in matrices:
        layout = reduction_layout(matrix, reduce_axes, system.level_names)
        hierarchy = synthesis_hierarchy(layout)
        programs = []
        for program in synthesize(hierarchy, options.max_size):
            lowered = lower(program, hierarchy, layout)
            if options.verify:
                check_lowered(lowered, system.num_devices)
            time = None
            if sim is not None:
                steps = [(s.collective, s.groups) for s in lowered.steps]
                time = sim.program_time(steps, nbytes)
            programs.append(TimedProgram(lowered, time))
        allreduce = sim.allreduce_time(layout.devices, nbytes) if sim is not None else None
        if sim is not None:
            programs.sort(key=lambda p: p.time)
        results.append(MatrixResult(matrix, layout, hierarchy, allreduce, tuple(programs)))
    if sim is not None:
        results.sort(key=lambda r: r.best_time if r.best_time is not None else r.allreduce_time)
    return results
