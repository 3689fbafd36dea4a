"""P² (MLSys'22): parallelism placement and reduction synthesis on hierarchical systems (import alpa_ir.p2)."""

from alpa_ir.p2.explore import ExploreOptions, MatrixResult, TimedProgram, explore
from alpa_ir.p2.lowering import LoweredProgram, check_lowered, lower
from alpa_ir.p2.placement import (
    ParallelismMatrix,
    device_array,
    enumerate_matrices,
    reduction_layout,
)
from alpa_ir.p2.semantics import Collective
from alpa_ir.p2.simulator import Simulator
from alpa_ir.p2.synthesis import synthesize
from alpa_ir.p2.system import System, custom_system, get_system

__all__ = [
    "Collective",
    "ExploreOptions",
    "LoweredProgram",
    "MatrixResult",
    "ParallelismMatrix",
    "Simulator",
    "System",
    "TimedProgram",
    "check_lowered",
    "custom_system",
    "device_array",
    "enumerate_matrices",
    "explore",
    "get_system",
    "lower",
    "reduction_layout",
    "synthesize",
]
