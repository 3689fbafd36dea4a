"""The smallest memory budget any plan meets (for the 'budget too small' error).

A plan's peak is its largest live-set sum. Over the strategies that arc
consistency allows, choosing every node's smallest-memory strategy minimises
every live set at once, so ``max_L Σ_{v in L} min mem_v`` is a lower bound,
and it is the exact minimum when no edge forbids a pair among those
strategies (then every combination is a plan). Otherwise a small ILP
minimises the peak ``P`` subject to ``Σ_{v in L} mem_v·s_v <= P`` and the
forbidden pairs (``s_u[i] + Σ_{j forbidden with i} s_v[j] <= 1``).
"""

from __future__ import annotations

import math

import mip
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.solvers.ilp import ILPProblem, peak_memory
from alpa_ir.solvers.mip_model import new_model
from alpa_ir.solvers.presolve import Infeasible, Presolved, consistent_strategies


def _live_sets(problem: ILPProblem) -> list[tuple[int, ...]]:
    return list(dict.fromkeys(tuple(sorted(set(live))) for live in problem.liveness if live))


def memory_lower_bound(problem: ILPProblem, allowed: Presolved) -> tuple[float, bool]:
    """``(bound, exact)``: the bound above and whether it is the true minimum peak."""
    assert problem.node_memory is not None
    core = allowed.core
    low = [0.0] * problem.num_nodes
    for c, v in enumerate(core.nodes):
        low[v] = float(problem.node_memory[v][core.strategies[c]].min())
    bound = max((math.fsum(low[v] for v in live) for live in _live_sets(problem)), default=0.0)
    exact = all(np.isfinite(e.cost).all() for e in core.edges)
    return bound, exact


def min_peak_memory(
    problem: ILPProblem, solver: str, time_limit: float | None = None
) -> float | None:
    """The smallest peak memory over all plans of ``problem`` (validated), or None
    if it has no plan at all. On a time limit, the best plan's peak found."""
    assert problem.node_memory is not None
    try:
        allowed = consistent_strategies(problem)
    except Infeasible:
        return None
    bound, exact = memory_lower_bound(problem, allowed)
    if exact:
        return bound
    core = allowed.core
    mem = [problem.node_memory[v][core.strategies[c]] for c, v in enumerate(core.nodes)]
    scale = max(max(float(m.max()) for m in mem), 1e-300)
    model = new_model(solver)
    node_vars = [model.add_vars(m.shape[0], var_type=mip.BINARY) for m in mem]
    for vars_ in node_vars:
        model.add_constr(mip.LinExpr(vars_, [1.0] * len(vars_), const=-1.0, sense="="))
    peak = model.add_var(lb=0.0)
    index = {v: c for c, v in enumerate(core.nodes)}
    for live in _live_sets(problem):
        vars_ = [peak]
        coefs = [-1.0]
        for v in live:
            for i, m in enumerate(mem[index[v]]):
                if m > 0:
                    vars_.append(node_vars[index[v]][i])
                    coefs.append(float(m) / scale)
        model.add_constr(mip.LinExpr(vars_, coefs, sense="<"))
    for edge in core.edges:
        forbidden = ~np.isfinite(edge.cost)
        for i in np.flatnonzero(forbidden.any(axis=1)):
            vars_ = [node_vars[edge.u][i]] + [
                node_vars[edge.v][j] for j in np.flatnonzero(forbidden[i])
            ]
            model.add_constr(mip.LinExpr(vars_, [1.0] * len(vars_), const=-1.0, sense="<"))
    model.objective = mip.minimize(peak)
    model.max_mip_gap = 1e-9
    status = model.optimize(max_seconds=time_limit) if time_limit else model.optimize()
    if status in (mip.OptimizationStatus.INFEASIBLE, mip.OptimizationStatus.INT_INFEASIBLE):
        return None
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        raise AlpaError(f"auto-sharding: the minimum-memory search ended with status {status.name}")
    core_choice = [int(np.argmax([var.x for var in vars_])) for vars_ in node_vars]
    return peak_memory(problem, allowed.expand(core_choice))
