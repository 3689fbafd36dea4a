"""What the communication cost leaves free, settled as XLA and Alpa would.

Two adjustments of an auto-sharding problem, neither of them a price of
communication (the objective reported leaves them out):

- **Dead code costs nothing.** Ops whose results nothing returned depends
  on (Flax's ``init`` runs the model's forward pass and drops its output) are
  removed by XLA before anything runs, so their strategies and the reshards
  into them are free for the solver; only forbidden choices stay forbidden.
  Otherwise the dead forward pass keeps the weights it reads whole. After
  the solve each dead node takes its cheapest strategy given its operands'
  (:func:`pick_dead`), so that the plan written adds no collectives for it.
- **Fresh outputs break ties towards fewer bytes per device.** A returned
  value that is not the new value of a donated input (whose spec the input's
  own penalty already settles) gets :data:`OUTPUT_TIE_PENALTY` over its
  number of shards, as the planner's inputs get theirs: an init function's
  weights and optimizer state come back sharded (Alpa's replicated
  penalty), not whole on every device, when nothing else tells the plans
  apart.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Block, Operation

from alpa_ir.autosharding.graph import StrategyGraph
from alpa_ir.autosharding.node_strategy import value_column
from alpa_ir.dialects.types import shape_of
from alpa_ir.solvers.ilp import Edge, ILPProblem

OUTPUT_TIE_PENALTY = 1e-6
"""Objective added for a fresh output kept whole on every device (divided by
its number of shards): the inputs' ``REPLICATED_PARAMETER_PENALTY``."""


def dead_ops(block: Block) -> set[Operation]:
    """The ops of ``block`` whose results nothing the block returns depends on
    (an op without results, e.g. the return, is live)."""
    live: set[Operation] = set()
    dead: set[Operation] = set()
    for op in reversed(list(block.ops)):
        if isinstance(op, func.ReturnOp) or not op.results:
            live.add(op)
            continue
        for result in op.results:
            for use in result.uses:
                user: Operation | None = use.operation
                while user is not None and user.parent_block() is not block:
                    user = user.parent_op()  # a use inside a region: its op in the block
                if user is None or user in live:
                    break
            else:
                continue
            live.add(op)
            break
        else:
            dead.add(op)
    return dead


def output_ties(
    graph: StrategyGraph,
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    aliased_outputs: Collection[int],
) -> dict[int, np.ndarray]:
    """Per node defining a returned value of ``function`` (not an argument,
    not a scalar, not among ``aliased_outputs``), the penalty of each of its
    strategies (module docstring)."""
    ties: dict[int, np.ndarray] = {}
    ret = function.body.block.last_op
    if not isinstance(ret, func.ReturnOp):
        return ties
    values = [v for k, v in enumerate(ret.operands) if k not in aliased_outputs]
    for value in dict.fromkeys(graph.alias.get(v, v) for v in values):
        n = graph.node_of_value.get(value)
        shape = shape_of(value.type)
        if n is None or graph.nodes[n].arg is not None or not shape:
            continue
        specs = value_column(graph.nodes[n].strategies, value)
        penalty = np.array(
            [
                OUTPUT_TIE_PENALTY
                / math.prod(s.num_shards(mesh_shape, d) for d in range(len(shape)))
                for s in specs
            ],
            dtype=np.float64,
        )
        ties[n] = ties[n] + penalty if n in ties else penalty
    return ties


def _free(costs: np.ndarray) -> np.ndarray:
    """``costs`` with every allowed choice at 0 (forbidden ones stay forbidden)."""
    return np.where(np.isfinite(costs), 0.0, costs)


def settle_free_choices(
    graph: StrategyGraph,
    problem: ILPProblem,
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    aliased_outputs: Collection[int],
) -> ILPProblem:
    """``problem`` with dead code free and fresh outputs' ties added (module
    docstring); the ties are kept on ``graph`` (``output_ties``) so that the
    objective can be reported without them."""
    dead = dead_ops(function.body.block)
    dead_nodes = {
        n.index for n in graph.nodes if n.arg is None and n.ops and all(o in dead for o in n.ops)
    }
    graph.dead_costs = {k: problem.node_costs[k] for k in sorted(dead_nodes)}
    graph.dead_edges = tuple(e for e in problem.edges if e.v in dead_nodes)
    costs = [_free(c) if k in dead_nodes else c for k, c in enumerate(problem.node_costs)]
    edges = tuple(replace(e, cost=_free(e.cost)) if e.v in dead_nodes else e for e in problem.edges)
    graph.output_ties = output_ties(graph, function, mesh_shape, aliased_outputs)
    for n, tie in graph.output_ties.items():
        costs[n] = costs[n] + tie
    if not dead_nodes and not graph.output_ties:
        return problem
    return replace(problem, node_costs=tuple(costs), edges=edges)


def pick_dead(graph: StrategyGraph, choice: Sequence[int]) -> list[int]:
    """``choice`` with each dead node (in order, producers first) on its
    cheapest strategy given the strategies of the nodes it reads: free for
    the solver, the choice of a dead node changes no live cost, so the plan
    written reshards nothing for dead code that it need not."""
    out = list(choice)
    if not graph.dead_costs:
        return out
    into: dict[int, list[Edge]] = {}
    for e in graph.dead_edges:
        assert isinstance(e, Edge)
        into.setdefault(e.v, []).append(e)
    for v, own in graph.dead_costs.items():
        total = np.array(own, dtype=np.float64)
        for e in into.get(v, ()):
            total = total + e.cost[out[e.u], :]
        if np.isfinite(total).any() and np.isfinite(total[out[v]]):
            best = int(np.argmin(total))
            if total[best] < total[out[v]]:
                out[v] = best
    return out
