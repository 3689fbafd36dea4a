"""The python-mip model of a (presolved) auto-sharding ILP, built in bulk.

Formulation (Alpa's Eq. 1, linearised in the tight form):

- ``s_v[i]`` binary, ``Σ_i s_v[i] = 1`` (strategies with an ``inf`` cost get
  upper bound 0);
- every edge is first *compressed*: strategies of ``u`` whose rows of ``R``
  are identical form one row class ``a``, strategies of ``v`` with identical
  columns one column class ``b`` (a resharding cost depends only on the two
  sharding specs, so a node with 60 strategies typically has 4-16 classes per
  edge). One continuous ``e[a, b] in [0, 1]`` per finite class pair, with
  ``Σ_b e[a, b] = Σ_{i in a} s_u[i]`` and ``Σ_a e[a, b] = Σ_{j in b} s_v[j]``.
  Given one-hot ``s`` these force ``e`` to the one-hot pair of the chosen
  classes, so ``e`` needs no integrality and the objective
  ``Σ c_v·s_v + Σ R[a, b]·e[a, b]`` is exact; a forbidden pair simply has no
  variable;
- a live set ``L`` with budget ``B``: ``Σ_{v in L} (mem_v − min mem_v)·s_v <=
  B − Σ min mem_v``, scaled so that its largest number is 1.

Variables are created with ``add_vars`` and rows as ``LinExpr`` from lists
(``xsum`` and operator overloading are several times slower at this size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mip
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.solvers.presolve import CoreProblem

OBJECTIVE_SCALE = 1e6
BACKENDS: dict[str, tuple[str, str]] = {
    "cbc": (mip.CBC, "install python-mip with its bundled CBC (pip install mip)"),
    "highs": (mip.HIGHS, "install highspy (pip install 'mip[highs]')"),
}


def new_model(solver: str) -> mip.Model:
    """An empty minimisation model of the named backend, silent."""
    if solver not in BACKENDS:
        raise AlpaError(f"unknown ILP backend '{solver}'; known: {', '.join(sorted(BACKENDS))}")
    backend, hint = BACKENDS[solver]
    try:
        model = mip.Model(sense=mip.MINIMIZE, solver_name=backend)
    except Exception as exc:  # a missing shared library surfaces as various errors
        raise AlpaError(f"solver '{solver}' is not available: {hint} ({exc})") from exc
    model.verbose = 0
    return model


@dataclass
class CoreModel:
    """A built model and what it takes to read a choice back or give a start."""

    model: mip.Model
    node_vars: list[list[mip.Var]]
    edge_vars: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[mip.Var]]]
    """Per core edge: row class of each u strategy, column class of each v
    strategy, index of the variable of each class pair (-1: forbidden), variables."""
    objective_scale: float
    """The model's objective is the core's times this."""

    def choice(self) -> tuple[int, ...] | None:
        """The chosen strategy per core node, or None if there is no solution."""
        out = []
        for vars_ in self.node_vars:
            values = [var.x for var in vars_]
            if any(x is None for x in values):
                return None
            out.append(int(np.argmax(values)))
        return tuple(out)

    def set_start(self, core: CoreProblem, choice: tuple[int, ...]) -> None:
        start: list[tuple[mip.Var, float]] = []
        for vars_, s in zip(self.node_vars, choice, strict=True):
            start += [(var, 1.0 if i == s else 0.0) for i, var in enumerate(vars_)]
        for edge, (row_class, col_class, pair_index, vars_) in zip(
            core.edges, self.edge_vars, strict=True
        ):
            hot = pair_index[row_class[choice[edge.u]], col_class[choice[edge.v]]]
            start += [(var, 1.0 if k == hot else 0.0) for k, var in enumerate(vars_)]
        self.model.start = start


def _classes(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row classes, column classes and the compressed matrix [rows, cols]."""
    rows, row_class = np.unique(matrix, axis=0, return_inverse=True)
    compressed, col_class = np.unique(rows, axis=1, return_inverse=True)
    return row_class.reshape(-1), col_class.reshape(-1), compressed


