"""Exact solution of a core without memory constraints by bucket elimination.

Variable elimination in the min-plus semiring: eliminating node ``u`` replaces
every factor that mentions ``u`` by one factor over the rest of their nodes,
``f(x_N) = min_j c_u[j] + Σ_f f(j, x_N)``, and remembers the minimising ``j``.
After the last node the optimum is known; replaying the steps backwards gives
the plan. It is exact for any graph; its cost is the size of the largest
factor, which the presolve's chain and leaf eliminations keep small for
layered graphs (a transformer's layers meet through two or three tensors).

What makes it practical here is that factors are kept over *classes* of
strategies, not strategies: a resharding cost depends only on the specs at its
two ends, so a factor only distinguishes the strategies of a node that its
table tells apart. Each factor carries, per node, a map strategy -> class;
eliminating ``u`` first collapses ``u``'s strategies that no factor tells
apart (keeping the cheapest), then works on the common refinement of each
neighbour's classes, and finally merges the new table's equal slices. Nodes
are eliminated smallest-table first. :func:`eliminate` gives up (returns
None) when a table would exceed ``max_table`` entries, and the caller falls
back to the ILP.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from dataclasses import dataclass

import numpy as np

from alpa_ir.solvers.presolve import CoreProblem

MAX_TABLE = 1 << 28
SOFT_TABLE = 1 << 20
_CHUNK = 1 << 22
MAX_WORK = 3e9


@dataclass
class _Factor:
    nodes: tuple[int, ...]
    maps: tuple[np.ndarray, ...]  # per node: strategy -> class (an axis index of table)
    table: np.ndarray


@dataclass(frozen=True)
class _Step:
    node: int
    scope: tuple[int, ...]
    maps: tuple[np.ndarray, ...]  # per scope node: strategy -> index into best
    best: np.ndarray  # the node's best strategy for each combination of scope classes


@functools.lru_cache(maxsize=1024)
def _projection(seed: int, length: int) -> np.ndarray:
    """:func:`row_classes`' random weights for ``length`` columns, drawn from
    ``seed`` (read-only; kept: drawing them took 40 % of a call)."""
    weights = np.random.default_rng(seed).random(length) + 0.5
    weights.flags.writeable = False
    return weights


def row_classes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``rows`` [n, k] -> (class of each row, first row of each class).

    Rows are sorted by a random projection and equal neighbours merged: equal
    rows always land in one class unless a projection collision separates
    them, which only costs compression (classes stay a refinement)."""
    n = rows.shape[0]
    if n <= 1:
        return np.zeros(n, dtype=np.int64), np.zeros(min(n, 1), dtype=np.int64)
    weights = _projection(n, rows.shape[1])
    values = rows.astype(np.float64, copy=False)
    keys = np.where(values == np.inf, 1e300, values) @ weights  # forbidden pairs: large
    order = np.argsort(keys, kind="stable")
    ordered = rows[order]
    new = np.ones(n, dtype=bool)
    new[1:] = ~(ordered[1:] == ordered[:-1]).all(axis=1)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return inverse, order[new]


def _compress(table: np.ndarray, maps: list[np.ndarray]) -> np.ndarray:
    """Merge equal slices of ``table`` along each axis, updating ``maps``."""
    for axis in range(table.ndim):
        if table.shape[axis] <= 1:
            continue
        inverse, first = row_classes(np.moveaxis(table, axis, 0).reshape(table.shape[axis], -1))
        if first.shape[0] < table.shape[axis]:
            table = np.take(table, first, axis=axis)
            maps[axis] = inverse[maps[axis]]
    return table


