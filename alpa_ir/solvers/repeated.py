"""Sharing the strategy variables of repeated layers (an approximation).

A model of ``L`` identical layers gives an ILP with ``L`` copies of the same
nodes; exact solvers pay for every copy. :func:`tie_repeated` finds the
copies structurally, without names: nodes get colours from their own costs and
are refined a few rounds by the colours and edge matrices around them
(Weisfeiler-Lehman), so nodes whose neighbourhood up to ``rounds`` edges away
looks the same get the same colour, while the first and last layers, which see
the model's ends, keep their own. Every colour with at least ``min_repeats``
nodes becomes one variable.

The tied problem is exact for the plans it allows: node costs and edge
matrices of the copies add up, an edge between two copies of one variable
becomes its diagonal (both ends take the same strategy), so its objective of
a choice equals the original objective of the expanded choice. It only allows
fewer plans: its optimum is an upper bound of the original one, equal to it
whenever the best plan treats identical layers alike (the usual case; the
benchmark reports both where the exact one is affordable). Memory budgets are
not supported (a live set would count a tied variable several times).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from alpa_ir.solvers.ilp import Edge, ILPProblem


@dataclass(frozen=True)
class TiedProblem:
    """A problem over shared variables and the way back to the original nodes."""

    problem: ILPProblem
    variable_of: tuple[int, ...]
    """Original node -> variable of the tied problem."""

    def expand(self, choice: tuple[int, ...]) -> tuple[int, ...]:
        """A choice of the tied problem as a choice of the original one."""
        return tuple(choice[t] for t in self.variable_of)


def _array_key(a: np.ndarray) -> tuple[tuple[int, ...], bytes]:
    """An array's shape and values, as a dictionary key."""
    return a.shape, np.ascontiguousarray(a, dtype=np.float64).tobytes()


def colours(problem: ILPProblem, rounds: int) -> list[int]:
    """Per node, a colour shared by nodes whose costs and surroundings up to
    ``rounds`` edges away are the same. Colours are small integers, each the
    index of a distinct (colour, sorted neighbour colours) of its round: no
    hashing, so no two different surroundings can share one."""
    n = problem.num_nodes
    memory = problem.node_memory
    ids: dict[object, int] = {}

    def colour_of(key: object) -> int:
        return ids.setdefault(key, len(ids))

    colour = [
        colour_of(
            (
                _array_key(problem.node_costs[v]),
                _array_key(memory[v]) if memory is not None else None,
            )
        )
        for v in range(n)
    ]
    incident: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for e in problem.edges:  # the matrix as seen from each end
        incident[e.u].append((colour_of(("out", _array_key(e.cost))), e.v))
        incident[e.v].append((colour_of(("in", _array_key(e.cost.T))), e.u))
    for _ in range(rounds):
        colour = [
            colour_of((colour[v], tuple(sorted((key, colour[w]) for key, w in incident[v]))))
            for v in range(n)
        ]
    return colour


def tie_repeated(problem: ILPProblem, rounds: int = 3, min_repeats: int = 3) -> TiedProblem | None:
    """The problem with one variable per colour that repeats ``min_repeats``
    times or more, or None if nothing repeats (or a memory budget is set)."""
    if problem.memory_budget is not None:
        return None
    colour = colours(problem, rounds)
    count: dict[int, int] = defaultdict(int)
    for c in colour:
        count[c] += 1
    variable_of: list[int] = []
    variable_of_colour: dict[int, int] = {}
    representatives: list[int] = []
    for v, c in enumerate(colour):
        shared = count[c] >= min_repeats
        if shared and c in variable_of_colour:
            variable_of.append(variable_of_colour[c])
            continue
        variable_of.append(len(representatives))
        if shared:
            variable_of_colour[c] = len(representatives)
        representatives.append(v)
    if len(representatives) == problem.num_nodes:
        return None
    costs = [
        np.zeros_like(np.asarray(problem.node_costs[r], dtype=np.float64)) for r in representatives
    ]
    for v, cost in enumerate(problem.node_costs):
        costs[variable_of[v]] = costs[variable_of[v]] + cost
    edges: dict[tuple[int, int], np.ndarray] = {}
    for e in problem.edges:
        u, v, cost = variable_of[e.u], variable_of[e.v], e.cost
        if u == v:  # two copies of one variable: they take the same strategy
            costs[u] = costs[u] + np.diagonal(cost)
            continue
        if u > v:
            u, v, cost = v, u, cost.T
        edges[u, v] = edges[u, v] + cost if (u, v) in edges else cost
    names = problem.node_names
    tied = ILPProblem(
        node_costs=tuple(costs),
        edges=tuple(Edge(u, v, cost) for (u, v), cost in edges.items()),
        node_names=tuple(names[r] for r in representatives) if names is not None else None,
    )
    return TiedProblem(tied, tuple(variable_of))
