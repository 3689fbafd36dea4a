"""The LP relaxation of a (presolved) auto-sharding ILP, built in bulk and solved
by HiGHS (through highspy).

The formulation is the tight one of :mod:`alpa_ir.solvers.mip_model` (the
local marginal polytope): ``s_v[i] in [0, 1]`` with ``Σ_i s_v[i] = 1``, and per
edge one ``e[a, b] in [0, 1]`` per finite pair of row class ``a`` and column
class ``b`` whose sums over ``b`` (over ``a``) equal the strategy mass of class
``a`` of ``u`` (``b`` of ``v``). Forbidden strategies and pairs get no
variable. Memory live sets become ``<=`` rows as in the MIP.

Its optimum is a lower bound of the ILP's. On auto-sharding graphs it is very
often *integral*: every ``s_v`` one-hot. The rounded choice is then an
optimal plan, and the solver proves it by comparing the plan's objective with
the bound. HiGHS' dual simplex solves these LPs (10^5 columns) in seconds,
where CBC's LP takes minutes, so :class:`~alpa_ir.solvers.MipSolver` solves
this first and runs the MIP only when the relaxation is fractional (starting
from its rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse

from alpa_ir.solvers.elimination import row_classes
from alpa_ir.solvers.presolve import CoreProblem

LP_TOL = 1e-9
"""HiGHS' primal and dual feasibility tolerances (on costs scaled to at most 1)."""
INTEGRAL_TOL = 1e-6
"""A node is integral when its largest ``s_v[i]`` is at least 1 minus this."""


@dataclass(frozen=True)
class Relaxation:
    """The LP's answer: a lower bound and the strategy of largest mass per node."""

    bound: float
    """Optimum of the LP plus ``core.constant`` (a lower bound of the core's optimum)."""
    rounded: tuple[int, ...]
    """Per core node, its strategy with the largest LP value."""
    integral: bool
    """Every node's LP solution is one-hot (within :data:`INTEGRAL_TOL`)."""
    num_variables: int
    num_constraints: int
    followed: tuple[int, ...] = ()
    """Per core node, a strategy chosen by following the LP's edge variables
    from node to node (:func:`_follow_edges`): where the LP mixes several
    plans (symmetric meshes give half-integral solutions), one consistent
    plan instead of :attr:`rounded`'s per-node majority. Empty if integral."""
    fractional: tuple[int, ...] = ()
    """The core nodes whose LP solution is not one-hot."""


