"""Syntax shared by the alpa_ir dialects: symbol ops whose body is a readable
dictionary of properties, ``dialect.op @name {key = value, ...}``."""

from __future__ import annotations

from typing import ClassVar, Self

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Attribute
from xdsl.irdl import IRDLOperation
from xdsl.parser import Parser
from xdsl.printer import Printer


class PropertiesSymbolOp(IRDLOperation):
    """A symbol op whose properties print as one attribute dictionary:
    ``mesh.logical_mesh @m {shape = array<i64: 2, 4>, ...}``.

    Subclasses define ``sym_name = prop_def(StringAttr)`` and their properties;
    ``PROPERTY_ORDER`` fixes the printing order.
    """

    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = ()

    def print(self, printer: Printer) -> None:
        from alpa_ir.dialects.lax import print_attr_dict

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
        from alpa_ir.dialects.lax import print_attr_dict

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
