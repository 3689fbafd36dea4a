"""Fresh outputs break ties towards fewer bytes per device (Alpa's replicated penalty).

Alpa adds a *replicated penalty* (``round(all_reduce_cost(1, 0) +
all_reduce_cost(1, 1))``) to the replicated strategy of the ops that create
a tensor: parameters, random draws (``kRng``, ``kRngBitGenerator``) and
broadcasts; its test_mlp's closed form counts it once per parameter and
once per optimizer state leaf. It is a tie-break: whenever communication
leaves two plans at the same price, the one that keeps less on each device
wins. Here the inputs get theirs (``REPLICATED_PARAMETER_PENALTY``, in the
planner); this module gives the same to a returned value that is not the new
value of a donated input (whose spec the input's own penalty settles):
:data:`OUTPUT_TIE_PENALTY` over its number of shards. So an init function's
weights (random draws) and Adam moments (broadcast zeros) come back sharded,
not whole on every device, when nothing else tells the plans apart (Alpa's
test_weight_init). The penalty is left out of the objective reported.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np
from xdsl.dialects import func

from alpa_ir.autosharding.graph import StrategyGraph
from alpa_ir.autosharding.node_strategy import value_column
from alpa_ir.dialects.types import shape_of
from alpa_ir.solvers.ilp import ILPProblem

OUTPUT_TIE_PENALTY = 1e-6
"""Objective added for a fresh output kept whole on every device (divided by
its number of shards): the inputs' ``REPLICATED_PARAMETER_PENALTY``."""


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


def with_output_ties(
    graph: StrategyGraph,
    problem: ILPProblem,
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    aliased_outputs: Collection[int],
) -> ILPProblem:
    """``problem`` with the fresh outputs' ties added to their nodes' costs;
    the ties are kept on ``graph`` (``output_ties``) so that the objective can
    be reported without them."""
    graph.output_ties = output_ties(graph, function, mesh_shape, aliased_outputs)
    if not graph.output_ties:
        return problem
    costs = list(problem.node_costs)
    for n, tie in graph.output_ties.items():
        costs[n] = costs[n] + tie
    return replace(problem, node_costs=tuple(costs))
