"""Exact presolve of the auto-sharding ILP: shrink the problem, keep the optimum.

Each reduction keeps at least one optimal plan (and the optimal value) and
records how to map the reduced problem's choice back:

- parallel edges (and both orientations of a pair) are summed into one;
  self-loops fold their diagonal into the node cost;
- *forbidden* strategies go: an ``inf`` node cost, or an edge row that is
  ``inf`` for every remaining strategy of the neighbour (arc consistency);
- an edge whose matrix is additive, ``R[i, j] = a_i + b_j`` (constant and zero
  matrices included), is folded into the two node costs;
- *dominated* strategies go (dead-end elimination, Goldstein's criterion):
  strategy ``i`` of ``v`` when another strategy ``k`` is no worse whatever the
  neighbours choose, ``c[k] - c[i] + Σ_w max_j (R_vw[k, j] - R_vw[i, j]) <= 0``,
  and (when ``v`` is under a memory constraint) needs no more memory; of
  equivalent strategies the lowest index stays;
- with a memory budget, a live set that holds whatever the plan is dropped; a
  node whose memory is the same for all its strategies leaves its live sets
  (their budgets shrink by it); a strategy whose extra memory exceeds a live
  set's slack (its budget minus every member's smallest memory) goes;
- a node without memory coupling and with at most two neighbours is
  eliminated (variable elimination in the min-plus semiring): degree 0 takes
  its best strategy, degree 1 (a leaf) folds ``min_j R[i, j] + c[j]`` into its
  neighbour, degree 2 (a chain link between ``u`` and ``w``) becomes the edge
  ``M[i, k] = min_j R_uv[i, j] + c_v[j] + R_vw[j, k]``. Graphs of tree width
  two (chains, trees, series-parallel graphs) vanish entirely.

Tolerances are one-sided: an additive fold accepts a residual of 1e-12 of the
matrix's magnitude, memory reductions act only when clearly implied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.solvers.ilp import Edge, ILPProblem

ADDITIVE_RTOL = 1e-12
MEMORY_RTOL = 1e-9
_CHUNK = 4_000_000  # elements per broadcast block


@dataclass(frozen=True)
class CoreProblem:
    """What is left for the ILP solver, in its own node numbering."""

    nodes: tuple[int, ...]
    """Original node of each core node."""
    strategies: tuple[np.ndarray, ...]
    """Original strategy indices of each core node's strategies."""
    node_costs: tuple[np.ndarray, ...]
    edges: tuple[Edge, ...]
    """At most one edge per pair, ``u < v``; may hold ``inf``."""
    node_memory: tuple[np.ndarray, ...] | None
    live_sets: tuple[tuple[int, ...], ...]
    live_budgets: tuple[float, ...]
    constant: float
    """Cost of the eliminated nodes that the core's objective leaves out."""


@dataclass(frozen=True)
class _Fixed:
    node: int
    strategy: int


@dataclass(frozen=True)
class _Leaf:
    node: int
    neighbour: int
    table: np.ndarray  # neighbour's original strategy -> node's original strategy


@dataclass(frozen=True)
class _Link:
    node: int
    first: int
    second: int
    table: np.ndarray  # [first's strategy, second's strategy] -> node's strategy


@dataclass(frozen=True)
class Presolved:
    """The core problem and the records that map its choice back."""

    core: CoreProblem
    records: tuple[_Fixed | _Leaf | _Link, ...]
    num_nodes: int

    def expand(self, core_choice: Sequence[int]) -> tuple[int, ...]:
        """The original problem's choice for a choice of the core's strategies."""
        choice = [-1] * self.num_nodes
        for c, v in enumerate(self.core.nodes):
            choice[v] = int(self.core.strategies[c][core_choice[c]])
        for rec in reversed(self.records):
            if isinstance(rec, _Fixed):
                choice[rec.node] = rec.strategy
            elif isinstance(rec, _Leaf):
                choice[rec.node] = int(rec.table[choice[rec.neighbour]])
            else:
                choice[rec.node] = int(rec.table[choice[rec.first], choice[rec.second]])
        return tuple(choice)


class Infeasible(Exception):
    """Presolve found a node with no strategy left; ``reason`` says why (one line)."""

    def __init__(self, node: int, reason: str, memory: bool) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason
        self.memory = memory


def presolve(problem: ILPProblem, *, reduce: bool = True, memory: bool = True) -> Presolved:
    """Reduce ``problem`` (validated). ``reduce=False`` only merges parallel edges;
    ``memory=False`` ignores the memory budget. Raises :class:`Infeasible`."""
    return _Reducer(problem, reduce=reduce, memory=memory).run()


def consistent_strategies(problem: ILPProblem) -> Presolved:
    """Only arc consistency: every strategy that is not forbidden outright, with no
    memory reasoning (what a minimum-memory search may choose from)."""
    return _Reducer(problem, reduce=False, memory=False, forbid=True).run()