class _Eliminator:
    def __init__(
        self,
        core: CoreProblem,
        max_table: int,
        max_work: float,
        deadline: float | None = None,
        cpu_deadline: float | None = None,
    ) -> None:
        self.deadline = deadline
        self.cpu_deadline = cpu_deadline
        self.unary = [np.asarray(c, dtype=np.float64).copy() for c in core.node_costs]
        self.factors: dict[int, _Factor] = {}
        self.incident: list[set[int]] = [set() for _ in self.unary]
        self.max_table = max_table
        self.max_work = max_work
        self.work = 0.0
        self.constant = 0.0
        self.steps: list[_Step] = []
        self.next_id = 0
        for e in core.edges:
            rows, _ = row_classes(e.cost)
            cols, _ = row_classes(e.cost.T)
            table = np.empty((rows.max() + 1, cols.max() + 1))
            table[rows[:, None], cols[None, :]] = e.cost
            self._add(_Factor((e.u, e.v), (rows, cols), table))

    def _add(self, factor: _Factor) -> None:
        fid = self.next_id
        self.next_id += 1
        self.factors[fid] = factor
        for v in factor.nodes:
            self.incident[v].add(fid)

    def priority(self, u: int) -> float:
        """Min-fill times table size: the size bounds the work of eliminating ``u``
        now, the fill (neighbour pairs without a common factor) what it adds."""
        classes: dict[int, int] = {}
        for fid in self.incident[u]:
            f = self.factors[fid]
            for v, n in zip(f.nodes, f.table.shape, strict=True):
                classes[v] = classes.get(v, 1) * n
        size = math.prod(min(n, self.unary[v].shape[0]) for v, n in classes.items())
        neighbours = set(classes) - {u}
        linked = {
            (v, w)
            for v in neighbours
            for fid in self.incident[v]
            for w in self.factors[fid].nodes
            if w in neighbours and v < w
        }
        fill = len(neighbours) * (len(neighbours) - 1) // 2 - len(linked)
        return float(size) * (fill + 1)

    def _plan(self, u: int) -> tuple[list[int], np.ndarray, tuple[int, ...], list, list, int]:
        """What eliminating ``u`` needs: its factors, its cheapest strategy per group
        of strategies that no factor tells apart, the scope, each scope node's
        refined classes and their first strategies, and the table size."""
        fids = sorted(self.incident[u])
        factors = [self.factors[f] for f in fids]
        cost = self.unary[u]
        if factors:
            key = np.stack([f.maps[f.nodes.index(u)] for f in factors], axis=1)
            group, _ = row_classes(key)
        else:
            group = np.zeros(cost.shape[0], dtype=np.int64)
        order = np.lexsort((np.arange(cost.shape[0]), cost, group))
        _, first = np.unique(group[order], return_index=True)
        group_best = order[first]
        scope = tuple(sorted({v for f in factors for v in f.nodes} - {u}))
        refined, reps = [], []
        for w in scope:
            maps_w = [f.maps[f.nodes.index(w)] for f in factors if w in f.nodes]
            r, rep = row_classes(np.stack(maps_w, axis=1))
            refined.append(r)
            reps.append(rep)
        size = group_best.shape[0] * math.prod(rep.shape[0] for rep in reps)
        return fids, group_best, scope, refined, reps, size

    def eliminate(
        self, u: int, plan: tuple[list[int], np.ndarray, tuple[int, ...], list, list, int]
    ) -> None:
        fids, group_best, scope, refined, reps, size = plan
        factors = [self.factors.pop(f) for f in fids]
        for fid, f in zip(fids, factors, strict=True):
            for v in f.nodes:
                self.incident[v].discard(fid)
        self.work += size * max(len(factors), 1)
        shape = (group_best.shape[0], *(rep.shape[0] for rep in reps))
        table = np.empty(shape[1:])
        best_group = np.empty(shape[1:], dtype=np.int64)
        rows = shape[1] if scope else 1
        step = max(1, _CHUNK // max(size // rows, 1))
        for lo in range(0, rows, step):  # in slices of the first scope axis: bounded memory
            hi = min(lo + step, rows)
            chunk = (shape[0], hi - lo, *shape[2:]) if scope else shape
            total = np.empty(chunk)
            total[...] = self.unary[u][group_best].reshape((-1,) + (1,) * len(scope))
            for f in factors:
                index, axes = [], []
                for v, m in zip(f.nodes, f.maps, strict=True):
                    a = 0 if v == u else scope.index(v) + 1
                    index.append(
                        m[group_best]
                        if a == 0
                        else m[reps[a - 1][lo:hi] if a == 1 else reps[a - 1]]
                    )
                    axes.append(a)
                sub = f.table[np.ix_(*index)].transpose(np.argsort(axes))
                view = [1] * len(chunk)
                for a in sorted(axes):
                    view[a] = chunk[a]
                total += sub.reshape(view)
            arg = np.argmin(total, axis=0)
            at = slice(lo, hi) if scope else ...
            best_group[at] = arg
            table[at] = np.take_along_axis(total, arg[None], axis=0)[0]
        self.steps.append(_Step(u, scope, tuple(refined), group_best[best_group]))
        if not scope:
            self.constant += float(table)
        elif len(scope) == 1:
            self.unary[scope[0]] = self.unary[scope[0]] + table[refined[0]]
        else:
            maps = [np.arange(n) for n in table.shape]
            table = _compress(table, maps)
            self._add(
                _Factor(scope, tuple(m[r] for m, r in zip(maps, refined, strict=True)), table)
            )

    def run(self) -> tuple[tuple[int, ...], float] | None:
        n = len(self.unary)
        version = [0] * n
        heap = [(self.priority(u), 0, u) for u in range(n)]
        heapq.heapify(heap)
        done = [False] * n
        deferred: set[int] = set()  # nodes whose table is over the current cap
        cap = min(SOFT_TABLE, self.max_table)
        while heap or deferred:
            if not heap:  # everything left is over the cap: raise it
                if cap >= self.max_table:
                    return None
                cap = min(cap * 4, self.max_table)
                heap = [(self.priority(v), version[v], v) for v in deferred]
                heapq.heapify(heap)
                deferred.clear()
            _, ver, u = heapq.heappop(heap)
            if done[u] or ver != version[u]:
                continue
            plan = self._plan(u)
            if plan[-1] > cap:
                deferred.add(u)
                continue
            if self.work + plan[-1] > self.max_work:
                return None
            if self.deadline is not None and time.perf_counter() > self.deadline:
                return None
            if self.cpu_deadline is not None and time.thread_time() > self.cpu_deadline:
                return None
            neighbours = plan[2]
            self.eliminate(u, plan)
            done[u] = True
            for v in neighbours:
                version[v] += 1
                deferred.discard(v)
                heapq.heappush(heap, (self.priority(v), version[v], v))
        choice = [0] * n
        for step in reversed(self.steps):
            at = tuple(int(m[choice[v]]) for v, m in zip(step.scope, step.maps, strict=True))
            choice[step.node] = int(step.best[at])
        return tuple(choice), self.constant


def estimated_work(core: CoreProblem, limit: float = math.inf) -> float:
    """An upper estimate of the work of eliminating the core, from its graph
    alone (strategy counts, no classes), smallest table first; stops counting
    once over ``limit``. Cheap: it spares hopeless eliminations (a graph of
    many cycles, e.g. repeated layers tied into one)."""
    size = [float(len(c)) for c in core.node_costs]
    neighbours: list[set[int]] = [set() for _ in size]
    for e in core.edges:
        neighbours[e.u].add(e.v)
        neighbours[e.v].add(e.u)

    def table(u: int) -> float:
        return size[u] * math.prod(size[v] for v in neighbours[u])

    heap = [(table(u), u) for u in range(len(size))]
    heapq.heapify(heap)
    done = [False] * len(size)
    work = 0.0
    while heap and work <= limit:
        t, u = heapq.heappop(heap)
        if done[u] or t != table(u):
            continue
        done[u] = True
        work += t * max(len(neighbours[u]), 1)
        scope = neighbours[u]
        for v in scope:
            neighbours[v].discard(u)
            neighbours[v] |= scope - {v}
        for v in scope:
            heapq.heappush(heap, (table(v), v))
    return work


HOPELESS = 1000.0
"""Elimination is not tried when :func:`estimated_work` exceeds ``max_work``
this many times (the estimate ignores class merging, which saves up to ~100x)."""


def eliminate(
    core: CoreProblem,
    max_table: int = MAX_TABLE,
    max_work: float = MAX_WORK,
    deadline: float | None = None,
    cpu_budget: float | None = None,
) -> tuple[tuple[int, ...], float] | None:
    """The optimal choice of the core's strategies and its objective (``inf`` if
    every choice is forbidden), or None if the tables grow too large or the
    clock (``time.perf_counter()``) passes ``deadline``, or the calling thread
    has spent ``cpu_budget`` seconds of CPU time in it (a budget that, unlike
    the clock, does not shrink when other processes load the machine, so the
    same problem takes the same path and gets the same answer under any load). The core must have no
    live sets."""
    assert not core.live_sets
    if estimated_work(core, HOPELESS * max_work) > HOPELESS * max_work:
        return None
    cpu_deadline = None if cpu_budget is None else time.thread_time() + cpu_budget
    return _Eliminator(core, max_table, max_work, deadline, cpu_deadline).run()
