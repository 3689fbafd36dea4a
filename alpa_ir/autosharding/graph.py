"""The strategy graph of a module on a mesh: the nodes the ILP chooses for.

A node is a group formed by ``merge-trivial-ops`` (its leader op and the
trivial ops merged into it) or a function argument. A node's strategies are
its leader's strategies; each follower then takes, for every leader
strategy, its own strategy that is cheapest given the specs its in-group
operands arrive in (Alpa's "follow"). A strategy fixes the spec of every
value the node defines, the spec every operand of its ops must arrive in,
and the node's communication (all-reduces of partial results and in-group
reshards). An edge between two nodes prices, for every pair of strategies,
the reshards of the values flowing from one to the other.

Pipeline markers and optimization barriers are transparent: their results
are their operands. Constants are replicated and reshard for free.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.autosharding.factors import (
    Strategy,
    deferred_strategies,
    enumerate_strategies,
    replicated_strategy,
)
from alpa_ir.autosharding.node_strategy import (
    GroupRenaming,
    NodeStrategy,
    RenamedStrategy,
    operand_column,
    value_column,
)
from alpa_ir.autosharding.resharding import INF, ReshardCoster, local_nbytes
from alpa_ir.autosharding.rules import LINEAR_PRIMITIVES, RULES, TRANSPARENT_PRIMITIVES
from alpa_ir.dialects.lax import ConstantOp, LaxOp, PrimitiveOp
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.dialects.types import dtype_of, is_key_type, shape_of

RuleLookup = Callable[[str], Callable[[LaxOp], object] | None]


@dataclass
class Node:
    index: int
    name: str
    ops: list[Operation]
    arg: SSAValue | None = None
    strategies: list[NodeStrategy] = field(default_factory=list)


@dataclass
class StrategyGraph:
    nodes: list[Node]
    # (u, v) -> cost matrix [S_u, S_v]
    edges: dict[tuple[int, int], np.ndarray]
    node_of_value: dict[SSAValue, int]
    alias: dict[SSAValue, SSAValue]
    # Values by which op they are consumed: (consumer op, operand index) -> resolved value.
    uses: list[tuple[Operation, int, SSAValue]]
    output_ties: dict[int, np.ndarray] = field(default_factory=dict)
    """Per node defining a fresh returned value, the tie-breaking penalty the
    planner added to each strategy (:mod:`alpa_ir.autosharding.tie_breaks`)."""


def _itemsize(value: SSAValue) -> int:
    return dtype_of(value.type).itemsize


def _mixed_spec(spec: ShardingSpec, mesh_shape: Sequence[int]) -> bool:
    """Whether ``spec`` splits one dimension over several mesh axes (of size > 1)."""
    return any(sum(mesh_shape[a] > 1 for a in axes) > 1 for axes in spec.dims)


def _mixed(strategy: Strategy, mesh_shape: Sequence[int]) -> bool:
    return any(
        _mixed_spec(s, mesh_shape) for s in (*strategy.operand_specs, *strategy.result_specs)
    )


def _batch_split(
    strategies: list[Strategy],
    batch: tuple[tuple[str, int, int], ...],
    axis: int,
    whole: bool = False,
) -> list[Strategy]:
    """The strategies that split every batch dimension of the op over ``axis``,
    or with ``whole`` (the axis has size 1, as Alpa's forced batch axis of a
    model-parallel mesh) split none of them (none when no strategy can: the
    caller then keeps them all)."""

    def splits(s: Strategy) -> bool:
        for where, k, dim in batch:
            spec = s.operand_specs[k] if where == "o" else s.result_specs[k]
            if dim >= spec.rank:
                return False
            if (spec.dims[dim] != ()) if whole else (axis not in spec.dims[dim]):
                return False
        return True

    return [s for s in strategies if splits(s)]


def _keys_replicated(op: Operation, strategies: list[Strategy]) -> list[Strategy]:
    """The strategies that keep every PRNG key operand and result replicated:
    a key is one value, drawn from whole on every device."""
    operands = [k for k, t in enumerate(op.operand_types) if is_key_type(t)]
    results = [k for k, t in enumerate(op.result_types) if is_key_type(t)]
    if not operands and not results:
        return strategies
    return [
        s
        for s in strategies
        if not any(s.operand_specs[k].used_axes() for k in operands)
        and not any(s.result_specs[k].used_axes() or s.result_specs[k].partial for k in results)
    ]


def pending_sum_ops(block: Block) -> dict[Operation, bool]:
    """The ops through which a partial sum can reach an addition of partial
    sums (``add_any``: JAX's sum of the gradients of a value used twice):
    backwards from its operands through linear ops (additions, transposes,
    reshapes, float conversions) to the ops that make partial sums. Only
    these get :func:`deferred_strategies`, which keeps the strategy space
    as it was everywhere else. The value says whether the op may leave its
    sum pending: its value has one use (on the way to the addition), and
    that use is not the function's return (a result leaves the function
    complete: the next stage of a pipeline, its apply-grad function, takes
    its arguments whole)."""

    def uses(value: SSAValue) -> int:  # through transparent ops
        n = 0
        for use in value.uses:
            if isinstance(use.operation, func.ReturnOp):
                n += 2  # never pending out of the function
            elif _primitive(use.operation) in TRANSPARENT_PRIMITIVES:
                n += uses(use.operation.results[use.index])
            else:
                n += 1
        return n

    def single_use(op: Operation) -> bool:
        return len(op.results) == 1 and uses(op.results[0]) == 1

    adds = [op for op in block.ops if _primitive(op) == "add_any"]
    found = {op: single_use(op) for op in adds}
    work = [v for op in adds for v in op.operands]
    while work:
        value = work.pop()
        op = value.owner
        if not isinstance(op, Operation) or op in found:
            continue
        name = _primitive(op)
        if name in TRANSPARENT_PRIMITIVES or name in LINEAR_PRIMITIVES:
            work.extend(op.operands)
        elif name == "scatter-add":  # adds into its operand: that may be pending too
            work.append(op.operands[0])
        found[op] = single_use(op)
    return {op: keep for op, keep in found.items() if _primitive(op) not in TRANSPARENT_PRIMITIVES}


def _primitive(op: Operation) -> str | None:
    return op.primitive_name if isinstance(op, LaxOp) else None


def spec_options(shape: tuple[int, ...], mesh_shape: Sequence[int]) -> list[ShardingSpec]:
    """Every spec a tensor of ``shape`` can take on the mesh."""
    from alpa_ir.autosharding.factors import FactorKind, FactorRule

    rule = FactorRule(
        tuple(shape),
        tuple(FactorKind.PASS_THROUGH for _ in shape),
        ((),),
        (tuple((d,) for d in range(len(shape))),),
    )
    return [s.result_specs[0] for s in enumerate_strategies(rule, mesh_shape)]


@dataclass
class StrategyCache:
    """What graph builders on one mesh can share across functions: op
    strategies (they depend on the op and the mesh shape), group strategies
    (on the group's structure and the reshard prices, through the followers'
    choices) and edge matrices (on the specs and the prices). One cache serves
    one mesh shape and one :class:`ReshardCoster` (α/β, cost model, options);
    planning many functions on the same mesh, as stage construction does,
    then enumerates each distinct op and group once. Group strategies are
    kept with the ops of the first group they were built for and mapped onto
    later groups of the same structure."""

    mesh_shape: tuple[int, ...]
    coster: ReshardCoster
    op_strategies: dict[tuple[object, ...], list[Strategy]] = field(default_factory=dict)
    groups: dict[tuple[object, ...], tuple[list[Operation], list[NodeStrategy]]] = field(
        default_factory=dict
    )
    matrices: dict[tuple[object, ...], np.ndarray] = field(default_factory=dict)


class GraphBuilder:
    """Builds the strategy graph of ``function`` given the groups of its ops
    (memoizing in ``cache``, a fresh one unless given)."""

    def __init__(
        self,
        function: func.FuncOp,
        groups: dict[Operation, int],
        mesh_shape: Sequence[int],
        coster: ReshardCoster,
        rule_lookup: RuleLookup | None = None,
        arg_filter: Callable[[int, SSAValue, ShardingSpec], float] | None = None,
        cache: StrategyCache | None = None,
        batch_axis: tuple[dict[SSAValue, int], int] | None = None,
        allow_mixed_mesh_shape: bool = True,
        hints: dict[Operation, list[ShardingSpec]] | None = None,
        allow_recompute_heavy_op: bool = False,
    ) -> None:
        self.function = function
        self.groups = groups
        self.mesh_shape = tuple(mesh_shape)
        self.coster = coster
        self.rule_lookup = rule_lookup or RULES.get
        self.arg_filter = arg_filter
        self.batch_axis = batch_axis
        self.allow_mixed_mesh_shape = allow_mixed_mesh_shape
        self.allow_recompute_heavy_op = allow_recompute_heavy_op
        """Heavy ops may leave mesh axes unused (replicated computation on them)."""
        self.hints = hints or {}
        """The user's sharding hints (:mod:`alpa_ir.autosharding.hints`): the only
        specs a hint op's value may take, its operand arriving in the same."""
        """(batch dimension of each value, mesh axis): every op must split its
        batch dimension over that axis where it can (force-batch-dim-to-mesh-dim)."""
        self.warned: set[str] = set()
        self.pending = pending_sum_ops(function.body.block)
        if cache is None:
            cache = StrategyCache(self.mesh_shape, coster)
        elif cache.mesh_shape != self.mesh_shape or cache.coster is not coster:
            raise ValueError("GraphBuilder: the strategy cache belongs to another mesh or coster")
        self._strategy_cache = cache.op_strategies
        self._group_cache = cache.groups
        self._matrix_cache = cache.matrices

    # -- strategies of one op ------------------------------------------------

    def op_strategies(self, op: Operation) -> list[Strategy]:
        """The op's strategies; identical ops (same primitive, parameters and
        types, e.g. the same matmul in every transformer layer) share them.
        A hinted op has one strategy per spec its hint allows."""
        hinted = self.hints.get(op)
        if hinted is not None:
            return [Strategy(f"hint {s}", (s,), (s,)) for s in hinted]
        batch = self._batch_positions(op)
        pending = self.pending.get(op)
        key = (*_op_key(op), batch, pending) if batch or pending is not None else _op_key(op)
        cached = self._strategy_cache.get(key)
        if cached is None:
            cached = self._op_strategies(op, pending)
            if batch:
                axis = self.batch_axis[1]  # type: ignore[index]
                whole = self.mesh_shape[axis] == 1
                cached = _batch_split(cached, batch, axis, whole) or cached
            if not self.allow_mixed_mesh_shape:
                cached = [s for s in cached if not _mixed(s, self.mesh_shape)] or cached
            self._strategy_cache[key] = cached
        return cached

    def _batch_positions(self, op: Operation) -> tuple[tuple[str, int, int], ...]:
        """(operand/result, index, batch dim) of the op's values with a batch dimension."""
        if self.batch_axis is None:
            return ()
        dims = self.batch_axis[0]
        out = [("o", k, dims[v]) for k, v in enumerate(op.operands) if v in dims]
        out += [("r", k, dims[v]) for k, v in enumerate(op.results) if v in dims]
        return tuple(out)

    def _op_strategies(self, op: Operation, pending: bool | None = None) -> list[Strategy]:
        operand_ranks = [len(shape_of(t)) for t in op.operand_types]
        result_ranks = [len(shape_of(t)) for t in op.result_types]
        if isinstance(op, LaxOp | PrimitiveOp):  # a plugin may give rules to any primitive
            rule_fn = self.rule_lookup(op.primitive_name)
            if rule_fn is not None:
                rule = rule_fn(op)
                if rule.heavy and self.allow_recompute_heavy_op:
                    rule = replace(rule, heavy=False)
                strategies = enumerate_strategies(rule, self.mesh_shape)  # type: ignore[arg-type]
                if pending is not None:
                    strategies += deferred_strategies(rule, strategies, self.mesh_shape, pending)  # type: ignore[arg-type]
                strategies = _keys_replicated(op, strategies)
                if strategies:
                    return strategies
        name = getattr(op, "primitive_name", op.name)
        if name not in self.warned:
            self.warned.add(name)
            warnings.warn(
                f"auto-sharding: no sharding rule for primitive '{name}'; it runs replicated",
                stacklevel=3,
            )
        return [replicated_strategy(operand_ranks, result_ranks)]

    def comm_cost(self, op: Operation, strategy: Strategy) -> float:
        total = 0.0
        for value, spec, final in zip(
            op.results, strategy.result_specs, strategy.final_result_specs, strict=True
        ):
            if spec.partial:
                total += self.coster.cost(
                    spec, final, shape_of(value.type), _itemsize(value), strategy.reduce
                )
        return total

    # -- the graph --------------------------------------------------------------

    def build(self) -> StrategyGraph:
        block: Block = self.function.body.block
        alias: dict[SSAValue, SSAValue] = {}
        nodes: list[Node] = []
        node_of_value: dict[SSAValue, int] = {}
        for k, arg in enumerate(block.args):
            node = Node(len(nodes), arg.name_hint or f"arg{k}", [], arg=arg)
            node.strategies = self._arg_strategies(k, arg)
            node_of_value[arg] = node.index
            nodes.append(node)
        members: dict[int, list[Operation]] = {}
        order: list[int] = []
        for op in block.ops:
            if isinstance(op, ConstantOp | func.ReturnOp):
                continue
            if isinstance(op, LaxOp) and op.primitive_name in TRANSPARENT_PRIMITIVES:
                for res, opd in zip(op.results, op.operands, strict=True):
                    alias[res] = alias.get(opd, opd)
                continue
            group = self.groups.get(op)
            key = group if group is not None else -1 - len(order)
            if key not in members:
                members[key] = []
                order.append(key)
            members[key].append(op)
        uses: list[tuple[Operation, int, SSAValue]] = []
        for key in order:
            ops = members[key]
            node = Node(len(nodes), f"{ops[0].name}#{key}", ops)
            for op in ops:
                for res in op.results:
                    node_of_value[res] = node.index
                for k, opd in enumerate(op.operands):
                    uses.append((op, k, alias.get(opd, opd)))
            nodes.append(node)
        for node in nodes:
            if node.arg is None:
                node.strategies = self._group_strategies(node.ops, alias)
        edges = self._edges(nodes, node_of_value, uses)
        return StrategyGraph(nodes, edges, node_of_value, alias, uses)

    def _arg_strategies(self, index: int, arg: SSAValue) -> list[NodeStrategy]:
        shape = shape_of(arg.type)
        out = []
        options = spec_options(shape, self.mesh_shape)
        if not self.allow_mixed_mesh_shape:
            options = [s for s in options if not _mixed_spec(s, self.mesh_shape)]
        if is_key_type(arg.type):  # PRNG keys stay whole on every device
            options = [ShardingSpec.replicated(len(shape))]
        for spec in options:
            cost = self.arg_filter(index, arg, spec) if self.arg_filter else 0.0
            out.append(NodeStrategy(str(spec), cost, {arg: spec}, {}, {}))
        return out

    def _group_strategies(
        self, ops: list[Operation], alias: dict[SSAValue, SSAValue]
    ) -> list[NodeStrategy]:
        """The group's strategies; a group with the same ops wired the same way
        (the same layer repeated) reuses the strategies of the first one."""
        key = _group_key(
            ops, alias, self._batch_positions if self.batch_axis else None, self.pending
        )
        cached = self._group_cache.get(key)
        if cached is None:
            strategies = self._new_group_strategies(ops, alias)
            self._group_cache[key] = (ops, strategies)
            return strategies
        first, strategies = cached
        renaming = GroupRenaming(first, ops)
        return [RenamedStrategy(s, renaming) for s in strategies]

    def _new_group_strategies(
        self, ops: list[Operation], alias: dict[SSAValue, SSAValue]
    ) -> list[NodeStrategy]:
        leader, followers = ops[0], ops[1:]
        out: list[NodeStrategy] = []
        seen: set[tuple[object, ...]] = set()
        # Per follower: its strategies, their own communication, and the
        # (shape, itemsize) of each operand. A follower's best strategy only
        # depends on the specs its in-group operands arrive in: memoized.
        options = {f: self.op_strategies(f) for f in followers}
        own_cost = {f: [self.comm_cost(f, s) for s in options[f]] for f in followers}
        operand_info = {
            f: [(alias.get(v, v), shape_of(v.type), _itemsize(v)) for v in f.operands]
            for f in followers
        }
        result_shapes = {f: [shape_of(r.type) for r in f.results] for f in followers}
        best_for: dict[tuple[object, ...], tuple[int, float]] = {}
        # Each leader strategy twice: followers free to choose take their first
        # cheapest strategy, or keep to the spec the group first gave each shape
        # (e.g. a broadcast of a replicated value follows the leader's batch
        # split, which a plan without all-gathers may need); equal variants
        # are merged below.
        # A group on the way of a pending sum (see pending_sum_ops) also tries
        # its followers taking pending sums as they arrive: greedy followers
        # would complete them before they meet the addend from outside.
        # A third time, followers keep to those specs even where another
        # strategy communicates less inside the group: a bias gradient summed
        # from a batch-split activation, completed whole, so that the bias and
        # its optimizer state can stay replicated, which a plan without
        # all-gathers needs (the cheaper split sum would force them split).
        modes = ["cheapest", "keep", "agree"]
        if any(f in self.pending for f in followers):
            modes.append("pass")
        variants = [(lead, mode) for lead in self.op_strategies(leader) for mode in modes]
        for lead, mode in variants:
            keep = mode in ("keep", "agree")
            specs: dict[SSAValue, ShardingSpec] = dict(
                zip(leader.results, lead.final_result_specs, strict=True)
            )
            usual: dict[tuple[int, ...], ShardingSpec] = {}  # only kept for ``keep``
            if keep:
                for value, spec in [
                    *zip(leader.operands, lead.operand_specs, strict=True),
                    *specs.items(),
                ]:
                    usual.setdefault(shape_of(value.type), spec)
            chosen = {leader: lead}
            operand_specs = {(leader, k): s for k, s in enumerate(lead.operand_specs)}
            cost = self.comm_cost(leader, lead)
            for f in followers:
                arriving = tuple(specs.get(v) for v, _, _ in operand_info[f])
                preferred: tuple[ShardingSpec | None, ...] = ()
                if keep:
                    shapes = [*result_shapes[f], *(shape for _, shape, _ in operand_info[f])]
                    preferred = tuple(usual.get(shape) for shape in shapes)
                key = (f, arriving, preferred, mode == "pass", mode == "agree")
                if key not in best_for:
                    best_for[key] = (
                        _passing_follower(options[f], own_cost[f], arriving)
                        if mode == "pass"
                        else None
                    ) or self._best_follower(
                        options[f],
                        own_cost[f],
                        operand_info[f],
                        arriving,
                        preferred,
                        agree=mode == "agree",
                    )
                index, best_cost = best_for[key]
                best = options[f][index]
                chosen[f] = best
                cost += best_cost
                specs.update(zip(f.results, best.final_result_specs, strict=True))
                if keep:
                    for r, spec in zip(result_shapes[f], best.final_result_specs, strict=True):
                        usual.setdefault(r, spec)
                operand_specs.update({(f, k): s for k, s in enumerate(best.operand_specs)})
            signature = (
                tuple(specs.values()),
                tuple(operand_specs.values()),
            )
            if signature in seen:
                continue
            seen.add(signature)
            out.append(NodeStrategy(lead.name, cost, specs, chosen, operand_specs))
        return out

    def _best_follower(
        self,
        options: list[Strategy],
        own_cost: list[float],
        operand_info: list[tuple[SSAValue, tuple[int, ...], int]],
        arriving: tuple[ShardingSpec | None, ...],
        preferred: tuple[ShardingSpec | None, ...] = (),
        agree: bool = False,
    ) -> tuple[int, float]:
        # Usually a strategy takes the operands exactly as they arrive (an
        # element-wise op follows its input): try those first. Among equally
        # cheap ones, the one that keeps most of its results and outside
        # operands in the specs the group already uses for their shapes.
        # With ``agree``, the strategies that take the operands as they arrive
        # (no new split, even where a split would make a sum cheaper) and keep
        # most of those specs come first, the cheapest of them chosen.
        positions = [k for k, src in enumerate(arriving) if src is not None]

        def agreement(i: int) -> int:
            cand = options[i]
            free = [
                None if arriving[k] is not None else spec
                for k, spec in enumerate(cand.operand_specs)
            ]
            specs = [*cand.final_result_specs, *free]
            return sum(
                1
                for got, want in zip(specs, preferred, strict=True)
                if want is not None and got == want
            )

        exact = [
            i
            for i, cand in enumerate(options)
            if all(cand.operand_specs[k] == arriving[k] for k in positions)
        ]
        if exact and not (agree and preferred):
            cheapest = min(own_cost[i] for i in exact)
            if cheapest == 0.0:
                ties = [i for i in exact if own_cost[i] == 0.0]
                if len(ties) == 1 or not preferred:
                    return ties[0], 0.0
                return max(ties, key=lambda i: (agreement(i), -i)), 0.0
        if agree and preferred:  # the most agreeing of the feasible, then the cheapest
            costs = [self._follower_cost(i, options, own_cost, operand_info, arriving, INF)
                     for i in range(len(options))]  # fmt: skip
            feasible = [i for i in exact if costs[i] < INF] or [
                i for i, c in enumerate(costs) if c < INF
            ]
            if feasible:
                best = min(feasible, key=lambda i: (-agreement(i), costs[i], i))
                return best, costs[best]
        best, best_cost = 0, INF
        for index in range(len(options)):
            c = self._follower_cost(index, options, own_cost, operand_info, arriving, best_cost)
            if c < best_cost:
                best, best_cost = index, c
        return best, best_cost

    def _follower_cost(
        self,
        index: int,
        options: list[Strategy],
        own_cost: list[float],
        operand_info: list[tuple[SSAValue, tuple[int, ...], int]],
        arriving: tuple[ShardingSpec | None, ...],
        bound: float,
    ) -> float:
        """Strategy ``index``'s own cost and that of resharding the in-group
        operands that arrive into it (summed until it reaches ``bound``)."""
        cand = options[index]
        c = own_cost[index]
        for k, src in enumerate(arriving):
            if src is None:
                continue
            if c >= bound:
                break
            _, shape, itemsize = operand_info[k]
            c += self.coster.cost(src, cand.operand_specs[k], shape, itemsize)
        return c

    def _edges(
        self,
        nodes: list[Node],
        node_of_value: dict[SSAValue, int],
        uses: list[tuple[Operation, int, SSAValue]],
    ) -> dict[tuple[int, int], np.ndarray]:
        edges: dict[tuple[int, int], np.ndarray] = {}
        for op, k, value in uses:
            src_node = node_of_value.get(value)
            if src_node is None:  # a constant: replicated, reshards locally
                continue
            dst_node = node_of_value[op.results[0]] if op.results else None
            if dst_node is None or src_node == dst_node:
                continue
            src_specs = value_column(nodes[src_node].strategies, value)
            dst_specs = operand_column(nodes[dst_node].strategies, (op, k))
            matrix = self._cost_matrix(src_specs, dst_specs, shape_of(value.type), _itemsize(value))
            key = (src_node, dst_node)
            edges[key] = edges[key] + matrix if key in edges else matrix
        return edges

    def _cost_matrix(
        self,
        src: list[ShardingSpec],
        dst: list[ShardingSpec],
        shape: tuple[int, ...],
        itemsize: int,
    ) -> np.ndarray:
        key = (tuple(src), tuple(dst), shape, itemsize)
        cached = self._matrix_cache.get(key)
        if cached is not None:
            return cached
        src_unique = list(dict.fromkeys(src))
        dst_unique = list(dict.fromkeys(dst))
        table = np.array(
            [[self.coster.cost(a, b, shape, itemsize) for b in dst_unique] for a in src_unique],
            dtype=np.float64,
        )
        row_of = {spec: i for i, spec in enumerate(src_unique)}
        col_of = {spec: i for i, spec in enumerate(dst_unique)}
        rows = np.array([row_of[s] for s in src])
        cols = np.array([col_of[s] for s in dst])
        matrix = table[np.ix_(rows, cols)]
        matrix.flags.writeable = False  # shared by every edge with the same specs
        self._matrix_cache[key] = matrix
        return matrix