class _Reducer:
    def __init__(
        self, problem: ILPProblem, *, reduce: bool, memory: bool, forbid: bool | None = None
    ) -> None:
        self.problem = problem
        self.reduce = reduce
        self.forbid = reduce if forbid is None else forbid
        n = problem.num_nodes
        self.sizes = [c.shape[0] for c in problem.node_costs]
        self.alive = [np.arange(s) for s in self.sizes]
        self.cost = [np.asarray(c, dtype=np.float64).copy() for c in problem.node_costs]
        self.adj: list[dict[int, None]] = [{} for _ in range(n)]
        self.edges: dict[tuple[int, int], np.ndarray] = {}
        self.edge_names: dict[tuple[int, int], str] = {}
        # what is known of an edge's matrix since it last changed (dropped on a change)
        self.finite: dict[tuple[int, int], bool] = {}  # no forbidden (inf) pair
        self.not_additive: set[tuple[int, int]] = set()  # checked by _fold_additive
        for e in problem.edges:
            self._add_edge(e.u, e.v, np.asarray(e.cost, dtype=np.float64), original=True)
        self.eliminated = [False] * n
        self.records: list[_Fixed | _Leaf | _Link] = []
        self.constant = 0.0
        self.mem: list[np.ndarray] | None = None
        self.node_live: list[set[int]] = [set() for _ in range(n)]
        self.live: dict[int, set[int]] = {}
        self.rhs: dict[int, float] = {}
        self.queue: deque[int] = deque(range(n))
        self.queued = [True] * n
        if memory and problem.memory_budget is not None and problem.liveness:
            assert problem.node_memory is not None
            self.mem = [np.asarray(m, dtype=np.float64).copy() for m in problem.node_memory]
            self._init_live_sets(problem.liveness, float(problem.memory_budget))

    # -- graph bookkeeping --------------------------------------------------

    def _name(self, v: int) -> str:
        return self.problem.node_name(v)

    def _add_edge(self, u: int, v: int, matrix: np.ndarray, original: bool) -> None:
        if u == v:
            self.cost[u] = self.cost[u] + np.diagonal(matrix)
            return
        key, m = ((u, v), matrix) if u < v else ((v, u), matrix.T)
        self._changed(key)
        if key in self.edges:
            self.edges[key] = self.edges[key] + m
        else:
            self.edges[key] = np.array(m, dtype=np.float64)
            self.adj[u][v] = None
            self.adj[v][u] = None
            self.edge_names[key] = (
                f"edge {self._name(u)} -> {self._name(v)}"
                if original
                else f"the edge {self._name(key[0])} - {self._name(key[1])} "
                "left by eliminating the nodes between them"
            )

    @staticmethod
    def _key(v: int, w: int) -> tuple[int, int]:
        """Edge (v, w)'s key in ``edges``: its ends in order."""
        return (v, w) if v < w else (w, v)

    def _changed(self, key: tuple[int, int]) -> None:
        """Forget what was known of edge ``key``'s matrix."""
        self.finite.pop(key, None)
        self.not_additive.discard(key)

    def _is_finite(self, key: tuple[int, int]) -> bool:
        """Whether edge ``key`` forbids no pair (kept until the edge changes)."""
        found = self.finite.get(key)
        if found is None:
            found = self.finite[key] = bool(np.isfinite(self.edges[key]).all())
        return found

    def _edge(self, v: int, w: int) -> np.ndarray:
        """The matrix of edge (v, w) with v's strategies on axis 0."""
        return self.edges[(v, w)] if v < w else self.edges[(w, v)].T

    def _drop_edge(self, v: int, w: int) -> None:
        key = self._key(v, w)
        self._changed(key)
        del self.edges[key]
        del self.adj[v][w]
        del self.adj[w][v]

    def _push(self, v: int) -> None:
        if not self.queued[v] and not self.eliminated[v]:
            self.queued[v] = True
            self.queue.append(v)

    def _restrict(self, v: int, keep: np.ndarray, reason: str, memory: bool = False) -> bool:
        """Keep only the strategies ``keep`` of ``v``; True if any went."""
        if keep.all():
            return False
        if not keep.any():
            raise Infeasible(v, reason, memory)
        if self.mem is not None and self.node_live[v]:
            old_min, old_max = self.mem[v].min(), self.mem[v].max()
            self.mem[v] = self.mem[v][keep]
            d_min, d_max = self.mem[v].min() - old_min, self.mem[v].max() - old_max
            for k in self.node_live[v]:
                self.minsum[k] += d_min
                self.maxsum[k] += d_max
        elif self.mem is not None:
            self.mem[v] = self.mem[v][keep]
        self.alive[v] = self.alive[v][keep]
        self.cost[v] = self.cost[v][keep]
        for w in self.adj[v]:
            key = self._key(v, w)
            self.not_additive.discard(key)  # fewer strategies may make it additive
            if not self.finite.get(key, True):
                del self.finite[key]  # fewer strategies may leave no inf (a finite one stays so)
            self.edges[key] = self.edges[key][keep] if v < w else self.edges[key][:, keep]
            self._push(w)
        self._push(v)
        return True

    # -- memory -------------------------------------------------------------

    def _init_live_sets(self, liveness: Sequence[Sequence[int]], budget: float) -> None:
        sets = list(dict.fromkeys(frozenset(int(v) for v in live) for live in liveness if live))
        containing: dict[int, list[int]] = {}
        for k, live in enumerate(sets):
            for v in live:
                containing.setdefault(v, []).append(k)
        self.minsum: dict[int, float] = {}
        self.maxsum: dict[int, float] = {}
        assert self.mem is not None
        for k, live in enumerate(sets):
            if self.reduce:  # a subset of another live set is implied by it
                rare = min(live, key=lambda v: len(containing[v]))
                if any(len(sets[j]) > len(live) and live <= sets[j] for j in containing[rare]):
                    continue
            self.live[k] = set(live)
            self.rhs[k] = budget
            self.minsum[k] = float(sum(self.mem[v].min() for v in live))
            self.maxsum[k] = float(sum(self.mem[v].max() for v in live))
            for v in live:
                self.node_live[v].add(k)

    def _drop_live_set(self, k: int) -> None:
        for v in self.live.pop(k):
            self.node_live[v].discard(k)
            self._push(v)
        del self.rhs[k], self.minsum[k], self.maxsum[k]

    def _memory(self, v: int) -> bool:
        assert self.mem is not None
        mem = self.mem[v]
        if mem.max() == mem.min():  # the same for every strategy: a constant
            for k in list(self.node_live[v]):
                self.live[k].discard(v)
                self.rhs[k] -= mem[0]
                self.minsum[k] -= mem[0]
                self.maxsum[k] -= mem[0]
                self.node_live[v].discard(k)
                self._check_live_set(k)
            return False
        keep = np.ones(mem.shape[0], dtype=bool)
        excess = mem - mem.min()
        for k in list(self.node_live[v]):
            tol = MEMORY_RTOL * max(abs(self.rhs[k]), self.maxsum[k], 1.0)
            keep &= excess <= self.rhs[k] - self.minsum[k] + tol
            self._check_live_set(k)
        reason = f"node {self._name(v)} fits the memory budget with none of its strategies"
        return self._restrict(v, keep, reason, memory=True)

    def _check_live_set(self, k: int) -> None:
        """Drop live set ``k`` if it holds for every plan; raise
        :class:`Infeasible` if its members left it (each of a constant memory)
        holding more than the budget: no plan fits it."""
        if k in self.live:
            tol = MEMORY_RTOL * max(abs(self.rhs[k]), self.maxsum[k], 1.0)
            if not self.live[k] and self.rhs[k] < -tol:
                raise Infeasible(
                    -1,
                    f"a live set's fixed memory exceeds the budget by {-self.rhs[k]:g} bytes",
                    True,
                )
            if self.maxsum[k] <= self.rhs[k] - tol or not self.live[k]:
                self._drop_live_set(k)

    # -- reductions ---------------------------------------------------------

    def _forbidden(self, v: int) -> bool:
        keep = np.isfinite(self.cost[v])
        if not keep.any():
            raise Infeasible(
                v, f"node {self._name(v)} has no allowed strategy (every cost is inf)", False
            )
        culprit = ""
        for w in self.adj[v]:
            if self._is_finite(self._key(v, w)):
                continue  # every row has a finite pair
            rows = np.isfinite(self._edge(v, w)).any(axis=1)
            if not (rows & keep).any() and not culprit:
                culprit = self.edge_names[self._key(v, w)]
            keep &= rows
        reason = (
            f"{culprit} forbids every pair of remaining strategies (all inf)"
            if culprit
            else f"node {self._name(v)} has no strategy allowed by all its edges (inf costs)"
        )
        return self._restrict(v, keep, reason)

    def _fold_additive(self, v: int) -> None:
        for w in list(self.adj[v]):
            key = self._key(v, w)
            if key in self.not_additive or not self._is_finite(key):
                continue
            m = self._edge(v, w)
            a = m[:, 0]
            b = m[0, :] - m[0, 0]
            residual = np.abs(m - a[:, None] - b[None, :]).max()
            if residual <= ADDITIVE_RTOL * max(np.abs(m).max(), 1e-300):
                self.cost[v] = self.cost[v] + a
                self.cost[w] = self.cost[w] + b
                self._drop_edge(v, w)
                self._push(w)
            else:
                self.not_additive.add(key)

    def _dominated(self, v: int) -> bool:
        """Dead-end elimination (Goldstein's criterion): drop ``i`` if some ``k`` is
        no worse for every choice of the neighbours, i.e.
        ``c[k] - c[i] + Σ_w max_j (R_vw[k, j] - R_vw[i, j]) <= 0``
        (and, under a memory constraint, ``mem[k] <= mem[i]``)."""
        size = self.cost[v].shape[0]
        if size <= 1:
            return False
        worse = self.cost[v][:, None] - self.cost[v][None, :]  # [k, i]
        with np.errstate(invalid="ignore"):
            for w in self.adj[v]:
                m = self._edge(v, w)
                finite = self._is_finite(self._key(v, w))
                step = max(1, _CHUNK // (size * m.shape[1]))
                for lo in range(0, size, step):
                    diff = m[lo : lo + step, None, :] - m[None, :, :]
                    if not finite:
                        diff[np.isnan(diff)] = -np.inf  # both forbidden: no constraint
                    worse[lo : lo + step] += diff.max(axis=2)
            dominates = worse <= 0
        if self.node_live[v]:
            assert self.mem is not None
            dominates &= self.mem[v][:, None] <= self.mem[v][None, :]
        idx = np.arange(size)
        dominates &= ~dominates.T | (idx[:, None] < idx[None, :])
        np.fill_diagonal(dominates, False)
        return self._restrict(v, ~dominates.any(axis=0), "unreachable")

    def _eliminate(self, v: int) -> None:
        nbrs = list(self.adj[v])
        cost = self.cost[v]
        if not nbrs:
            j = int(np.argmin(cost))
            self.constant += float(cost[j])
            self.records.append(_Fixed(v, int(self.alive[v][j])))
        elif len(nbrs) == 1:
            (w,) = nbrs
            total = self._edge(w, v) + cost[None, :]
            best = np.argmin(total, axis=1)
            table = np.full(self.sizes[w], -1, dtype=np.int64)
            table[self.alive[w]] = self.alive[v][best]
            self.cost[w] = self.cost[w] + total[np.arange(total.shape[0]), best]
            self._drop_edge(v, w)
            self.records.append(_Leaf(v, w, table))
            self._push(w)
        else:
            u, w = nbrs
            left, right = self._edge(u, v) + cost[None, :], self._edge(v, w)
            merged = np.empty((left.shape[0], right.shape[1]))
            best = np.empty(merged.shape, dtype=np.int64)
            step = max(1, _CHUNK // (left.shape[1] * right.shape[1]))
            for lo in range(0, left.shape[0], step):
                block = left[lo : lo + step, :, None] + right[None, :, :]
                best[lo : lo + step] = np.argmin(block, axis=1)
                merged[lo : lo + step] = np.take_along_axis(
                    block, best[lo : lo + step, None, :], axis=1
                )[:, 0, :]
            table = np.full((self.sizes[u], self.sizes[w]), -1, dtype=np.int64)
            table[np.ix_(self.alive[u], self.alive[w])] = self.alive[v][best]
            self._drop_edge(u, v)
            self._drop_edge(v, w)
            self._add_edge(u, w, merged, original=False)
            self.records.append(_Link(v, u, w, table))
            self._push(u)
            self._push(w)
        self.eliminated[v] = True

    def _process(self, v: int) -> None:
        changed = True
        while changed:
            changed = self.forbid and self._forbidden(v)
            if not self.reduce:
                continue
            self._fold_additive(v)
            if self.mem is not None and self.node_live[v]:
                changed = self._memory(v) or changed
            changed = self._dominated(v) or changed
        if self.reduce and not self.node_live[v] and len(self.adj[v]) <= 2:
            self._eliminate(v)

    def run(self) -> Presolved:
        while self.queue:
            v = self.queue.popleft()
            self.queued[v] = False
            if not self.eliminated[v]:
                self._process(v)
        core_nodes = [v for v in range(len(self.cost)) if not self.eliminated[v]]
        index = {v: c for c, v in enumerate(core_nodes)}
        edges = tuple(Edge(index[a], index[b], m) for (a, b), m in sorted(self.edges.items()))
        live_keys = sorted(self.live)
        core = CoreProblem(
            nodes=tuple(core_nodes),
            strategies=tuple(self.alive[v] for v in core_nodes),
            node_costs=tuple(self.cost[v] for v in core_nodes),
            edges=edges,
            node_memory=None if self.mem is None else tuple(self.mem[v] for v in core_nodes),
            live_sets=tuple(tuple(sorted(index[v] for v in self.live[k])) for k in live_keys),
            live_budgets=tuple(self.rhs[k] for k in live_keys),
            constant=self.constant,
        )
        return Presolved(core, tuple(self.records), len(self.cost))
