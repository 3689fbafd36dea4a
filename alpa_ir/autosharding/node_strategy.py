"""A node's strategies, and those of a repeated group read through a renaming.

A strategy of a strategy-graph node (:mod:`alpa_ir.autosharding.graph`)
fixes the spec of each value the node defines, the strategy of each of its
ops, and the spec each operand must arrive in. A repeated group (the same
layer again) takes the strategies of the first group like it. Copying every
strategy's tables under the new names cost GPT-2 small's costing half of its
graph build (128,618 strategies, three dictionaries each, for 26 graphs);
most entries are never read, since only a node's boundary values and the
chosen strategy's tables are looked at. :class:`RenamedStrategy` renames on
lookup instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from xdsl.ir import Operation, SSAValue

from alpa_ir.autosharding.factors import Strategy
from alpa_ir.dialects.sharding import ShardingSpec

K = TypeVar("K")
V = TypeVar("V")
OperandKey = tuple[Operation, int]


class NodeStrategy:
    """One choice for a node."""

    __slots__ = ("_op_strategies", "_operand_specs", "_value_specs", "cost", "name")

    def __init__(
        self,
        name: str,
        cost: float,
        value_specs: Mapping[SSAValue, ShardingSpec] | None,
        op_strategies: Mapping[Operation, Strategy] | None,
        operand_specs: Mapping[OperandKey, ShardingSpec] | None,
    ) -> None:
        self.name = name
        self.cost = cost
        self._value_specs = value_specs
        self._op_strategies = op_strategies
        self._operand_specs = operand_specs

    @property
    def value_specs(self) -> Mapping[SSAValue, ShardingSpec]:
        """The spec of each value the node defines."""
        assert self._value_specs is not None
        return self._value_specs

    @property
    def op_strategies(self) -> Mapping[Operation, Strategy]:
        """The strategy of each of the node's ops."""
        assert self._op_strategies is not None
        return self._op_strategies

    @property
    def operand_specs(self) -> Mapping[OperandKey, ShardingSpec]:
        """The spec each operand ``(op, index)`` of the node's ops arrives in."""
        assert self._operand_specs is not None
        return self._operand_specs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.cost!r})"


class GroupRenaming:
    """The values and ops of a repeated group against those of the first
    group like it (``first`` and ``ops`` in the same order)."""

    __slots__ = ("new_op", "new_value", "old_op", "old_value")

    def __init__(self, first: list[Operation], ops: list[Operation]) -> None:
        self.new_value = {
            a: b
            for x, y in zip(first, ops, strict=True)
            for a, b in zip(x.results, y.results, strict=True)
        }
        self.old_value = {b: a for a, b in self.new_value.items()}
        self.new_op = dict(zip(first, ops, strict=True))
        self.old_op = dict(zip(ops, first, strict=True))

    @classmethod
    def of_maps(
        cls, ops: Mapping[Operation, Operation], values: Mapping[SSAValue, SSAValue]
    ) -> GroupRenaming:
        """The renaming given by its maps from old to new ops and values (a
        whole function onto its copy: :mod:`alpa_ir.autosharding.graph_copy`)."""
        renaming = cls([], [])
        renaming.new_op = dict(ops)
        renaming.old_op = {b: a for a, b in ops.items()}
        renaming.new_value = dict(values)
        renaming.old_value = {b: a for a, b in values.items()}
        return renaming

    def new_operand(self, key: OperandKey) -> OperandKey:
        return self.new_op[key[0]], key[1]

    def old_operand(self, key: OperandKey) -> OperandKey:
        return self.old_op[key[0]], key[1]


class RenamedStrategy(NodeStrategy):
    """``source`` (a strategy of the first group) as a strategy of the group
    ``renaming`` maps it to; its tables are built on first use."""

    __slots__ = ("_renaming", "_source")

    def __init__(self, source: NodeStrategy, renaming: GroupRenaming) -> None:
        super().__init__(source.name, source.cost, None, None, None)
        self._source = source
        self._renaming = renaming

    @property
    def value_specs(self) -> Mapping[SSAValue, ShardingSpec]:
        if self._value_specs is None:
            r = self._renaming
            self._value_specs = RenamedTable(
                self._source.value_specs, r.new_value.__getitem__, r.old_value.__getitem__
            )
        return self._value_specs

    @property
    def op_strategies(self) -> Mapping[Operation, Strategy]:
        if self._op_strategies is None:
            r = self._renaming
            self._op_strategies = RenamedTable(
                self._source.op_strategies, r.new_op.__getitem__, r.old_op.__getitem__
            )
        return self._op_strategies

    @property
    def operand_specs(self) -> Mapping[OperandKey, ShardingSpec]:
        if self._operand_specs is None:
            r = self._renaming
            self._operand_specs = RenamedTable(
                self._source.operand_specs, r.new_operand, r.old_operand
            )
        return self._operand_specs


def value_column(strategies: Sequence[NodeStrategy], value: SSAValue) -> list[ShardingSpec]:
    """The spec of ``value`` under each of a node's ``strategies`` (a repeated
    group's are looked up under the first group's name once)."""
    first = strategies[0] if strategies else None
    if isinstance(first, RenamedStrategy):
        old = first._renaming.old_value[value]
        return [s._source.value_specs[old] for s in strategies]  # type: ignore[attr-defined]
    return [s.value_specs[value] for s in strategies]


def operand_column(strategies: Sequence[NodeStrategy], key: OperandKey) -> list[ShardingSpec]:
    """The spec operand ``key`` arrives in under each of a node's ``strategies``."""
    first = strategies[0] if strategies else None
    if isinstance(first, RenamedStrategy):
        old = first._renaming.old_operand(key)
        return [s._source.operand_specs[old] for s in strategies]  # type: ignore[attr-defined]
    return [s.operand_specs[key] for s in strategies]


class RenamedTable(Mapping[K, V]):
    """``table`` with each key ``k`` seen as ``to_new(k)``; ``to_old`` is its
    inverse (raising ``KeyError`` for a key the renaming does not cover)."""

    __slots__ = ("_table", "_to_new", "_to_old")

    def __init__(
        self, table: Mapping[K, V], to_new: Callable[[K], K], to_old: Callable[[K], K]
    ) -> None:
        self._table = table
        self._to_new = to_new
        self._to_old = to_old

    def __getitem__(self, key: K) -> V:
        return self._table[self._to_old(key)]

    def __iter__(self) -> Iterator[K]:
        return map(self._to_new, self._table)

    def __len__(self) -> int:
        return len(self._table)