def _passing_follower(
    options: list[Strategy], own_cost: list[float], arriving: tuple[ShardingSpec | None, ...]
) -> tuple[int, float] | None:
    """The cheapest strategy that takes a pending sum exactly as it arrives (None
    when no operand arrives pending, or no strategy takes it so)."""
    if not any(spec is not None and spec.partial for spec in arriving):
        return None
    exact = [
        i
        for i, cand in enumerate(options)
        if all(src is None or cand.operand_specs[k] == src for k, src in enumerate(arriving))
    ]
    if not exact:
        return None
    best = min(exact, key=lambda i: own_cost[i])
    return best, own_cost[best]


def _op_key(op: Operation) -> tuple[object, ...]:
    """What an op's strategies depend on: its kind, parameters and types."""
    return (op.name, tuple(op.properties.items()), tuple(op.operand_types), tuple(op.result_types))


def _group_key(
    ops: list[Operation],
    alias: dict[SSAValue, SSAValue],
    batch_key: Callable[[Operation], object] | None = None,
    pending: dict[Operation, bool] | None = None,
) -> tuple[object, ...]:
    """What a group's strategies depend on: its ops and how they feed each other
    (per operand: the member and result it comes from, or outside)."""
    position: dict[SSAValue, tuple[int, int]] = {}
    key: list[object] = []
    for i, op in enumerate(ops):
        sources = tuple(position.get(alias.get(v, v)) for v in op.operands)
        deferring = pending.get(op) if pending else None
        key.append((_op_key(op), sources, batch_key(op) if batch_key else (), deferring))
        for j, r in enumerate(op.results):
            position[r] = (i, j)
    return tuple(key)


def value_local_bytes(value: SSAValue, spec: ShardingSpec, mesh_shape: Sequence[int]) -> int:
    return local_nbytes(shape_of(value.type), _itemsize(value), spec, mesh_shape)
