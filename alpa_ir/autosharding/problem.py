"""From a strategy graph to the ILP of Alpa's Eq. 1, with memory and alias
constraints, and the options that restrict the strategy space."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.dialects import func
from xdsl.ir import SSAValue

from alpa_ir.autosharding.graph import StrategyGraph, value_local_bytes
from alpa_ir.autosharding.node_strategy import value_column
from alpa_ir.autosharding.resharding import ReshardCoster
from alpa_ir.dialects.lax import ConstantOp
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.solvers.ilp import Edge, ILPProblem


@dataclass(frozen=True)
class Aliasing:
    """Output ``output`` of @main is the new value of donated input ``input``."""

    output: int
    input: int


def liveness_sets(
    function: func.FuncOp, graph: StrategyGraph, donated: set[int]
) -> tuple[tuple[int, ...], ...]:
    """Node sets live together at the program's memory peaks.

    A node is live from its first op until the last use of any value it
    defines (returned values: to the end). Arguments are live from the start;
    a donated argument until its last use, any other argument to the end (the
    caller keeps it). Only sets that are not contained in a neighbouring
    time's set are kept: they are the candidates for the peak.
    """
    block = function.body.block
    ops = list(block.ops)
    position = {op: t for t, op in enumerate(ops)}
    end = len(ops)
    start: dict[int, int] = {}
    last: dict[int, int] = {}
    for arg in block.args:
        node = graph.node_of_value[arg]
        start[node] = 0
        last[node] = -1 if arg.index in donated else end
    for node in graph.nodes:
        if node.ops:
            start[node.index] = min(position[op] for op in node.ops)
            last.setdefault(node.index, start[node.index])
    for op in ops:
        t = position[op]
        for opd in op.operands:
            value = graph.alias.get(opd, opd)
            node = graph.node_of_value.get(value)
            if node is not None:
                last[node] = max(last.get(node, t), end if op is block.last_op else t)
    events: list[set[int]] = []
    for t in range(end + 1):
        events.append({n for n in start if start[n] <= t <= last.get(n, start[n])})
    peaks = []
    for t, live in enumerate(events):
        prev = events[t - 1] if t > 0 else set()
        nxt = events[t + 1] if t + 1 < len(events) else set()
        if (not live <= prev and not live <= nxt) or (live == prev == nxt and t == 0):
            peaks.append(tuple(sorted(live)))
    return tuple(dict.fromkeys(peaks))


def node_memory(
    graph: StrategyGraph, function: func.FuncOp, mesh_shape: Sequence[int]
) -> tuple[np.ndarray, ...]:
    """Per node and strategy: bytes per device of the node's values that
    outlive it (used by other nodes or returned) — its in-group temporaries
    are short-lived and not counted."""
    escaping: dict[int, list[SSAValue]] = {n.index: [] for n in graph.nodes}
    block = function.body.block
    for value, node in graph.node_of_value.items():
        if (
            any(
                graph.node_of_value.get(use.operation.results[0] if use.operation.results else None)
                != node
                or use.operation is block.last_op
                for use in value.uses
            )
            or graph.nodes[node].arg is not None
        ):
            escaping[node].append(value)
    out = []
    for n in graph.nodes:
        mem = np.zeros(len(n.strategies), dtype=np.float64)
        for v in escaping[n.index]:
            mem += [
                value_local_bytes(v, spec, mesh_shape) for spec in value_column(n.strategies, v)
            ]
        out.append(mem)
    return tuple(out)


def alias_edges(
    graph: StrategyGraph, function: func.FuncOp, aliases: Sequence[Aliasing], coster: ReshardCoster
) -> list[Edge]:
    """Edges pricing a donated input and its new value returned in different
    specs: the output is resharded to the input's spec before it is returned
    (so that the next step gets what this one took). Alpa forbids the
    mismatch outright; pricing it keeps every choice feasible and lets the
    ILP weigh it like any other reshard."""
    ret = function.body.block.last_op
    assert ret is not None
    edges = []
    for alias in aliases:
        arg = function.body.block.args[alias.input]
        out_value = ret.operands[alias.output]
        out_value = graph.alias.get(out_value, out_value)
        if isinstance(out_value.owner, ConstantOp) or out_value is arg:
            continue
        u, v = graph.node_of_value[arg], graph.node_of_value[out_value]
        if u == v:
            continue
        src = value_column(graph.nodes[u].strategies, arg)
        dst = value_column(graph.nodes[v].strategies, out_value)
        shape, itemsize = shape_of(arg.type), dtype_of(arg.type).itemsize
        matrix = np.array([[coster.cost(b, a, shape, itemsize) for b in dst] for a in src])
        edges.append(Edge(u, v, matrix))
    return edges


def build_problem(
    graph: StrategyGraph,
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    *,
    memory_budget: float | None = None,
    aliases: Sequence[Aliasing] = (),
    donated: set[int] | None = None,
    node_scale: np.ndarray | None = None,
    coster: ReshardCoster | None = None,
) -> ILPProblem:
    """The ILP: node costs, edge costs, alias edges, and (with a budget) memory."""
    costs = []
    for node in graph.nodes:
        c = np.array([s.cost for s in node.strategies], dtype=np.float64)
        if node_scale is not None:
            c = c * node_scale[node.index]
        costs.append(c)
    edges = [Edge(u, v, m) for (u, v), m in graph.edges.items()]
    if node_scale is not None:
        edges = [Edge(e.u, e.v, e.cost * max(node_scale[e.u], node_scale[e.v])) for e in edges]
    if aliases:
        assert coster is not None, "pricing aliases needs the reshard coster"
        edges += alias_edges(graph, function, aliases, coster)
    memory = liveness = None
    if memory_budget:
        memory = node_memory(graph, function, mesh_shape)
        liveness = liveness_sets(function, graph, donated or set())
    return ILPProblem(
        node_costs=tuple(costs),
        edges=tuple(edges),
        node_memory=memory,
        liveness=liveness or (),
        memory_budget=memory_budget or None,
        node_names=tuple(n.name for n in graph.nodes),
    )
