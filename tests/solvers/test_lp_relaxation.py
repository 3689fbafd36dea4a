"""The LP relaxation path of the ILP solvers (``alpa_ir.solvers.lp_relaxation``).

Its optimum must bound the ILP's from below on every problem (budgets
included); where it is integral (trees, and graphs whose best plan is
unambiguous) the solver must return its rounding as the optimum without
building the MIP; and a core too large for quick elimination must go to the
LP before elimination is tried.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ilp_solvers import problems

import alpa_ir.solvers.mip_solver as mip_solver
from alpa_ir.errors import PlanError
from alpa_ir.solvers import MipSolver, presolve
from alpa_ir.solvers.elimination import eliminate, estimated_work
from alpa_ir.solvers.ilp import Edge, ILPProblem, MemoryBudgetError, brute_force
from alpa_ir.solvers.lp_relaxation import solve_relaxation
from alpa_ir.solvers.mip_solver import ELIMINATION_FIRST_WORK, core_objective


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(with_memory=True))
def test_relaxation_bounds_the_optimum(problem: ILPProblem) -> None:
    try:
        reference = brute_force(problem).objective
    except (MemoryBudgetError, PlanError):
        return
    core = presolve(problem).core
    if not core.nodes:
        return
    relaxation = solve_relaxation(core)
    assert relaxation is not None
    assert relaxation.bound <= reference + 1e-6 * max(1.0, abs(reference))
    if relaxation.integral and not core.live_sets:  # a one-hot LP optimum is an ILP optimum
        assert core_objective(core, relaxation.rounded) == pytest.approx(reference, abs=1e-6)


def _tree(seed: int, n: int, s: int) -> ILPProblem:
    rng = np.random.default_rng(seed)
    costs = tuple(rng.random(s) for _ in range(n))
    edges = tuple(Edge(int(rng.integers(0, v)), v, rng.random((s, s))) for v in range(1, n))
    return ILPProblem(costs, edges)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 7), s=st.integers(2, 4))
def test_integral_relaxation_answers_without_the_mip(
    seed: int, n: int, s: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a tree the LP is exact: with presolve and elimination off, the solver
    must answer from the LP alone (the MIP builder is disabled)."""
    problem = _tree(seed, n, s)

    def no_mip(*args: object, **kwargs: object) -> None:
        raise AssertionError("the MIP was built")

    with monkeypatch.context() as m:
        m.setattr(mip_solver, "build_core_model", no_mip)
        solution = MipSolver("cbc", presolve=False, exact_elimination=False).solve(problem)
    assert solution.optimal
    assert solution.objective == pytest.approx(brute_force(problem).objective, abs=1e-9)


