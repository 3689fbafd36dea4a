"""Attributes of the ``lax`` dialect that need no JAX: integer arrays
(``array<i64: ...>``) and the dimension numbers of dot, conv, gather and
scatter with a readable syntax, e.g. ``#lax.dot<contract [1] x [0], batch [] x []>``.
The other dialects use the integer arrays without importing JAX."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    DenseArrayBase,
    i64,
)
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer

from alpa_ir.dialects.key_type import KeyType

# --------------------------------------------------------------------------
# Attributes for structured parameters
# --------------------------------------------------------------------------


def ints_attr(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


def ints_of(attr: DenseArrayBase) -> tuple[int, ...]:
    return tuple(int(v) for v in attr.get_values())


def _parse_int_list(parser: AttrParser) -> DenseArrayBase:
    values = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
    return ints_attr(values)


def _print_int_list(printer: Printer, attr: DenseArrayBase) -> None:
    printer.print_string("[" + ", ".join(str(v) for v in ints_of(attr)) + "]")


class IntTuplesAttr(ParametrizedAttribute):
    """Base of attributes that are a record of int tuples, printed as
    ``#lax.name<field = [..], field = [..]>``."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(name for name, _ in cls.get_irdl_definition().parameters)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        values: dict[str, DenseArrayBase] = {}

        def parse_field() -> None:
            name = parser.parse_identifier()
            parser.parse_punctuation("=")
            values[name] = _parse_int_list(parser)

        parser.parse_comma_separated_list(parser.Delimiter.ANGLE, parse_field)
        names = cls.field_names()
        unknown = set(values) - set(names)
        if unknown:
            parser.raise_error(f"unknown field(s) {sorted(unknown)} in #{cls.name}")
        return [values.get(n, ints_attr(())) for n in names]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        for k, (name, value) in enumerate(zip(self.field_names(), self.parameters, strict=True)):
            if k:
                printer.print_string(", ")
            printer.print_string(f"{name} = ")
            _print_int_list(printer, value)  # type: ignore[arg-type]
        printer.print_string(">")

    def as_tuples(self) -> tuple[tuple[int, ...], ...]:
        return tuple(ints_of(p) for p in self.parameters)  # type: ignore[arg-type]


@irdl_attr_definition
class DotDimsAttr(IntTuplesAttr):
    """``dot_general`` dimension numbers."""

    name = "lax.dot"
    lhs_contracting: DenseArrayBase
    rhs_contracting: DenseArrayBase
    lhs_batch: DenseArrayBase
    rhs_batch: DenseArrayBase


@irdl_attr_definition
class ConvDimsAttr(IntTuplesAttr):
    """``conv_general_dilated`` dimension numbers (``lax.ConvDimensionNumbers``)."""

    name = "lax.conv"
    lhs_spec: DenseArrayBase
    rhs_spec: DenseArrayBase
    out_spec: DenseArrayBase


@irdl_attr_definition
class GatherDimsAttr(IntTuplesAttr):
    """``gather`` dimension numbers (``lax.GatherDimensionNumbers``)."""

    name = "lax.gather"
    offset_dims: DenseArrayBase
    collapsed_slice_dims: DenseArrayBase
    start_index_map: DenseArrayBase
    operand_batching_dims: DenseArrayBase
    start_indices_batching_dims: DenseArrayBase


@irdl_attr_definition
class ScatterDimsAttr(IntTuplesAttr):
    """``scatter*`` dimension numbers (``lax.ScatterDimensionNumbers``)."""

    name = "lax.scatter"
    update_window_dims: DenseArrayBase
    inserted_window_dims: DenseArrayBase
    scatter_dims_to_operand_dims: DenseArrayBase
    operand_batching_dims: DenseArrayBase
    scatter_indices_batching_dims: DenseArrayBase


LAX_ATTRIBUTES: tuple[type[Attribute], ...] = (
    KeyType,
    DotDimsAttr,
    ConvDimsAttr,
    GatherDimsAttr,
    ScatterDimsAttr,
)
