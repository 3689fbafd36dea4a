"""The ILP of Alpa's intra-operator pass (OSDI'22 §4.2, Eq. 1): types, checks, reference.

Every node ``v`` of the strategy graph picks one of its ``S_v`` strategies;
the plan's cost is the sum of the chosen strategies' node costs plus, for
every edge ``(u, v)``, the resharding cost ``R_uv[s_u, s_v]``::

    minimise  Σ_v c_v[s_v] + Σ_(u,v) R_uv[s_u, s_v]
    s.t.      Σ_{v ∈ L} mem_v[s_v] <= budget      for every live set L

``np.inf`` in a node cost forbids the strategy, in an edge matrix the pair.
A *plan* is a choice with a finite objective; its *peak memory* is the
largest live-set sum. This module holds the problem and solution types, their
validation, evaluation, and :func:`brute_force`, the exhaustive reference the
solvers (``alpa_ir.solvers``, plugins through the hook ``alpa_ir_solvers``)
are tested against.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.errors import AlpaError, PlanError

BRUTE_FORCE_LIMIT = 4**12
"""The largest number of combinations :func:`brute_force` enumerates."""
_BRUTE_FORCE_CHUNK = 1 << 20
"""Combinations priced at once by :func:`brute_force` (bounds its memory)."""


@dataclass(frozen=True)
class Edge:
    """Resharding costs between nodes ``u`` and ``v``: ``cost[i, j]`` for strategy
    ``i`` of ``u`` and ``j`` of ``v`` (``np.inf``: the pair is forbidden)."""

    u: int
    v: int
    cost: np.ndarray


@dataclass(frozen=True)
class ILPProblem:
    """One auto-sharding problem. Several edges between the same pair add up."""

    node_costs: tuple[np.ndarray, ...]
    edges: tuple[Edge, ...] = ()
    node_memory: tuple[np.ndarray, ...] | None = None
    """Per node, ``[S_v]`` bytes per device of its tensors under each strategy."""
    liveness: tuple[tuple[int, ...], ...] = ()
    """Node sets whose memory is live at the same time (used with a budget)."""
    memory_budget: float | None = None
    """Bytes per device; ``None``: no memory constraint."""
    node_names: tuple[str, ...] | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)

    def node_name(self, v: int) -> str:
        """How error messages name node ``v``."""
        if self.node_names is not None:
            return f"'{self.node_names[v]}'"
        return f"{v}"


@dataclass(frozen=True)
class ILPSolution:
    """A solver's answer. ``objective`` is recomputed on the original problem."""

    choice: tuple[int, ...]
    objective: float
    optimal: bool
    """False when a time limit stopped the solver with a feasible plan."""
    gap: float | None
    """Relative MIP gap when not optimal."""
    solve_time: float
    """Seconds, from the call to the answer (presolve, build and solve)."""
    solver: str
    num_variables: int
    num_constraints: int
    build_time: float = 0.0
    """Seconds spent in presolve and model building (part of ``solve_time``)."""


class MemoryBudgetError(PlanError):
    """No plan fits the memory budget; ``min_budget`` is the smallest one that any plan meets."""

    def __init__(self, message: str, min_budget: float) -> None:
        super().__init__(message)
        self.min_budget = min_budget


def format_bytes(num: float) -> str:
    """``1234567890`` -> ``'1234567890 bytes (1.15 GiB)'``; exact value first."""
    exact = f"{int(num)}" if float(num).is_integer() else repr(float(num))
    scaled, unit = float(num), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(scaled) < 1024 or unit == "TiB":
            break
        scaled /= 1024
    return f"{exact} bytes ({scaled:.3g} {unit})"


def memory_budget_error(budget: float, min_budget: float) -> MemoryBudgetError:
    """The one-line error for a budget below every plan's peak memory."""
    return MemoryBudgetError(
        f"auto-sharding: memory budget {format_bytes(budget)} per device is too small; "
        f"the smallest budget any plan meets is {format_bytes(min_budget)}",
        min_budget,
    )


def validate_problem(problem: ILPProblem) -> None:
    """Raise :class:`AlpaError` (one line) if the problem's arrays are inconsistent."""
    n = problem.num_nodes
    if problem.node_names is not None and len(problem.node_names) != n:
        raise AlpaError(f"ILP problem: {len(problem.node_names)} node names for {n} nodes")
    if not _all_sound(problem.node_costs, 1):
        for v, cost in enumerate(problem.node_costs):
            _check_array(cost, 1, f"node {problem.node_name(v)} cost")
    for v, cost in enumerate(problem.node_costs):
        if cost.shape[0] == 0:
            raise AlpaError(f"ILP problem: node {problem.node_name(v)} has no strategies")
    sizes = [c.shape[0] for c in problem.node_costs]
    sound = _all_sound([edge.cost for edge in problem.edges], 2)
    for k, edge in enumerate(problem.edges):
        for end in (edge.u, edge.v):
            if not (isinstance(end, int | np.integer) and 0 <= end < n):
                raise AlpaError(f"ILP problem: edge {k} names node {end!r}; nodes are 0..{n - 1}")
        where = f"edge {k} ({problem.node_name(edge.u)} -> {problem.node_name(edge.v)}) cost"
        if not sound:
            _check_array(edge.cost, 2, where)
        if edge.cost.shape != (sizes[edge.u], sizes[edge.v]):
            raise AlpaError(
                f"ILP problem: {where} has shape {edge.cost.shape}, expected "
                f"{(sizes[edge.u], sizes[edge.v])} (strategies of its two nodes)"
            )
    if problem.node_memory is not None:
        if len(problem.node_memory) != n:
            raise AlpaError(f"ILP problem: {len(problem.node_memory)} memory vectors for {n} nodes")
        for v, mem in enumerate(problem.node_memory):
            where = f"node {problem.node_name(v)} memory"
            _check_array(mem, 1, where)
            if mem.shape[0] != sizes[v]:
                raise AlpaError(
                    f"ILP problem: {where} has {mem.shape[0]} entries for {sizes[v]} strategies"
                )
            if not np.all(np.isfinite(mem)) or np.any(mem < 0):
                raise AlpaError(f"ILP problem: {where} must be finite and non-negative")
    for k, live in enumerate(problem.liveness):
        bad = [v for v in live if not (isinstance(v, int | np.integer) and 0 <= v < n)]
        if bad:
            raise AlpaError(
                f"ILP problem: live set {k} names node {bad[0]!r}; nodes are 0..{n - 1}"
            )
    budget = problem.memory_budget
    if budget is not None:
        if problem.node_memory is None:
            raise AlpaError("ILP problem: a memory budget needs node_memory")
        if not (math.isfinite(budget) and budget >= 0):
            raise AlpaError(f"ILP problem: memory budget {budget!r} must be finite and >= 0")


