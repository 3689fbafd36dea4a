"""The ``sharding`` dialect: sharding specs, chosen strategies and explicit
collectives over the axes of a logical mesh.

Values keep their global (logical) shapes; a spec says how a value is laid out
on the mesh, in Alpa's notation: ``#sharding.spec<[S0, R]>`` splits tensor
axis 0 over mesh axis 0 and replicates over the rest; ``S01`` splits one
tensor axis over mesh axes 0 then 1. A value can also be a pending partial
sum over some mesh axes: ``#sharding.spec<[S0, R], partial = [1]>``.

Specs are attached as discardable attributes: ``sharding.specs`` on an op
(one spec per result), ``sharding.spec`` on function arguments and results.
Because shapes stay global, collectives are the identity on values and a
sharded module still means the same single-device program: executing it
unsharded gives the same numbers (the oracle every plan is checked against).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    IntegerAttr,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, ParametrizedAttribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from alpa_ir.dialects import fast_types
from alpa_ir.dialects.lax_attrs import ints_attr, ints_of

SPECS_ATTR = "sharding.specs"
"""Op attribute: an ``ArrayAttr`` of one spec per result."""
SPEC_ATTR = "sharding.spec"
"""Function argument/result attribute: the spec of that value."""
STRATEGY_ATTR = "sharding.strategy"
"""Op attribute: the name of the strategy the solver chose (a string)."""


@dataclass(frozen=True)
class ShardingSpec:
    """A sharding spec as a Python value.

    ``dims[i]`` is the tuple of mesh axes tensor axis ``i`` is split over
    (major to minor; empty = replicated), ``partial`` the mesh axes over which
    the value is a pending partial sum.
    """

    dims: tuple[tuple[int, ...], ...]
    partial: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Specs are dictionary keys in hot loops of the planner: hash once.
        object.__setattr__(self, "_hash", hash((self.dims, self.partial)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ShardingSpec):
            return NotImplemented
        return (
            self._hash == other._hash and self.dims == other.dims and self.partial == other.partial
        )  # type: ignore[attr-defined]

    @staticmethod
    def replicated(rank: int) -> ShardingSpec:
        return ShardingSpec(((),) * rank)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def used_axes(self) -> tuple[int, ...]:
        return tuple(a for d in self.dims for a in d) + self.partial

    def is_replicated(self) -> bool:
        return not self.used_axes()

    def num_shards(self, mesh_shape: Sequence[int], dim: int) -> int:
        n = 1
        for a in self.dims[dim]:
            n *= mesh_shape[a]
        return n

    def local_shape(self, shape: Sequence[int], mesh_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(s // self.num_shards(mesh_shape, i) for i, s in enumerate(shape))

    def validate(self, shape: Sequence[int] | None = None, mesh_rank: int | None = None) -> None:
        """Raise ValueError when axes repeat, exceed the mesh, or do not divide."""
        axes = self.used_axes()
        if len(set(axes)) != len(axes):
            raise ValueError(f"spec {self} uses a mesh axis twice")
        if mesh_rank is not None and any(a < 0 or a >= mesh_rank for a in axes):
            raise ValueError(f"spec {self} uses a mesh axis outside a {mesh_rank}-d mesh")
        if shape is not None and len(shape) != self.rank:
            raise ValueError(f"spec {self} has rank {self.rank}, the tensor has rank {len(shape)}")

    def __str__(self) -> str:
        body = "[" + ", ".join("S" + "".join(map(str, d)) if d else "R" for d in self.dims) + "]"
        if self.partial:
            body += ", partial = [" + ", ".join(map(str, self.partial)) + "]"
        return body

    def to_attr(self) -> ShardingSpecAttr:
        # Attributes are immutable: build each spec's once (planning writes
        # tens of thousands of them), and equal specs share one (_spec_attr).
        attr = self.__dict__.get("_attr")
        if attr is None:
            attr = _spec_attr(self.dims, self.partial)
            object.__setattr__(self, "_attr", attr)
        return attr  # type: ignore[no-any-return]


@lru_cache(maxsize=4096)
def _spec_attr(dims: tuple[tuple[int, ...], ...], partial: tuple[int, ...]) -> ShardingSpecAttr:
    """The attribute of the spec ``(dims, partial)``: a memo of a pure function
    of immutable values (an attribute is a value: equal specs may share one).
    The stage cost model plans hundreds of functions on a few meshes, whose
    plans write the same few hundred specs again and again (about 0.1 ms each
    to build: 42,000 of them in Megatron 7.5B's costing)."""
    return ShardingSpecAttr(ArrayAttr([ints_attr(d) for d in dims]), ints_attr(partial))


@irdl_attr_definition
class ShardingSpecAttr(ParametrizedAttribute):
    """``#sharding.spec<[S0, R]>`` or ``#sharding.spec<[S01, R], partial = [1]>``."""

    name = "sharding.spec"
    dims: ArrayAttr[DenseArrayBase]
    partial: DenseArrayBase

    @property
    def spec(self) -> ShardingSpec:
        spec = self.__dict__.get("_spec")  # immutable: decode once
        if spec is None:
            spec = ShardingSpec(tuple(ints_of(d) for d in self.dims.data), ints_of(self.partial))
            object.__setattr__(self, "_spec", spec)
        return spec  # type: ignore[no-any-return]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")

        def parse_dim() -> DenseArrayBase:
            pos = parser.pos
            word = parser.parse_identifier()
            if word == "R":
                return ints_attr(())
            if word.startswith("S") and word[1:].isdigit():
                return ints_attr([int(c) for c in word[1:]])
            parser.raise_error(f"expected R or S<mesh axes>, got '{word}'", pos, parser.pos)

        dims = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parse_dim)
        partial = ints_attr(())
        if parser.parse_optional_punctuation(",") is not None:
            parser.parse_keyword("partial")
            parser.parse_punctuation("=")
            partial = ints_attr(
                parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
            )
        parser.parse_punctuation(">")
        return (ArrayAttr(dims), partial)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.spec}>")

    def verify(self) -> None:
        try:
            self.spec.validate()
        except ValueError as exc:
            raise VerifyException(str(exc)) from None