def _edge_classes(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row class of each row, column class of each column, the compressed matrix."""
    row_class, first_rows = row_classes(matrix)
    col_class, first_cols = row_classes(matrix.T)
    return row_class, col_class, matrix[np.ix_(first_rows, first_cols)]


def solve_relaxation(core: CoreProblem, time_limit: float | None = None) -> Relaxation | None:
    """Solve the LP relaxation of ``core``; None if HiGHS gives no optimum in time
    (or the LP is infeasible: then so is the ILP, which the caller reports)."""
    offsets = np.cumsum([0] + [c.shape[0] for c in core.node_costs])
    num_node_vars = int(offsets[-1])
    cost_parts = [np.where(np.isfinite(c), c, 0.0) for c in core.node_costs]
    upper_parts = [np.isfinite(c).astype(np.float64) for c in core.node_costs]
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    # one row per node: Σ s_v = 1
    node_of_var = np.repeat(np.arange(len(core.node_costs)), np.diff(offsets))
    rows.append(node_of_var)
    cols.append(np.arange(num_node_vars))
    vals.append(np.ones(num_node_vars))
    num_rows = len(core.node_costs)
    num_cols = num_node_vars
    pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for edge in core.edges:
        row_class, col_class, compressed = _edge_classes(edge.cost)
        na, nb = compressed.shape
        finite = np.isfinite(compressed)
        a_idx, b_idx = np.nonzero(finite)
        k = a_idx.shape[0]
        pair_cols = num_cols + np.arange(k)
        pairs.append((row_class, col_class, a_idx, b_idx, pair_cols))
        num_cols += k
        cost_parts.append(compressed[finite])
        upper_parts.append(np.ones(k))
        # rows num_rows + a: Σ_b e[a, b] - Σ_{i in a} s_u[i] = 0
        rows += [num_rows + a_idx, num_rows + row_class]
        cols += [pair_cols, offsets[edge.u] + np.arange(row_class.shape[0])]
        vals += [np.ones(k), -np.ones(row_class.shape[0])]
        # rows num_rows + na + b: Σ_a e[a, b] - Σ_{j in b} s_v[j] = 0
        rows += [num_rows + na + b_idx, num_rows + na + col_class]
        cols += [pair_cols, offsets[edge.v] + np.arange(col_class.shape[0])]
        vals += [np.ones(k), -np.ones(col_class.shape[0])]
        num_rows += na + nb
    matrix = scipy.sparse.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(num_rows, num_cols),
    )
    row_lower = np.zeros(num_rows)
    row_lower[: len(core.node_costs)] = 1.0
    row_upper = row_lower
    a_ub, b_ub = _memory_rows(core, offsets, num_cols)
    if a_ub is not None and b_ub is not None:
        matrix = scipy.sparse.vstack([matrix, a_ub], format="csc")
        row_lower = np.concatenate([row_lower, np.full(b_ub.shape[0], -np.inf)])
        row_upper = np.concatenate([row_upper, b_ub])
    cost = np.concatenate(cost_parts)
    scale = 1.0 / max(float(np.abs(cost).max(initial=0.0)), 1e-300)  # largest cost 1
    solved = _solve_with_highs(
        cost * scale, np.concatenate(upper_parts), matrix, row_lower, row_upper, time_limit
    )
    if solved is None:
        return None
    objective, solution = solved
    x = solution[:num_node_vars]
    rounded = []
    fractional = []
    for v in range(len(core.node_costs)):
        part = x[offsets[v] : offsets[v + 1]]
        best = int(np.argmax(part))
        rounded.append(best)
        if part[best] < 1.0 - INTEGRAL_TOL:
            fractional.append(v)
    integral = not fractional
    bound = objective / scale + core.constant
    followed = () if integral else _follow_edges(core, solution, offsets, pairs)
    return Relaxation(
        bound=bound if math.isfinite(bound) else -math.inf,
        rounded=tuple(rounded),
        integral=integral,
        num_variables=num_cols,
        num_constraints=matrix.shape[0],
        followed=followed,
        fractional=tuple(fractional),
    )


def _solve_with_highs(
    cost: np.ndarray,
    upper: np.ndarray,
    matrix: scipy.sparse.csc_matrix,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    time_limit: float | None,
) -> tuple[float, np.ndarray] | None:
    """``min cost·x`` s.t. ``row_lower <= matrix·x <= row_upper``, ``0 <= x <=
    upper`` by HiGHS' dual simplex (through highspy, as SciPy's ``linprog``
    does, without converting its duals and slacks to lists): the objective
    and ``x``, or None without an optimum in time."""
    highs = highspy.Highs()
    for option, value in (
        ("output_flag", False),
        # HiGHS presolve: slower on these LPs (measured: 3.6 vs 4.8 s, 8 vs 11 s)
        ("presolve", "off"),
        ("solver", "simplex"),
        ("simplex_strategy", 1),  # dual
        # tighter than HiGHS' 1e-7: the objective's tie-breaking terms are ~1e-9 of its largest cost
        ("primal_feasibility_tolerance", LP_TOL),
        ("dual_feasibility_tolerance", LP_TOL),
    ):
        highs.setOptionValue(option, value)
    if time_limit is not None:
        highs.setOptionValue("time_limit", max(float(time_limit), 1e-3))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(matrix.shape[1])
    lp.col_upper_ = upper
    lp.row_lower_ = row_lower
    lp.row_upper_ = row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = matrix.shape[1], matrix.shape[0]
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data
    if highs.passModel(lp) == highspy.HighsStatus.kError:
        return None
    if highs.run() == highspy.HighsStatus.kError:
        return None
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = np.asarray(highs.getSolution().col_value, dtype=np.float64)
    return float(highs.getInfo().objective_function_value), solution


def _follow_edges(
    core: CoreProblem,
    x: np.ndarray,
    offsets: np.ndarray,
    pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[int, ...]:
    """A plan read off a fractional LP solution along spanning trees: a root
    takes its strategy of largest mass; a node reached over an edge takes,
    among its strategy classes on that edge, the one the LP pairs most with
    its neighbour's chosen class, and in that class its strategy of largest
    mass. Where the LP is a mixture of plans, this stays inside one of them."""
    num = len(core.node_costs)
    incident: list[list[tuple[int, int, bool]]] = [[] for _ in range(num)]
    for k, edge in enumerate(core.edges):
        incident[edge.u].append((k, edge.v, True))
        incident[edge.v].append((k, edge.u, False))
    mass = [x[offsets[v] : offsets[v + 1]] for v in range(num)]
    choice = [-1] * num
    for root in sorted(range(num), key=lambda v: -float(mass[v].max(initial=0.0))):
        if choice[root] >= 0:
            continue
        choice[root] = int(np.argmax(mass[root]))
        queue = [root]
        while queue:
            u = queue.pop()
            for k, w, u_is_row in incident[u]:
                if choice[w] >= 0:
                    continue
                row_class, col_class, a_idx, b_idx, cols = pairs[k]
                values = x[cols]
                if u_is_row:
                    mine, theirs, mine_idx, theirs_idx = row_class, col_class, a_idx, b_idx
                else:
                    mine, theirs, mine_idx, theirs_idx = col_class, row_class, b_idx, a_idx
                along = mine_idx == mine[choice[u]]
                if values[along].max(initial=0.0) > INTEGRAL_TOL:
                    best_class = theirs_idx[along][int(np.argmax(values[along]))]
                    in_class = np.where(theirs == best_class, mass[w], -1.0)
                    choice[w] = int(np.argmax(in_class))
                else:
                    choice[w] = int(np.argmax(mass[w]))
                queue.append(w)
    return tuple(choice)


def _memory_rows(
    core: CoreProblem, offsets: np.ndarray, num_cols: int
) -> tuple[scipy.sparse.csr_matrix | None, np.ndarray | None]:
    if core.node_memory is None or not core.live_sets:
        return None, None
    base = [float(m.min()) for m in core.node_memory]
    rows, cols, vals, rhs = [], [], [], []
    for k, (live, budget) in enumerate(zip(core.live_sets, core.live_budgets, strict=True)):
        slack = budget - sum(base[v] for v in live)
        scale = max([abs(slack)] + [float(core.node_memory[v].max() - base[v]) for v in live])
        scale = max(scale, 1e-300)
        for v in live:
            excess = core.node_memory[v] - base[v]
            nz = np.flatnonzero(excess > 0)
            rows.append(np.full(nz.shape[0], k))
            cols.append(offsets[v] + nz)
            vals.append(excess[nz] / scale)
        rhs.append(slack / scale)
    a_ub = scipy.sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(len(core.live_sets), num_cols),
    )
    return a_ub, np.array(rhs)
