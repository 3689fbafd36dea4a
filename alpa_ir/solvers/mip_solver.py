"""ILP solver plugins ``cbc`` and ``highs``: Alpa's Eq. 1 through python-mip.

``MipSolver("cbc").solve(problem, time_limit=60)`` validates the problem,
checks the memory budget against the smallest one any plan meets, presolves
(``alpa_ir.solvers.presolve``), solves what is left by exact variable
elimination when there is no memory budget and the graph promises small
tables (``alpa_ir.solvers.elimination``), else solves its LP relaxation with
HiGHS (``alpa_ir.solvers.lp_relaxation``): when the rounded LP solution is
as good as the LP's bound it is optimal and nothing more runs (the usual case
on auto-sharding graphs). Only then does it build the MIP
(``alpa_ir.solvers.mip_model``) and solve it with the named backend from the
better of the LP's rounding and a greedy start. It maps the choice back and
recomputes the objective on the original problem.

Outcomes: an optimal plan; on a time limit, the best plan found with
``optimal=False`` and its gap (and a warning giving it); otherwise a one-line
error: :class:`~alpa_ir.solvers.ilp.MemoryBudgetError` (a :class:`PlanError`) with
the smallest feasible budget, :class:`PlanError` naming the node or edge
that leaves no plan, or :class:`AlpaError` (solver missing, no plan found in
time, bad problem).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace

import mip
import numpy as np

from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.solvers.elimination import MAX_TABLE, eliminate, estimated_work
from alpa_ir.solvers.ilp import (
    ILPProblem,
    ILPSolution,
    evaluate,
    memory_budget_error,
    peak_memory,
    validate_problem,
)
from alpa_ir.solvers.lp_relaxation import Relaxation, solve_relaxation
from alpa_ir.solvers.memory import memory_lower_bound, min_peak_memory
from alpa_ir.solvers.mip_model import (
    BACKENDS,
    build_core_model,
    greedy_choice,
    local_search,
    new_model,
)
from alpa_ir.solvers.presolve import (
    CoreProblem,
    Infeasible,
    Presolved,
    consistent_strategies,
    presolve,
)

_FEASIBLE_RTOL = 1e-6  # memory slack accepted from the solver's tolerances
ELIMINATION_FIRST_WORK = 1e6
"""Elimination runs before the LP only when :func:`estimated_work` of the core
is at most this (well under a second then); larger cores (2-D
meshes of many strategies) go to the LP first, elimination after it only if
the LP is not integral."""
ELIMINATION_AFTER_LP = 2.0
"""Seconds of CPU time the exact elimination may take after a fractional LP
before the MIP takes over (the solving thread's CPU time, not the clock's: a
loaded machine must not change which path a problem takes, nor its plan):
such cores are large (2-D meshes, memory-fallback plans without replicated
parameters), elimination there either ends quickly or spends ten seconds and
more on tables that CBC's branch and bound never needs (a 99-node core of
GPT-3 39B on a (2, 16) mesh: 10 s of elimination that gave up, then 4 s of
CBC)."""
LP_OPTIMAL_RTOL = 1e-9
"""The rounded LP plan is optimal when its objective exceeds the LP bound by at
most this relative amount (or ``mip_gap`` if larger)."""

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
    lp_first: bool = True
    """Solve the LP relaxation (HiGHS) before the MIP; a rounded LP plan that
    meets the LP bound is returned as optimal (``alpa_ir.solvers.lp_relaxation``)."""
    branch_and_bound: bool = True
    """Run the MIP when the LP relaxation, its dives and exact elimination leave
    the best plan unproven. False: return that plan (``optimal=False``, its gap
    to the LP bound), found without a time limit deciding it, so the same on a
    loaded machine as on a quiet one; an :class:`AlpaError` where they found none."""

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
        if not core.nodes and self._within_budget(problem, reduced.expand(())):
            return self._answer(problem, reduced, (), start, start, True, None, 0, 0)
        if not core.nodes:
            # The reductions decided every node by cost alone and the plan is
            # over the memory budget: solve the unreduced problem, whose live
            # sets keep the budget exact.
            try:
                reduced = presolve(problem, reduce=False)
            except Infeasible as exc:
                raise self._no_plan_error(problem, time_limit, exc) from None
            core = reduced.core
        can_eliminate = self.exact_elimination and not core.live_sets
        small = can_eliminate and (
            not self.lp_first
            or estimated_work(core, ELIMINATION_FIRST_WORK) <= ELIMINATION_FIRST_WORK
        )
        if small:
            answer = self._eliminate(problem, reduced, start, time_limit)
            if answer is not None:
                return answer
        relaxation = None
        greedy = None  # the MIP's start: computed once the LP has not settled it
        if self.lp_first:
            relaxation = self._relax(problem, reduced, start, time_limit)
            if isinstance(relaxation, ILPSolution):
                return relaxation
            greedy = _better_start(core, greedy_choice(core), relaxation)
            if relaxation is not None:
                # a fractional LP: the best plan read off it, or found by
                # diving from it, may already be within the gap of its bound
                dived = _dive(core, relaxation, start, time_limit)
                if dived is not None and (
                    greedy is None or core_objective(core, dived) < core_objective(core, greedy)
                ):
                    greedy = dived
            if relaxation is not None and greedy is not None:
                answer = self._within_gap(problem, reduced, greedy, start, relaxation)
                if answer is not None:
                    return answer
        if can_eliminate and not small:
            answer = self._eliminate(problem, reduced, start, time_limit, ELIMINATION_AFTER_LP)
            if answer is not None:
                return answer
        if not self.lp_first:
            greedy = greedy_choice(core)
        if not self.branch_and_bound:
            return self._unproven(problem, reduced, greedy, start, relaxation)
        built = build_core_model(core, self.name)
        model = built.model
        model.max_mip_gap = self.mip_gap
        if threads is not None:
            model.threads = threads
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

    def _unproven(
        self,
        problem: ILPProblem,
        reduced: Presolved,
        core_choice: tuple[int, ...] | None,
        start: float,
        relaxation: Relaxation | None,
    ) -> ILPSolution:
        """The best plan found before branch and bound, not proven optimal."""
        if core_choice is None:
            raise AlpaError(
                "auto-sharding: no plan was found without branch and bound "
                f"(solver '{self.name}', branch_and_bound off)"
            )
        gap = None
        if relaxation is not None:
            value = core_objective(reduced.core, core_choice)
            gap = max(value - relaxation.bound, 0.0) / max(abs(value), 1e-12)
        done = time.perf_counter()
        return self._answer(problem, reduced, core_choice, start, done, False, gap, 0, 0)

    def _gap_tolerance(self, value: float) -> float:
        """How far above the LP bound a plan may be and count as optimal."""
        return max(LP_OPTIMAL_RTOL, self.mip_gap) * max(abs(value), 1e-12)

    def _eliminate(
        self,
        problem: ILPProblem,
        reduced: Presolved,
        start: float,
        time_limit: float | None,
        at_most: float | None = None,
    ) -> ILPSolution | None:
        # within a time limit, elimination may take half of what is left (the
        # MIP after it needs the rest), and at most ``at_most`` seconds of CPU
        now = time.perf_counter()
        deadline = None
        if time_limit is not None:
            deadline = start + time_limit - 0.5 * (time_limit - (now - start))
        eliminated = eliminate(
            reduced.core, self.elimination_max_table, deadline=deadline, cpu_budget=at_most
        )
        if eliminated is None:
            return None
        core_choice, value = eliminated
        if not math.isfinite(value):
            raise self._no_plan_error(problem, time_limit, None)
        done = time.perf_counter()
        return self._answer(problem, reduced, core_choice, start, done, True, None, 0, 0)

    def _relax(
        self, problem: ILPProblem, reduced: Presolved, start: float, time_limit: float | None
    ) -> ILPSolution | Relaxation | None:
        """The LP relaxation's plan if it is optimal, else the relaxation (or None)."""
        core = reduced.core
        remaining = None if time_limit is None else time_limit - (time.perf_counter() - start)
        if remaining is not None and remaining <= 0:
            return None
        relaxation = solve_relaxation(core, remaining)
        if relaxation is None:
            return None
        value = core_objective(core, relaxation.rounded)
        if not math.isfinite(value) or not _fits(core, relaxation.rounded):
            return relaxation
        answer = self._within_gap(problem, reduced, relaxation.rounded, start, relaxation)
        return relaxation if answer is None else answer

    def _within_gap(
        self,
        problem: ILPProblem,
        reduced: Presolved,
        core_choice: tuple[int, ...],
        start: float,
        relaxation: Relaxation,
    ) -> ILPSolution | None:
        """``core_choice`` as the optimal answer if it is within the gap of the
        LP's bound, else None."""
        value = core_objective(reduced.core, core_choice)
        if value - relaxation.bound > self._gap_tolerance(value):
            return None
        done = time.perf_counter()
        return self._answer(
            problem,
            reduced,
            core_choice,
            start,
            done,
            True,
            None,
            relaxation.num_variables,
            relaxation.num_constraints,
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

    @staticmethod
    def _within_budget(problem: ILPProblem, choice: tuple[int, ...]) -> bool:
        budget = problem.memory_budget
        if budget is None:
            return True
        return peak_memory(problem, choice) <= budget + _FEASIBLE_RTOL * max(budget, 1.0)

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


def core_objective(core: CoreProblem, choice: tuple[int, ...]) -> float:
    """The core's objective of a choice of its strategies (``core.constant`` included)."""
    total = core.constant + math.fsum(
        float(c[s]) for c, s in zip(core.node_costs, choice, strict=True)
    )
    return total + math.fsum(float(e.cost[choice[e.u], choice[e.v]]) for e in core.edges)


def _better_start(
    core: CoreProblem, greedy: tuple[int, ...] | None, relaxation: Relaxation | None
) -> tuple[int, ...] | None:
    """The cheapest of the greedy plan and the plans read off the LP (its
    rounding, and the one that follows its edges), each improved by local
    search, that meets the live sets."""
    candidates = [c for c in (greedy,) if c is not None]
    if relaxation is not None:
        for read in (relaxation.rounded, relaxation.followed):
            if read and _fits(core, read):
                candidates.append(read)
                improved = local_search(core, read)
                if improved is not None:
                    candidates.append(improved)
    finite = [c for c in candidates if math.isfinite(core_objective(core, c))]
    return min(finite, key=lambda c: core_objective(core, c), default=None)


MAX_DIVES = 4
"""LP re-solves :func:`_dive` may spend on a fractional relaxation."""


def _dive(
    core: CoreProblem, relaxation: Relaxation, start: float, time_limit: float | None
) -> tuple[int, ...] | None:
    """A plan found by diving from a fractional LP: fix one fractional node to
    the strategy :attr:`Relaxation.followed` gives it, solve the LP again, and
    repeat until it is integral (at most :data:`MAX_DIVES` times, within half
    the time left). A mesh with two interchangeable axes makes the LP mix a
    plan with its mirror image; fixing one node picks one of them, after which
    the LP is usually integral. A heuristic: the plan is not proven optimal,
    only compared with the first LP's bound."""
    if core.live_sets or not relaxation.followed:
        return None
    costs = list(core.node_costs)
    current = relaxation
    for _ in range(MAX_DIVES):
        remaining = None
        if time_limit is not None:
            remaining = 0.5 * (time_limit - (time.perf_counter() - start))
            if remaining <= 0:
                return None
        node = current.fractional[0]
        keep = np.arange(costs[node].shape[0]) == current.followed[node]
        costs[node] = np.where(keep, costs[node], np.inf)
        solved = solve_relaxation(replace(core, node_costs=tuple(costs)), remaining)
        if solved is None:
            return None
        if solved.integral:
            return local_search(core, solved.rounded)
        current = solved
    return None


def _fits(core: CoreProblem, choice: tuple[int, ...]) -> bool:
    mem = core.node_memory
    if mem is None:
        return True
    return all(
        sum(float(mem[v][choice[v]]) for v in live) <= budget
        for live, budget in zip(core.live_sets, core.live_budgets, strict=True)
    )


def cbc_solver() -> MipSolver:
    """The ``cbc`` solver plugin (COIN-OR CBC, bundled with python-mip)."""
    return MipSolver("cbc")


def highs_solver() -> MipSolver:
    """The ``highs`` solver plugin (HiGHS through highspy)."""
    return MipSolver("highs")