def spec_attr(spec: ShardingSpec) -> ShardingSpecAttr:
    return spec.to_attr()


def result_specs(op: IRDLOperation | object) -> list[ShardingSpec] | None:
    """The specs annotated on an op's results, or None."""
    attrs = getattr(op, "attributes", {})
    value = attrs.get(SPECS_ATTR)
    if value is None:
        return None
    return [a.spec for a in value.data]  # type: ignore[union-attr]


def set_result_specs(op: IRDLOperation, specs: Sequence[ShardingSpec]) -> None:
    op.attributes[SPECS_ATTR] = ArrayAttr([s.to_attr() for s in specs])


def annotated_spec(
    function: func.FuncOp, index: int, *, result: bool = False
) -> ShardingSpec | None:
    """The ``sharding.spec`` on argument (or result) ``index`` of ``function``, if any."""
    attrs = function.res_attrs if result else function.arg_attrs
    if attrs is None:
        return None
    entry = attrs.data[index].data.get(SPEC_ATTR)  # type: ignore[attr-defined]
    return entry.spec if isinstance(entry, ShardingSpecAttr) else None


def signature_spec(function: func.FuncOp, index: int, *, result: bool = False) -> ShardingSpec:
    """:func:`annotated_spec`, replicated where there is none."""
    spec = annotated_spec(function, index, result=result)
    if spec is not None:
        return spec
    types = function.function_type.outputs if result else function.function_type.inputs
    return ShardingSpec.replicated(len(types.data[index].get_shape()))  # type: ignore[attr-defined]


def spec_of_value(value: SSAValue, function: func.FuncOp) -> ShardingSpec:
    """The spec annotated on a block argument of ``function`` or on the op
    defining ``value``; replicated when there is none."""
    rank = len(value.type.get_shape())  # type: ignore[attr-defined]
    owner = value.owner
    if isinstance(owner, Block):
        attrs = function.arg_attrs
        if attrs is not None and owner is function.body.block:
            entry = attrs.data[value.index].data.get(SPEC_ATTR)  # type: ignore[attr-defined]
            if isinstance(entry, ShardingSpecAttr):
                return entry.spec
        return ShardingSpec.replicated(rank)
    specs = result_specs(owner)
    if specs is None:
        return ShardingSpec.replicated(rank)
    return specs[value.index]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# Collectives: identity on global values; on the mesh, each is the collective
# of its name over ``axes``. Operand and result share the global type.
# --------------------------------------------------------------------------


class CollectiveKind(enum.StrEnum):
    """What a collective communicates: the value is the cost models' name of it
    (``all_reduce``, as in ``CommCostModel.all_reduce``), :attr:`hlo` XLA's."""

    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"

    @property
    def hlo(self) -> str:
        """XLA's name (``all-reduce``), as compiled HLO prints it."""
        return self.value.replace("_", "-")

    @classmethod
    def from_hlo(cls, name: str) -> CollectiveKind | None:
        """The kind XLA calls ``name``; None for one no op of this dialect is
        (``collective-permute``)."""
        try:
            return cls(name.replace("-", "_"))
        except ValueError:
            return None