def build_core_model(core: CoreProblem, solver: str) -> CoreModel:
    """The MIP of ``core`` (objective without ``core.constant``)."""
    model = new_model(solver)
    obj_vars: list[mip.Var] = []
    obj_coefs: list[float] = []
    node_vars: list[list[mip.Var]] = []
    for cost in core.node_costs:
        vars_ = model.add_vars(cost.shape[0], var_type=mip.BINARY)
        finite = np.isfinite(cost)
        for i in np.flatnonzero(~finite):
            vars_[i].ub = 0.0
        for i in np.flatnonzero(finite & (cost != 0)):
            obj_vars.append(vars_[i])
            obj_coefs.append(float(cost[i]))
        model.add_constr(mip.LinExpr(vars_, [1.0] * len(vars_), const=-1.0, sense="="))
        node_vars.append(vars_)
    edge_vars = []
    for edge in core.edges:
        row_class, col_class, compressed = _classes(edge.cost)
        finite = np.isfinite(compressed)
        pair_index = np.full(compressed.shape, -1, dtype=np.int64)
        pair_index[finite] = np.arange(int(finite.sum()))
        vars_ = model.add_vars(int(finite.sum()), lb=0.0, ub=1.0)
        coefs = compressed[finite]
        for k in np.flatnonzero(coefs != 0):
            obj_vars.append(vars_[k])
            obj_coefs.append(float(coefs[k]))
        su, sv = node_vars[edge.u], node_vars[edge.v]
        for a in range(compressed.shape[0]):
            members = [su[i] for i in np.flatnonzero(row_class == a)]
            pairs = [vars_[k] for k in pair_index[a] if k >= 0]
            coef = [1.0] * len(pairs) + [-1.0] * len(members)
            model.add_constr(mip.LinExpr(pairs + members, coef, sense="="))
        for b in range(compressed.shape[1]):
            members = [sv[j] for j in np.flatnonzero(col_class == b)]
            pairs = [vars_[k] for k in pair_index[:, b] if k >= 0]
            coef = [1.0] * len(pairs) + [-1.0] * len(members)
            model.add_constr(mip.LinExpr(pairs + members, coef, sense="="))
        edge_vars.append((row_class, col_class, pair_index, vars_))
    if core.node_memory is not None:
        _add_memory_rows(model, core, node_vars)
    # Solvers' tolerances are partly absolute: bring the largest cost to OBJECTIVE_SCALE.
    scale = OBJECTIVE_SCALE / max([abs(c) for c in obj_coefs] + [1e-300])
    model.objective = mip.minimize(mip.LinExpr(obj_vars, [c * scale for c in obj_coefs]))
    return CoreModel(model, node_vars, edge_vars, scale)


def _add_memory_rows(model: mip.Model, core: CoreProblem, node_vars: list[list[mip.Var]]) -> None:
    assert core.node_memory is not None
    base = [float(m.min()) for m in core.node_memory]
    for live, budget in zip(core.live_sets, core.live_budgets, strict=True):
        rhs = budget - sum(base[v] for v in live)
        vars_: list[mip.Var] = []
        coefs: list[float] = []
        for v in live:
            excess = core.node_memory[v] - base[v]
            for i in np.flatnonzero(excess > 0):
                vars_.append(node_vars[v][i])
                coefs.append(float(excess[i]))
        if not vars_ and rhs >= 0:
            continue
        scale = max([abs(rhs), *coefs, 1e-300])
        model.add_constr(
            mip.LinExpr(vars_, [c / scale for c in coefs], const=-rhs / scale, sense="<")
        )


def greedy_choice(core: CoreProblem) -> tuple[int, ...] | None:
    """A quick plan for the solver to start from (iterated conditional modes
    from every node's cheapest strategy), or None if it is forbidden or
    breaks a memory constraint."""
    choice = [int(np.argmin(c)) for c in core.node_costs]
    mem = core.node_memory
    if mem is not None:  # start coupled nodes at their smallest memory
        for v in {v for live in core.live_sets for v in live}:
            low = mem[v] == mem[v].min()
            choice[v] = int(np.argmin(np.where(low, core.node_costs[v], np.inf)))
    return local_search(core, choice)


def local_search(
    core: CoreProblem, start: Sequence[int], sweeps: int = 4
) -> tuple[int, ...] | None:
    """``start`` improved by iterated conditional modes (each node not under a
    memory constraint in turn takes its best strategy given its neighbours',
    for up to ``sweeps`` sweeps), or None if the result is forbidden or breaks
    a memory constraint."""
    adj: list[list[tuple[np.ndarray, int]]] = [[] for _ in core.node_costs]
    for e in core.edges:
        adj[e.u].append((e.cost, e.v))
        adj[e.v].append((e.cost.T, e.u))
    mem = core.node_memory
    coupled = {v for live in core.live_sets for v in live}
    choice = list(start)
    for _ in range(sweeps):
        changed = False
        for v, cost in enumerate(core.node_costs):
            if v in coupled:
                continue
            local = cost.copy()
            for matrix, w in adj[v]:
                local += matrix[:, choice[w]]
            best = int(np.argmin(local))
            if local[best] < local[choice[v]]:
                choice[v], changed = best, True
        if not changed:
            break
    total = sum(float(c[s]) for c, s in zip(core.node_costs, choice, strict=True))
    total += sum(float(e.cost[choice[e.u], choice[e.v]]) for e in core.edges)
    if not np.isfinite(total):
        return None
    if mem is not None:
        for live, budget in zip(core.live_sets, core.live_budgets, strict=True):
            if sum(float(mem[v][choice[v]]) for v in live) > budget:
                return None
    return tuple(choice)
