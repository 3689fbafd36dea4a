"""validate_problem: a malformed ILP problem is one line naming the array at fault."""

from __future__ import annotations

import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.solvers.ilp import Edge, ILPProblem, validate_problem


def _problem(**changes: object) -> ILPProblem:
    costs = [np.array([1.0, 2.0]), np.array([0.0, 3.0, 1.0]), np.array([4.0])]
    edges = [Edge(0, 1, np.zeros((2, 3))), Edge(1, 2, np.ones((3, 1)))]
    fields: dict[str, object] = {"node_costs": tuple(costs), "edges": tuple(edges)}
    fields.update(changes)
    return ILPProblem(**fields)  # type: ignore[arg-type]


def _with_node(v: int, cost: object) -> ILPProblem:
    costs = list(_problem().node_costs)
    costs[v] = cost  # type: ignore[call-overload]
    return _problem(node_costs=tuple(costs))


def _with_edge(k: int, cost: object) -> ILPProblem:
    edges = list(_problem().edges)
    edges[k] = Edge(edges[k].u, edges[k].v, cost)  # type: ignore[arg-type]
    return _problem(edges=tuple(edges))


def test_a_sound_problem_passes() -> None:
    validate_problem(_problem())
    validate_problem(_problem(node_costs=(np.array([1, 2]),), edges=()))  # integers are numbers
    validate_problem(_problem(edges=(Edge(0, 1, np.full((2, 3), np.inf)),)))  # inf: forbidden


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (_with_node(1, np.array([0.0, np.nan, 1.0])), "node 1 cost holds NaN or -inf"),
        (_with_node(2, np.array([-np.inf])), "node 2 cost holds NaN or -inf"),
        (_with_node(0, np.array([True, False])), "node 0 cost must hold real numbers, not bool"),
        (_with_node(0, np.array([1j, 2.0])), "node 0 cost must hold real numbers"),
        (_with_node(1, np.zeros((3, 1))), "node 1 cost must be a 1-d numpy array"),
        (_with_node(2, [4.0]), "node 2 cost must be a 1-d numpy array"),
        (_with_node(2, np.array([])), "node 2 has no strategies"),
        (_with_edge(1, np.array([[1.0], [np.nan], [0.0]])), r"edge 1 \(1 -> 2\) cost holds NaN"),
        (_with_edge(0, np.full((2, 3), -np.inf)), r"edge 0 \(0 -> 1\) cost holds NaN or -inf"),
        (_with_edge(0, np.zeros(6)), r"edge 0 \(0 -> 1\) cost must be a 2-d numpy array"),
        (_with_edge(0, np.zeros((3, 2))), r"edge 0 \(0 -> 1\) cost has shape \(3, 2\)"),
    ],
)
def test_a_bad_array_is_named(problem: ILPProblem, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as info:
        validate_problem(problem)
    assert "\n" not in str(info.value)
