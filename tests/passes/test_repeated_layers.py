"""Sharing the ILP variables of repeated layers (``alpa_ir.solvers.repeated``).

The tied problem must price every plan it allows exactly as the original
problem does, find the repeated nodes without names, keep the nodes near the
model's ends apart, and, in the pass, give plans that compute what one device
computes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zoo_fixtures import fresh

from alpa_ir.passmanager.pass_statistics import statistic
from alpa_ir.solvers import MipSolver
from alpa_ir.solvers.ilp import Edge, ILPProblem, brute_force, evaluate
from alpa_ir.solvers.repeated import colours, tie_repeated


def layered(
    layers: int, seed: int, head: bool = True, width: int = 3, sizes: tuple[int, ...] = (2, 3, 2)
) -> ILPProblem:
    """A chain of identical layers (the same costs in each) between a distinct
    head and tail node; inside a layer a small graph with a cycle."""
    rng = np.random.default_rng(seed)
    inner = [rng.integers(0, 9, s).astype(float) for s in sizes]
    local = [
        (0, 1, rng.integers(0, 9, (sizes[0], sizes[1])).astype(float)),
        (1, 2, rng.integers(0, 9, (sizes[1], sizes[2])).astype(float)),
        (0, 2, rng.integers(0, 9, (sizes[0], sizes[2])).astype(float)),
    ]
    link = rng.integers(0, 9, (sizes[2], sizes[0])).astype(float)  # layer -> next layer
    costs: list[np.ndarray] = []
    edges: list[Edge] = []
    if head:
        costs.append(np.array([0.0, 5.0]))
    for k in range(layers):
        base = len(costs)
        costs.extend(c.copy() for c in inner)
        edges.extend(Edge(base + a, base + b, m.copy()) for a, b, m in local)
        if k:
            edges.append(Edge(base - width + 2, base, link.copy()))
        elif head:
            edges.append(Edge(0, base, np.array([[0.0] * sizes[0], [3.0] * sizes[0]])))
    if head:
        costs.append(np.array([1.0, 0.0]))
        edges.append(Edge(len(costs) - 2, len(costs) - 1, np.ones((sizes[2], 2))))
    return ILPProblem(tuple(costs), tuple(edges))


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 7), st.integers(0, 2**32 - 1))
def test_tied_objective_is_the_expanded_plans_objective(layers: int, seed: int) -> None:
    problem = layered(layers, seed)
    tied = tie_repeated(problem, rounds=1)
    assert tied is not None and tied.problem.num_nodes < problem.num_nodes
    rng = np.random.default_rng(seed)
    for _ in range(20):
        choice = tuple(int(rng.integers(len(c))) for c in tied.problem.node_costs)
        assert evaluate(tied.problem, choice) == pytest.approx(
            evaluate(problem, tied.expand(choice))
        )
    best = brute_force(tied.problem)
    exact = MipSolver("highs").solve(problem)
    assert best.objective >= exact.objective - 1e-9  # it only allows fewer plans


def test_copies_share_and_the_ends_stay_apart() -> None:
    problem = layered(8, seed=1)
    tied = tie_repeated(problem, rounds=2)
    assert tied is not None
    variable = tied.variable_of
    # Middle layers (nodes 1 + 3k .. 3 + 3k) share their variables ...
    for k in range(3, 6):
        assert variable[1 + 3 * k : 4 + 3 * k] == variable[1 + 3 * 3 : 4 + 3 * 3]
    # ... the head, the tail and the first layer (next to the head) do not.
    assert variable[0] not in variable[1:-1]
    assert variable[-1] not in variable[:-1]
    assert variable[1] != variable[1 + 3 * 3]


def test_nothing_repeats_or_budget_gives_none() -> None:
    rng = np.random.default_rng(0)
    distinct = ILPProblem(
        tuple(rng.random(3) for _ in range(5)),
        tuple(Edge(k, k + 1, rng.random((3, 3))) for k in range(4)),
    )
    assert tie_repeated(distinct) is None
    budgeted = ILPProblem(
        layered(5, 0).node_costs,
        layered(5, 0).edges,
        node_memory=tuple(np.ones(len(c)) for c in layered(5, 0).node_costs),
        liveness=((0, 1),),
        memory_budget=10.0,
    )
    assert tie_repeated(budgeted) is None


def test_colours_see_edge_costs() -> None:
    """Two nodes with equal costs but differently priced edges differ."""
    costs = (np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2))
    a = Edge(0, 1, np.array([[0.0, 1.0], [1.0, 0.0]]))
    b = Edge(2, 3, np.array([[0.0, 2.0], [2.0, 0.0]]))
    c = colours(ILPProblem(costs, (a, b)), rounds=1)
    assert c[0] != c[2] and c[1] != c[3]


def test_self_edge_becomes_diagonal() -> None:
    """Adjacent copies of one variable take the same strategy: their edge
    contributes its diagonal only."""
    costs = tuple(np.array([0.0, 0.0]) for _ in range(4))
    swap = np.array([[5.0, 0.0], [0.0, 5.0]])  # each copy would like the other choice
    edges = (Edge(0, 1, swap), Edge(1, 2, swap), Edge(2, 3, swap), Edge(3, 0, swap))
    tied = tie_repeated(ILPProblem(costs, edges), rounds=2)
    assert tied is not None and tied.problem.num_nodes == 1
    assert list(tied.problem.node_costs[0]) == [20.0, 20.0]


# ---------------------------------------------------------------------------
# In the pass: shared variables still give plans equal to one device.
# ---------------------------------------------------------------------------


def test_parallelize_with_shared_layers_matches_one_device() -> None:
    assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")
    import jax

    from alpa_ir import AutoShardingOption, LogicalDeviceMesh, ShardParallel, parallelize
    from alpa_ir.models import make_train_step
    from alpa_ir.models.gpt import GPTConfig

    config = GPTConfig(
        vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, seq_len=16, batch_size=8
    )
    fn, args = make_train_step(config)
    results = {}
    for mode in ("share", "separate"):
        option = AutoShardingOption(repeated_layers=mode)
        step = parallelize(
            fn, method=ShardParallel(LogicalDeviceMesh((2, 4)), auto_sharding_option=option)
        )
        executable = step.get_executable(*args)
        variables = statistic(executable.pass_statistics, "auto-sharding", "num-variables")
        nodes = statistic(executable.pass_statistics, "auto-sharding", "num-nodes")
        results[mode] = (executable.auto_sharding_objective, variables, nodes)
        want = jax.jit(fn)(*args)  # first: the step donates its state
        got = step(*fresh(args))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
    (shared, shared_vars, nodes), (exact, exact_vars, _) = results["share"], results["separate"]
    assert shared_vars < exact_vars == nodes
    assert shared >= exact * (1 - 1e-9)


def test_auto_shares_only_large_graphs_with_many_strategy_pairs() -> None:
    """``repeated-layers=auto`` keeps the exact ILP for small graphs and for
    large ones of few strategies per node (1-D meshes), and shares for large
    graphs of many pairs (2-D meshes), where the exact LP gets slow."""
    from alpa_ir.autosharding.planner import (
        SHARE_LAYERS_FROM,
        SHARE_PAIRS_FROM,
        share_automatically,
    )

    def chain(nodes: int, strategies: int) -> ILPProblem:
        costs = tuple(np.zeros(strategies) for _ in range(nodes))
        matrix = np.ones((strategies, strategies))
        return ILPProblem(costs, tuple(Edge(k, k + 1, matrix) for k in range(nodes - 1)))

    wide = int(np.ceil(np.sqrt(SHARE_PAIRS_FROM / (SHARE_LAYERS_FROM - 1)))) + 1
    assert not share_automatically(chain(SHARE_LAYERS_FROM - 1, 25))
    assert not share_automatically(chain(SHARE_LAYERS_FROM, 4))
    assert share_automatically(chain(SHARE_LAYERS_FROM, wide))