def _all_sound(arrays: Sequence[object], ndim: int) -> bool:
    """Whether every one of ``arrays`` passes :func:`_check_array`, checked at
    once (a problem has thousands of small arrays; each checked alone took
    most of the validation); False sends the caller to check them one by one
    for the message."""
    if not all(
        isinstance(a, np.ndarray) and a.ndim == ndim and a.dtype.kind in "iuf" for a in arrays
    ):
        return False
    if not arrays:
        return True
    flat = np.concatenate([a.ravel() for a in arrays])  # type: ignore[union-attr]
    return not (np.isnan(flat).any() or np.isneginf(flat).any())


def _check_array(array: object, ndim: int, where: str) -> None:
    if not isinstance(array, np.ndarray) or array.ndim != ndim:
        raise AlpaError(f"ILP problem: {where} must be a {ndim}-d numpy array")
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise AlpaError(f"ILP problem: {where} must hold real numbers, not {array.dtype}")
    if np.any(np.isnan(array)) or np.any(np.isneginf(array)):
        raise AlpaError(f"ILP problem: {where} holds NaN or -inf")


def evaluate(problem: ILPProblem, choice: Sequence[int]) -> float:
    """The objective of ``choice`` (``inf`` if it picks a forbidden strategy or pair)."""
    terms = [float(c[s]) for c, s in zip(problem.node_costs, choice, strict=True)]
    terms += [float(e.cost[choice[e.u], choice[e.v]]) for e in problem.edges]
    if any(math.isinf(t) for t in terms):
        return math.inf
    return math.fsum(terms)


def peak_memory(problem: ILPProblem, choice: Sequence[int]) -> float:
    """The largest live-set memory of ``choice`` (0 without memory or live sets)."""
    if problem.node_memory is None:
        return 0.0
    mem = problem.node_memory
    return max(
        (math.fsum(float(mem[v][choice[v]]) for v in live) for live in problem.liveness),
        default=0.0,
    )


def brute_force(problem: ILPProblem) -> ILPSolution:
    """The exact optimum by enumerating every combination (tests and debugging).

    Raises :class:`AlpaError` if there are more than :data:`BRUTE_FORCE_LIMIT`
    combinations, :class:`MemoryBudgetError` (with the true minimum budget) if no
    plan fits the budget, :class:`PlanError` if there is no plan at all.
    """
    start = time.perf_counter()
    validate_problem(problem)
    sizes = [c.shape[0] for c in problem.node_costs]
    total = math.prod(sizes)
    if total > BRUTE_FORCE_LIMIT:
        raise AlpaError(f"brute force: {total} combinations exceed the limit {BRUTE_FORCE_LIMIT}")
    best_value, best_choice, least_peak, any_finite = math.inf, None, math.inf, False
    budget = problem.memory_budget if problem.liveness else None
    for lo in range(0, total, _BRUTE_FORCE_CHUNK):
        flat = np.arange(lo, min(total, lo + _BRUTE_FORCE_CHUNK))
        grid = np.unravel_index(flat, sizes) if sizes else ()
        objective = np.zeros(len(flat))
        for v, cost in enumerate(problem.node_costs):
            objective += cost[grid[v]]
        for edge in problem.edges:
            objective += edge.cost[grid[edge.u], grid[edge.v]]
        finite = np.isfinite(objective)
        any_finite = any_finite or bool(finite.any())
        if budget is not None and finite.any():
            assert problem.node_memory is not None
            peak = np.zeros(len(objective))
            for live in problem.liveness:
                used = np.zeros(len(objective))
                for v in live:
                    used += problem.node_memory[v][grid[v]]
                peak = np.maximum(peak, used)
            least_peak = min(least_peak, float(peak[finite].min()))
            objective = np.where(peak <= budget, objective, np.inf)
        k = int(np.argmin(objective))
        if objective[k] < best_value:
            best_value = float(objective[k])
            best_choice = tuple(int(g[k]) for g in grid)
    if not any_finite:
        raise PlanError("brute force: no plan: every combination has an inf cost")
    if best_choice is None:
        assert budget is not None
        raise memory_budget_error(budget, least_peak)
    choice = best_choice
    return ILPSolution(
        choice=choice,
        objective=evaluate(problem, choice),
        optimal=True,
        gap=None,
        solve_time=time.perf_counter() - start,
        solver="brute-force",
        num_variables=0,
        num_constraints=0,
    )