class CollectiveOp(IRDLOperation):
    """Base of the explicit collectives: ``%y = sharding.all_reduce %x {axes = [1]} : tensor<...>``."""

    KIND: ClassVar[CollectiveKind | None] = None
    """What the op communicates (None: decided when it is lowered, a reshard)."""

    input = operand_def(TensorType)
    output = result_def(TensorType)
    axes = prop_def(DenseArrayBase)
    traits = traits_def(Pure())

    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("axes",)

    @property
    def mesh_axes(self) -> tuple[int, ...]:
        return ints_of(self.axes)

    def int_prop(self, name: str) -> int:
        attr = self.properties[name]
        assert isinstance(attr, IntegerAttr)
        return int(attr.value.data)

    def print(self, printer: Printer) -> None:
        from alpa_ir.dialects.syntax import print_attr_dict

        printer.print_string(" ")
        printer.print_operand(self.input)
        names = [n for n in self.PROPERTY_ORDER if n in self.properties]
        print_attr_dict(
            printer, [(n, self.properties[n]) for n in names] + list(self.attributes.items())
        )
        printer.print_string(" : ")
        printer.print_attribute(self.output.type)

    @classmethod
    def parse(cls, parser: Parser) -> CollectiveOp:
        operand = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ty = fast_types.parse_type(parser)
        known = set(cls.get_irdl_definition().properties)
        return cls.create(
            operands=[parser.resolve_operand(operand, ty)],
            result_types=[ty],
            properties={k: v for k, v in attrs.items() if k in known},
            attributes={k: v for k, v in attrs.items() if k not in known},
        )

    def verify_(self) -> None:
        if self.input.type != self.output.type:
            raise VerifyException(f"{self.name}: operand and result types differ")
        axes = self.mesh_axes
        if not axes or len(set(axes)) != len(axes):
            raise VerifyException(f"{self.name}: needs distinct mesh axes, got {list(axes)}")


@irdl_op_definition
class AllReduceOp(CollectiveOp):
    """Complete a partial value over mesh ``axes`` (partial -> not partial);
    ``reduce`` is ``sum`` (default), ``max`` or ``min``."""

    name = "sharding.all_reduce"
    KIND: ClassVar[CollectiveKind | None] = CollectiveKind.ALL_REDUCE
    reduce = opt_prop_def(StringAttr)
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("axes", "reduce")

    @property
    def reduction(self) -> str:
        return self.reduce.data if self.reduce is not None else "sum"


@irdl_op_definition
class AllGatherOp(CollectiveOp):
    """Gather tensor axis ``dim``, split over mesh ``axes``, on every device."""

    name = "sharding.all_gather"
    KIND: ClassVar[CollectiveKind | None] = CollectiveKind.ALL_GATHER
    dim = prop_def(IntegerAttr)
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("axes", "dim")


@irdl_op_definition
class ReduceScatterOp(CollectiveOp):
    """Sum a partial value over mesh ``axes`` and leave tensor axis ``dim`` split over them."""

    name = "sharding.reduce_scatter"
    KIND: ClassVar[CollectiveKind | None] = CollectiveKind.REDUCE_SCATTER
    dim = prop_def(IntegerAttr)
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("axes", "dim")


@irdl_op_definition
class AllToAllOp(CollectiveOp):
    """Move the split over mesh ``axes`` from tensor axis ``src_dim`` to ``dst_dim``."""

    name = "sharding.all_to_all"
    KIND: ClassVar[CollectiveKind | None] = CollectiveKind.ALL_TO_ALL
    src_dim = prop_def(IntegerAttr)
    dst_dim = prop_def(IntegerAttr)
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("axes", "src_dim", "dst_dim")


@irdl_op_definition
class ReshardOp(CollectiveOp):
    """Change a value's layout from spec ``src`` to spec ``dst`` (any
    communication the two need; lowered to the collectives above, or done by
    local slicing when ``dst`` only splits more)."""

    name = "sharding.reshard"
    axes = opt_prop_def(DenseArrayBase)
    src = prop_def(ShardingSpecAttr)
    dst = prop_def(ShardingSpecAttr)
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("src", "dst")

    def verify_(self) -> None:
        if self.input.type != self.output.type:
            raise VerifyException(f"{self.name}: operand and result types differ")


# --------------------------------------------------------------------------
# Synthesized reductions (P², ``synthesize-reductions``): an all-reduce over
# mesh ``axes`` run as an explicit sequence of collectives over device groups.
# --------------------------------------------------------------------------

PROGRAM_COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast")


