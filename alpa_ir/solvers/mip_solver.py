"""ILP solver plugins ``cbc`` and ``highs``: Alpa's Eq. 1 through python-mip.

``MipSolver("cbc").solve(problem, time_limit=60)`` validates the problem,
checks the memory budget against the smallest one any plan meets, presolves
(``alpa_ir.solvers.presolve``), solves what is left by exact variable
elimination when there is no memory budget and its tables stay small
(``alpa_ir.solvers.elimination``), else builds the MIP of it
(``alpa_ir.solvers.mip_model``), solves it from a greedy start, maps the
choice back and recomputes the objective on the original problem.

Outcomes: an optimal plan; on a time limit, the best plan found with
``optimal=False`` and its gap (and a warning giving it); otherwise a one-line
error: :class:`~alpa_ir.ilp.MemoryBudgetError` (a :class:`PlanError`) with
the smallest feasible budget, :class:`PlanError` naming the node or edge
that leaves no plan, or :class:`AlpaError` (solver missing, no plan found in
time, bad problem).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import mip

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.ilp import (
    ILPProblem,
    ILPSolution,
    evaluate,
    memory_budget_error,
    peak_memory,
    validate_problem,
)
from alpa_ir.solvers.elimination import MAX_TABLE, eliminate
from alpa_ir.solvers.memory import memory_lower_bound, min_peak_memory
from alpa_ir.solvers.mip_model import BACKENDS, build_core_model, greedy_choice, new_model
from alpa_ir.solvers.presolve import Infeasible, Presolved, consistent_strategies, presolve

_FEASIBLE_RTOL = 1e-6  # memory slack accepted from the solver's tolerances

Status = mip.OptimizationStatus


@dataclass(frozen=True)
class MipSolver:
    """One python-mip backend (``name`` is ``"cbc"`` or ``"highs"``)."""

    name: str = "cbc"
    presolve: bool = True
    """Apply the exact reductions of ``alpa_ir.solvers.presolve`` first."""
    mip_gap: float = 1e-9
    """Relative gap at which the solver may call a plan optimal."""
    exact_elimination: bool = True
    """Without a memory budget, first try variable elimination on the presolved
    core (``alpa_ir.solvers.elimination``: exact, fast on layered graphs); the
    MIP runs only when its tables would grow too large."""
    elimination_max_table: int = MAX_TABLE
    """Entries of the largest table elimination may build before it gives up."""

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise AlpaError(f"unknown ILP backend '{self.name}'; known: {', '.join(BACKENDS)}")

    def check_available(self) -> None:
        """Raise :class:`AlpaError` if the backend's library cannot be loaded."""
        new_model(self.name)

    def solve(
        self, problem: ILPProblem, *, time_limit: float | None = None, threads: int | None = None
    ) -> ILPSolution:
        start = time.perf_counter()
        validate_problem(problem)
        self.check_available()
        if time_limit is not None and not time_limit > 0:
            raise AlpaError(f"auto-sharding: time limit {time_limit!r} must be positive")
        self._check_budget(problem, time_limit)
        try:
            reduced = presolve(problem, reduce=self.presolve)
        except Infeasible as exc:
            raise self._no_plan_error(problem, time_limit, exc) from None
        core = reduced.core
        if not core.nodes:
            return self._answer(problem, reduced, (), start, start, True, None, 0, 0)
        if self.exact_elimination and not core.live_sets:
            eliminated = eliminate(core, self.elimination_max_table)
            if eliminated is not None:
                core_choice, value = eliminated
                if not math.isfinite(value):
                    raise self._no_plan_error(problem, time_limit, None)
                done = time.perf_counter()
                return self._answer(problem, reduced, core_choice, start, done, True, None, 0, 0)
        built = build_core_model(core, self.name)
        model = built.model
        model.max_mip_gap = self.mip_gap
        if threads is not None:
            model.threads = threads
        greedy = greedy_choice(core)
        if greedy is not None:
            built.set_start(core, greedy)
        built_at = time.perf_counter()
        remaining = None
        if time_limit is not None:  # the limit covers presolve and build too
            remaining = max(time_limit - (built_at - start), 0.1 * time_limit)
        status = model.optimize(max_seconds=remaining) if remaining else model.optimize()
        if status in (Status.INFEASIBLE, Status.INT_INFEASIBLE):
            raise self._no_plan_error(problem, time_limit, None)
        choice = built.choice() if status in (Status.OPTIMAL, Status.FEASIBLE) else None
        optimal = status == Status.OPTIMAL
        if choice is None and greedy is not None and status == Status.NO_SOLUTION_FOUND:
            choice = greedy  # the solver stopped before improving on its start
        if choice is None:
            if status == Status.NO_SOLUTION_FOUND:
                raise AlpaError(
                    f"auto-sharding: time limit {time_limit:g} s reached before any "
                    "feasible plan was found; raise the time limit"
                )
            raise AlpaError(f"auto-sharding: solver '{self.name}' ended with status {status.name}")
        gap = None
        if not optimal:
            expanded = reduced.expand(choice)
            value = evaluate(problem, expanded)
            bound = model.objective_bound / built.objective_scale + core.constant
            gap = max(value - bound, 0.0) / max(abs(value), 1e-12)
            if gap > 0:
                said = f"gap {gap:.1%}"
            else:  # stopped before proving a lower bound below the plan
                gap, said = None, "gap unknown: no lower bound was proved yet"
            warnings.warn(
                f"auto-sharding: time limit {time_limit:g} s reached; using the best plan "
                f"found ({said})",
                stacklevel=2,
            )
        return self._answer(
            problem, reduced, choice, start, built_at, optimal, gap, model.num_cols, model.num_rows
        )

    def _answer(
        self,
        problem: ILPProblem,
        reduced: Presolved,
        core_choice: tuple[int, ...],
        start: float,
        built_at: float,
        optimal: bool,
        gap: float | None,
        num_variables: int,
        num_constraints: int,
    ) -> ILPSolution:
        choice = reduced.expand(core_choice)
        objective = evaluate(problem, choice)
        if not math.isfinite(objective):
            raise AlpaError(f"auto-sharding: solver '{self.name}' returned a forbidden plan")
        budget = problem.memory_budget
        if budget is not None:
            peak = peak_memory(problem, choice)
            if peak > budget + _FEASIBLE_RTOL * max(budget, 1.0):
                raise AlpaError(
                    f"auto-sharding: solver '{self.name}' returned a plan over the memory "
                    f"budget ({peak:g} > {budget:g} bytes)"
                )
        return ILPSolution(
            choice=choice,
            objective=objective,
            optimal=optimal,
            gap=gap,
            solve_time=time.perf_counter() - start,
            solver=self.name,
            num_variables=num_variables,
            num_constraints=num_constraints,
            build_time=built_at - start,
        )

    def _check_budget(self, problem: ILPProblem, time_limit: float | None) -> None:
        """Raise :class:`MemoryBudgetError` early when the budget is clearly too small."""
        budget = problem.memory_budget
        if budget is None or not problem.liveness:
            return
        try:
            allowed = consistent_strategies(problem)
        except Infeasible as exc:
            raise PlanError(f"auto-sharding: no plan: {exc.reason}") from None
        bound, exact = memory_lower_bound(problem, allowed)
        if budget < bound * (1 - 1e-12):
            needed = bound if exact else min_peak_memory(problem, self.name, time_limit)
            if needed is None:
                raise self._no_plan_error(problem, time_limit, None)
            raise memory_budget_error(budget, needed)

    def _no_plan_error(
        self, problem: ILPProblem, time_limit: float | None, found: Infeasible | None
    ) -> PlanError:
        """Why there is no plan: the memory budget (with the smallest one that works)
        or the forbidden strategies and pairs (naming a node or an edge)."""
        budget = problem.memory_budget
        if budget is not None and problem.liveness:
            needed = min_peak_memory(problem, self.name, time_limit)
            if needed is not None and needed > budget:
                return memory_budget_error(budget, needed)
            if needed is not None:
                raise AlpaError(
                    f"auto-sharding: solver '{self.name}' found no plan although one fits "
                    f"the memory budget (peak {needed:g} <= {budget:g} bytes)"
                )
        if found is None or found.memory:
            try:
                presolve(problem, memory=False)
                found = None
            except Infeasible as exc:
                found = exc
        if found is not None:
            return PlanError(f"auto-sharding: no plan: {found.reason}")
        return PlanError(
            "auto-sharding: no plan: the forbidden (inf) strategy pairs admit no consistent "
            "choice of strategies"
        )


def cbc_solver() -> MipSolver:
    """The ``cbc`` solver plugin (COIN-OR CBC, bundled with python-mip)."""
    return MipSolver("cbc")


def highs_solver() -> MipSolver:
    """The ``highs`` solver plugin (HiGHS through highspy)."""
    return MipSolver("highs")
