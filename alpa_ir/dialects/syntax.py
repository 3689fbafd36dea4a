"""Syntax shared by the alpa_ir dialects: symbol ops whose body is a readable
dictionary of properties, ``dialect.op @name {key = value, ...}``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Self

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute
from xdsl.irdl import IRDLOperation
from xdsl.parser import Parser
from xdsl.printer import Printer


def format_float(value: float) -> str:
    """A float literal that parses back to the same double (MLIR needs a '.')."""
    text = repr(float(value))
    if text in ("inf", "-inf", "nan"):
        return text
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exponent if exponent else "")


class PropertiesSymbolOp(IRDLOperation):
    """A symbol op whose properties print as one attribute dictionary:
    ``mesh.logical_mesh @m {shape = array<i64: 2, 4>, ...}``.

    Subclasses define ``sym_name = prop_def(StringAttr)`` and their properties;
    ``PROPERTY_ORDER`` fixes the printing order.
    """

    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ()

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.properties["sym_name"].data)  # type: ignore[attr-defined]
        names = [n for n in self.PROPERTY_ORDER if n in self.properties]
        names += [n for n in self.properties if n not in names and n != "sym_name"]
        print_attr_dict(
            printer, [(n, self.properties[n]) for n in names] + list(self.attributes.items())
        )

    @classmethod
    def parse(cls, parser: Parser) -> Self:
        name = parser.parse_symbol_name()
        attrs: dict[str, Attribute] = parser.parse_optional_attr_dict()
        known = set(cls.get_irdl_definition().properties)
        props = {k: v for k, v in attrs.items() if k in known}
        props["sym_name"] = StringAttr(name.data)
        others = {k: v for k, v in attrs.items() if k not in known}
        return cls.create(properties=props, attributes=others)


class PropertiesOp(IRDLOperation):
    """An op without operands whose properties print as one attribute
    dictionary, followed by its regions if any:
    ``pipeline.run {stage = @s, micro_batch = 0}``."""

    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ()

    def print(self, printer: Printer) -> None:
        names = [n for n in self.PROPERTY_ORDER if n in self.properties]
        names += [n for n in self.properties if n not in names]
        print_attr_dict(
            printer, [(n, self.properties[n]) for n in names] + list(self.attributes.items())
        )
        for region in self.regions:
            printer.print_string(" ")
            printer.print_region(region, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> Self:
        attrs: dict[str, Attribute] = parser.parse_optional_attr_dict()
        known = set(cls.get_irdl_definition().properties)
        regions = []
        while (region := parser.parse_optional_region()) is not None:
            regions.append(region)
        return cls.create(
            properties={k: v for k, v in attrs.items() if k in known},
            attributes={k: v for k, v in attrs.items() if k not in known},
            regions=regions,
        )


def is_bool_attr(attr: Attribute) -> bool:
    return isinstance(attr, IntegerAttr) and isinstance(attr.type, IntegerType) and attr.type == i1


def print_attr_value(printer: Printer, attr: Attribute) -> None:
    """Print an attribute, with bare ints, floats and booleans for the common
    ``i64``/``f64``/``i1`` cases (they parse back to the same types)."""
    if isinstance(attr, IntegerAttr) and attr.type == i64:
        printer.print_string(str(attr.value.data))
    elif is_bool_attr(attr):
        printer.print_string("true" if attr.value.data else "false")  # type: ignore[attr-defined]
    elif isinstance(attr, FloatAttr) and attr.type == f64 and np.isfinite(attr.value.data):
        printer.print_string(format_float(attr.value.data))
    elif isinstance(attr, DenseArrayBase) and attr.elt_type == f64:
        values = [format_float(v) for v in attr.get_values()]
        printer.print_string("array<f64" + (": " + ", ".join(values) if values else "") + ">")
    elif isinstance(attr, ArrayAttr):
        printer.print_string("[")
        for k, item in enumerate(attr.data):
            if k:
                printer.print_string(", ")
            print_attr_value(printer, item)
        printer.print_string("]")
    else:
        printer.print_attribute(attr)


def print_attr_dict(printer: Printer, entries: Iterable[tuple[str, Attribute]]) -> None:
    items = list(entries)
    if not items:
        return
    printer.print_string(" {")
    for k, (name, value) in enumerate(items):
        if k:
            printer.print_string(", ")
        printer.print_identifier_or_string_literal(name)
        printer.print_string(" = ")
        print_attr_value(printer, value)
    printer.print_string("}")
