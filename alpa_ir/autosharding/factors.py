"""Factor-based sharding rules and the strategies generic code derives from them.

A rule (Shardy's design) names the *factors* of an op — the loops of its
computation — and maps every operand and result dimension to the factors it
is made of (major to minor; usually one). Each factor has a kind:

- pass-through: sharded alike in the operands and results that have it, no
  communication (the batch and free dims of a matmul);
- reduction: only in operands; sharding it leaves partial results that an
  all-reduce (``reduce`` says with which op) completes (a matmul's contracting dim);
- need-replication: must not be sharded (a sorted or cumulated axis).

A strategy assigns mesh axes to factors. Everything else follows: the spec
every operand must arrive in, the spec of every result (partial over the axes
of sharded reduction factors), the all-reduce those partials need, and the
per-device shapes. Adding a primitive means writing one rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from alpa_ir.dialects.sharding import ShardingSpec


class FactorKind(Enum):
    PASS_THROUGH = "pass"
    REDUCTION = "reduction"
    NEED_REPLICATION = "replicate"


Dims = tuple[tuple[int, ...], ...]
"""Per dimension, the factors it is made of (major to minor); () = never sharded."""


@dataclass(frozen=True)
class FactorRule:
    """The factors of one op and how its operands and results are made of them.

    ``heavy`` ops (matmuls, convolutions) must divide their work over every
    mesh axis that can split one of their factors: a strategy that leaves
    such an axis unused would compute the same thing twice (Alpa does not
    allow replicated computation for them). An axis whose size divides no
    factor can only stay unused.
    ``partial_operands`` lists operands that may arrive as partial sums over
    the axes of sharded reduction factors (a scatter-add's operand: adding it
    on one device only and summing later is exact).
    ``linear_operands`` lists operands the op is linear in (an addition, a
    transpose): a pending sum may pass through them, the result then pending
    over the same axes (see :func:`deferred_strategies`).
    """

    sizes: tuple[int, ...]
    kinds: tuple[FactorKind, ...]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    reduce: str = "sum"
    heavy: bool = False
    partial_operands: tuple[int, ...] = ()
    names: tuple[str, ...] = field(default=())
    linear_operands: tuple[int, ...] = ()

    def factor_name(self, f: int) -> str:
        return self.names[f] if f < len(self.names) else f"f{f}"


@dataclass(frozen=True)
class Strategy:
    """One parallel algorithm of an op on a mesh."""

    name: str
    operand_specs: tuple[ShardingSpec, ...]
    result_specs: tuple[ShardingSpec, ...]
    # Mesh axes over which results are partial (complete them with ``reduce``).
    partial_axes: tuple[int, ...] = ()
    reduce: str = "sum"
    # Result specs after the all-reduce of partials (derived).
    final_result_specs: tuple[ShardingSpec, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.final_result_specs:
            final = tuple(ShardingSpec(s.dims) if s.partial else s for s in self.result_specs)
            object.__setattr__(self, "final_result_specs", final)


def replicated_strategy(operand_ranks: Sequence[int], result_ranks: Sequence[int]) -> Strategy:
    return Strategy(
        "replicated",
        tuple(ShardingSpec.replicated(r) for r in operand_ranks),
        tuple(ShardingSpec.replicated(r) for r in result_ranks),
    )


def _dims_spec(dims: Dims, factor_axes: Sequence[tuple[int, ...]]) -> ShardingSpec | None:
    """The spec of a tensor whose dims are made of factors, or None when a
    non-leading factor of a dim is sharded (that layout is not a block split)."""
    spec: list[tuple[int, ...]] = []
    for factors in dims:
        axes: tuple[int, ...] = ()
        for k, f in enumerate(factors):
            if factor_axes[f]:
                if k > 0:
                    return None
                axes = factor_axes[f]
        spec.append(axes)
    return ShardingSpec(tuple(spec))


def _name(rule: FactorRule, factor_axes: Sequence[tuple[int, ...]]) -> str:
    parts = [
        f"{rule.factor_name(f)}->{''.join(map(str, axes))}"
        for f, axes in enumerate(factor_axes)
        if axes
    ]
    return ",".join(parts) or "replicated"


def enumerate_strategies(rule: FactorRule, mesh_shape: Sequence[int]) -> list[Strategy]:
    """Every valid assignment of mesh axes to factors, deduplicated.

    An axis is unused or shards exactly one factor; a factor sharded over
    several axes takes them in increasing order (``S01``); the product of a
    factor's axes divides its size; need-replication factors stay unsharded;
    heavy ops use every axis whose size divides one of their shardable
    factors. Axes of size 1 are never used.
    """
    axes = [a for a, n in enumerate(mesh_shape) if n > 1]
    num_factors = len(rule.sizes)
    shardable = [f for f in range(num_factors) if rule.kinds[f] is not FactorKind.NEED_REPLICATION]
    usable = [any(rule.sizes[f] % mesh_shape[a] == 0 for f in shardable) for a in axes]
    options = [None, *shardable]
    seen: set[tuple[tuple[ShardingSpec, ...], tuple[ShardingSpec, ...]]] = set()
    out: list[Strategy] = []
    for choice in itertools.product(options, repeat=len(axes)):
        if rule.heavy and any(c is None and u for c, u in zip(choice, usable, strict=True)):
            continue
        factor_axes: list[tuple[int, ...]] = [() for _ in range(num_factors)]
        for axis, f in zip(axes, choice, strict=True):
            if f is not None:
                factor_axes[f] = (*factor_axes[f], axis)
        if any(
            rule.sizes[f] % math.prod(mesh_shape[a] for a in fa) for f, fa in enumerate(factor_axes)
        ):
            continue
        strategy = _strategy(rule, factor_axes)
        if strategy is None:
            continue
        key = (strategy.operand_specs, strategy.result_specs)
        if key not in seen:
            seen.add(key)
            out.append(strategy)
    if not out and rule.heavy:
        # No assignment divides the work over the whole mesh (shapes too
        # small): allow replicated computation rather than fail.
        return enumerate_strategies(
            FactorRule(
                rule.sizes,
                rule.kinds,
                rule.operands,
                rule.results,
                rule.reduce,
                False,
                rule.partial_operands,
                rule.names,
                rule.linear_operands,
            ),
            mesh_shape,
        )
    return out


def deferred_strategies(
    rule: FactorRule,
    strategies: Sequence[Strategy],
    mesh_shape: Sequence[int],
    keep: bool = True,
) -> list[Strategy]:
    """The strategies of an op on the way of a pending sum to an addition.

    Partial sums added before they are reduced need one all-reduce, not one
    per addend (the gradient of a weight used twice, a tied embedding, is the
    sum of two partial gradients). An op linear in some operands takes them
    partial over free mesh axes ``P``, its results partial over ``P``; and
    with ``keep`` (the op's value has one use, which completes it: a reshard
    priced on more than one use would be counted once per use but run
    once), every strategy with partial sums has a twin that leaves them
    pending for that use. The graph builder asks for these only where a
    pending sum can reach an addition.
    """
    out: list[Strategy] = []
    axes = [a for a, n in enumerate(mesh_shape) if n > 1]
    if rule.linear_operands:
        for s in strategies:
            if s.partial_axes:
                continue
            used = {a for spec in (*s.operand_specs, *s.result_specs) for a in spec.used_axes()}
            free = [a for a in axes if a not in used]
            for k in range(1, len(free) + 1):
                for pending in itertools.combinations(free, k):
                    operands = tuple(
                        ShardingSpec(spec.dims, pending) if i in rule.linear_operands else spec
                        for i, spec in enumerate(s.operand_specs)
                    )
                    results = tuple(ShardingSpec(spec.dims, pending) for spec in s.result_specs)
                    name = f"{s.name} pending{''.join(map(str, pending))}"
                    out.append(Strategy(name, operands, results, pending, "sum"))
    if keep:
        out += [
            Strategy(
                f"{s.name} deferred",
                s.operand_specs,
                s.result_specs,
                s.partial_axes,
                "sum",
                s.result_specs,
            )
            for s in (*strategies, *out)
            if s.partial_axes and s.reduce == "sum"
        ]
    return out


def _strategy(rule: FactorRule, factor_axes: Sequence[tuple[int, ...]]) -> Strategy | None:
    partial = tuple(
        sorted(
            a
            for f, fa in enumerate(factor_axes)
            if rule.kinds[f] is FactorKind.REDUCTION
            for a in fa
        )
    )
    operand_specs = []
    for k, dims in enumerate(rule.operands):
        spec = _dims_spec(dims, factor_axes)
        if spec is None:
            return None
        if k in rule.partial_operands and partial:
            spec = ShardingSpec(spec.dims, partial)
        operand_specs.append(spec)
    result_specs = []
    for dims in rule.results:
        spec = _dims_spec(dims, factor_axes)
        if spec is None:
            return None
        result_specs.append(ShardingSpec(spec.dims, partial))
    return Strategy(
        _name(rule, factor_axes), tuple(operand_specs), tuple(result_specs), partial, rule.reduce
    )