def test_large_core_goes_to_the_lp_before_elimination(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense core of 25-strategy nodes (a 2-D mesh's strategy counts): its
    estimated elimination work is over ELIMINATION_FIRST_WORK, so the LP answers
    first; the optimum equals exact elimination's."""
    rng = np.random.default_rng(7)
    n, s = 5, 25
    costs = tuple(rng.random(s) for _ in range(n))
    agree = np.full((s, s), 3.0)  # resharding-like: free when the strategies agree
    np.fill_diagonal(agree, 0.0)
    edges = tuple(
        Edge(u, v, agree + rng.random((s, s)) * 0.01) for u in range(n) for v in range(u + 1, n)
    )
    problem = ILPProblem(costs, edges)
    core = presolve(problem).core
    assert estimated_work(core) > ELIMINATION_FIRST_WORK
    exact = eliminate(core)
    assert exact is not None

    def no_elimination(*args: object, **kwargs: object) -> None:
        raise AssertionError("elimination was tried")

    with monkeypatch.context() as m:
        m.setattr(mip_solver, "eliminate", no_elimination)
        solution = MipSolver("cbc").solve(problem)
    assert solution.optimal and solution.num_variables > 0
    assert solution.objective == pytest.approx(exact[1], rel=1e-9)


def _frustrated_k4() -> ILPProblem:
    """Four nodes, all pairs joined, two strategies, a cost where neighbours
    agree: every plan pays 2, the LP mixes both strategies everywhere for 0
    (like a mesh with two interchangeable axes: a plan and its mirror image)."""
    agree = np.eye(2)
    edges = tuple(Edge(u, v, agree) for u in range(4) for v in range(u + 1, 4))
    return ILPProblem(tuple(np.zeros(2) for _ in range(4)), edges)


def test_a_fractional_relaxation_is_read_along_its_edges_and_dived() -> None:
    core = presolve(_frustrated_k4()).core
    relaxation = solve_relaxation(core)
    assert relaxation is not None and not relaxation.integral
    assert relaxation.bound == pytest.approx(0.0, abs=1e-9)
    assert set(relaxation.fractional) == set(range(len(core.node_costs)))
    assert len(relaxation.followed) == len(core.node_costs)
    dived = mip_solver._dive(core, relaxation, 0.0, None)
    assert dived is not None and core_objective(core, dived) == pytest.approx(2.0)


def test_the_solver_is_exact_when_the_relaxation_is_fractional() -> None:
    solution = MipSolver("cbc", exact_elimination=False).solve(_frustrated_k4())
    assert solution.optimal and solution.objective == pytest.approx(2.0)


def test_elimination_stops_at_its_deadline() -> None:
    core = presolve(_frustrated_k4(), reduce=False).core
    assert eliminate(core) is not None
    assert eliminate(core, deadline=0.0) is None  # the clock is long past 0


def test_elimination_after_a_fractional_lp_gets_a_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a fractional LP whose dive is not within the gap, exact elimination
    may run for at most ELIMINATION_AFTER_LP seconds of CPU time, with or
    without a time limit; then the MIP answers (GPT-3 39B's memory-fallback
    plans spent 10 s in eliminations that gave up)."""
    budgets: list[float | None] = []

    def recorded(
        core: object, max_table: int, deadline: float | None = None, cpu_budget: float | None = None
    ) -> None:
        budgets.append(cpu_budget)
        return None  # gave up

    with monkeypatch.context() as m:
        m.setattr(mip_solver, "ELIMINATION_FIRST_WORK", 0.0)  # LP first
        m.setattr(mip_solver, "eliminate", recorded)
        for limit in (None, 600.0):
            solution = MipSolver("cbc").solve(_frustrated_k4(), time_limit=limit)
            assert solution.optimal and solution.objective == pytest.approx(2.0)
    assert budgets == [mip_solver.ELIMINATION_AFTER_LP] * 2


def test_elimination_budget_counts_cpu_time_not_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The after-LP budget is the solving thread's CPU time: on a loaded machine
    the clock runs ahead of this thread's work, and must not make elimination
    give up where it would finish on a quiet one (the plan would depend on the
    load)."""
    import alpa_ir.solvers.elimination as elimination

    core = presolve(_frustrated_k4(), reduce=False).core
    assert eliminate(core, cpu_budget=-1.0) is None  # spent before it starts
    ticks = iter(range(0, 10**9, 1000))  # every look at the clock: 1000 s later
    with monkeypatch.context() as m:
        m.setattr(elimination.time, "perf_counter", lambda: float(next(ticks)))
        answer = eliminate(core, cpu_budget=mip_solver.ELIMINATION_AFTER_LP)
    assert answer is not None and answer[1] == pytest.approx(2.0)


def test_without_branch_and_bound_the_best_plan_found_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``branch_and_bound=False``: after a fractional LP whose dive is not
    within the gap (and no elimination), the dived plan is the answer, marked
    unproven with its gap to the LP bound, and no MIP is built, whatever the
    time limit (the memory-fallback plans: the same plan at any load)."""

    def no_mip(*args: object, **kwargs: object) -> None:
        raise AssertionError("the MIP was built")

    monkeypatch.setattr(mip_solver, "build_core_model", no_mip)
    solver = MipSolver("cbc", exact_elimination=False, branch_and_bound=False)
    for limit in (None, 1e-3, 600.0):
        solution = solver.solve(_frustrated_k4(), time_limit=limit)
        assert not solution.optimal and solution.objective == pytest.approx(2.0)
        assert solution.gap == pytest.approx(1.0)  # the LP's bound is 0