@irdl_attr_definition
class StepAttr(ParametrizedAttribute):
    """One step of a synthesized program: a collective over device groups,
    ``#sharding.step<ReduceScatter [[0, 1], [2, 3]]>``. Groups list physical
    device ids (the ids of ``mesh.logical_mesh``'s ``devices``); member ``i`` of a
    group is its rank (the root of Reduce / Broadcast is member 0, ReduceScatter
    gives member ``i`` the ``i``-th part). Devices in no group keep their buffer."""

    name = "sharding.step"
    collective: StringAttr
    groups: ArrayAttr[DenseArrayBase]

    @staticmethod
    def make(collective: str, groups: Sequence[Sequence[int]]) -> StepAttr:
        return StepAttr(StringAttr(collective), ArrayAttr([ints_attr(g) for g in groups]))

    def group_lists(self) -> list[list[int]]:
        return [list(ints_of(g)) for g in self.groups.data]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")
        pos = parser.pos
        collective = parser.parse_identifier()
        if collective not in PROGRAM_COLLECTIVES:
            parser.raise_error(
                f"unknown collective '{collective}'; known: {', '.join(PROGRAM_COLLECTIVES)}",
                pos,
                parser.pos,
            )

        def parse_group() -> DenseArrayBase:
            return ints_attr(
                parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
            )

        groups = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parse_group)
        parser.parse_punctuation(">")
        return (StringAttr(collective), ArrayAttr(groups))

    def print_parameters(self, printer: Printer) -> None:
        groups = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in self.group_lists())
        printer.print_string(f"<{self.collective.data} [{groups}]>")

    def verify(self) -> None:
        if self.collective.data not in PROGRAM_COLLECTIVES:
            raise VerifyException(f"sharding.step: unknown collective '{self.collective.data}'")
        members = [d for g in self.group_lists() for d in g]
        if not members or min(members) < 0 or len(set(members)) != len(members):
            raise VerifyException("sharding.step: groups must be disjoint lists of device ids")


@irdl_op_definition
class AllReduceProgramOp(CollectiveOp):
    """A sum over mesh ``axes`` (like ``sharding.all_reduce``) run as the synthesized
    ``steps``; ``program`` names them in P²'s DSL. ``chunk_order``, when present,
    gives per physical device the order its buffer's chunks end in (the buffer,
    flattened, is as many equal chunks as the reduction group has devices): the
    executor permutes them back into place after the last step."""

    name = "sharding.all_reduce_program"
    KIND: ClassVar[CollectiveKind | None] = CollectiveKind.ALL_REDUCE
    steps = prop_def(ArrayAttr[StepAttr])
    program = opt_prop_def(StringAttr)
    chunk_order = opt_prop_def(ArrayAttr[DenseArrayBase])
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ("axes", "program", "steps", "chunk_order")

    @property
    def step_list(self) -> list[tuple[str, list[list[int]]]]:
        return [(s.collective.data, s.group_lists()) for s in self.steps.data]

    @property
    def chunk_orders(self) -> list[tuple[int, ...]] | None:
        if self.chunk_order is None:
            return None
        return [ints_of(order) for order in self.chunk_order.data]

    def keeps_one_size(self, num_devices: int) -> bool:
        """Whether every device's buffer keeps one size through the steps (see
        :func:`steps_keep_one_size`)."""
        return steps_keep_one_size(self.step_list, num_devices)

    def verify_(self) -> None:
        super().verify_()
        if not self.steps.data:
            raise VerifyException(f"{self.name}: needs at least one step")
        orders = self.chunk_orders
        if orders is not None:
            k = len(orders[0]) if orders else 0
            if any(sorted(o) != list(range(k)) for o in orders):
                raise VerifyException(f"{self.name}: every chunk order must permute 0..{k - 1}")


def steps_keep_one_size(steps: list[tuple[str, list[list[int]]]], num_devices: int) -> bool:
    """Whether every ReduceScatter / AllGather step puts all ``num_devices`` devices in
    groups of one size (devices in no group count as groups of one), so that every device's
    buffer has the same size after every step. The SPMD executor runs such programs with
    real reduce-scatters and all-gathers, the others on full-size buffers."""
    for name, groups in steps:
        if name in ("ReduceScatter", "AllGather"):
            sizes = {len(g) for g in groups}
            if sum(len(g) for g in groups) < num_devices:
                sizes.add(1)
            if len(sizes) != 1:
                return False
    return True


Sharding = Dialect(
    "sharding",
    [AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, ReshardOp, AllReduceProgramOp],
    [ShardingSpecAttr, StepAttr],
)

__all__ = [
    "SPECS_ATTR",
    "SPEC_ATTR",
    "STRATEGY_ATTR",
    "AllGatherOp",
    "AllReduceOp",
    "AllReduceProgramOp",
    "AllToAllOp",
    "CollectiveOp",
    "ReduceScatterOp",
    "ReshardOp",
    "Sharding",
    "ShardingSpec",
    "ShardingSpecAttr",
    "StepAttr",
    "result_specs",
    "set_result_specs",
    "spec_attr",
    "steps_keep_one_size",
]

_ = (StringAttr, i64)
