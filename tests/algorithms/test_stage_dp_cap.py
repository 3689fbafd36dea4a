"""The stage DP's relaxed memory counter (issue #42): a ``t_max`` with no plan
leaves the cap the next solve starts from where it was."""

from __future__ import annotations

import numpy as np

from alpa_ir.algorithms.stage_dp import _prepare, _solve_at, stage_dp


def _problem() -> tuple[np.ndarray, np.ndarray]:
    """Six layers on six devices: one-layer stages on one device (1 s each, at
    most 3 stages after them: six of them never fit) or all six layers on all
    six devices (10 s)."""
    layers = 6
    costs = np.full((layers, layers, 2), np.inf)
    limits = np.full((layers, layers, 2), np.inf)
    for k in range(layers):
        costs[k, k, 0] = 1.0
        limits[k, k, 0] = 3
    costs[0, layers - 1, 1] = 10.0
    return costs, limits


def test_a_t_max_without_a_plan_does_not_raise_the_starting_cap() -> None:
    costs, limits = _problem()
    problem = _prepare(costs, np.array([1, 6]), 6, 4, limits)
    assert problem.num_states - 1 > 2  # the exact counter is larger than the relaxations
    start = [0]
    # below 10 s only the one-device stages are allowed: the relaxed DP finds
    # six of them, the exact counter refuses them; no plan, and the cap stays low
    assert _solve_at(problem, 1.0, start) is None
    assert start == [0]
    found = _solve_at(problem, 10.0, start)
    assert found is not None and found.stages == ((0, 5, 1),)


def test_the_plan_is_the_single_stage_one() -> None:
    costs, limits = _problem()
    result = stage_dp(costs, [1, 6], 6, 4, limits)
    assert result.stages == ((0, 5, 1),)
    assert result.total_latency == 10.0 + 3 * 10.0  # Eq. 2 at 4 micro-batches
