"""ILP solvers of the auto-sharding pass (import alpa_ir.solvers): python-mip's CBC and HiGHS
behind an exact presolve; registered as plugins ``cbc`` and ``highs`` (hook ``alpa_ir_solvers``)."""

from alpa_ir.solvers.mip_solver import MipSolver, cbc_solver, highs_solver
from alpa_ir.solvers.presolve import CoreProblem, Presolved, presolve

__all__ = ["CoreProblem", "MipSolver", "Presolved", "cbc_solver", "highs_solver", "presolve"]
