"""The ``lax`` dialect: one op per JAX primitive.

Every op has the same readable syntax::

    %r = lax.dot_general %a, %b {dimension_numbers = #lax.dot<...>} : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    %c:2 = lax.while %i, %x ({ ...cond... }, { ...body... }) {body_nconsts = 0, cond_nconsts = 0} : (...) -> (...)

operands, then the sub-computations as regions (control flow), then one
attribute dictionary holding the primitive's parameters (op properties) and
any discardable attributes of later passes (``sharding.*``, ``merge.*``), then
the functional type. The op classes are generated from the primitive table in
:mod:`alpa_ir.dialects.lax_primitives`; parameters are decoded back to the
Python values JAX uses by :meth:`LaxOp.jax_params`.

Besides the primitive ops there are ``lax.constant`` (literals and constants),
``lax.return`` (region terminator) and ``lax.primitive`` (any other primitive
whose parameters encode generically; it prints, parses and executes, and gets
only the replicated sharding strategy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    BytesAttr,
    DictionaryAttr,
    StringAttr,
    TensorType,
    i1,
)
from xdsl.ir import Attribute, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_region_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from alpa_ir.dialects import fast_types
from alpa_ir.dialects.lax_attrs import LAX_ATTRIBUTES
from alpa_ir.dialects.lax_params import Codec, DroppedC, NoneOnlyC
from alpa_ir.dialects.lax_primitives import PRIMITIVES, OpKind, PrimitiveSpec
from alpa_ir.dialects.lax_verifiers import VERIFIERS
from alpa_ir.dialects.syntax import print_attr_dict
from alpa_ir.dialects.types import dtype_of, shape_of

# --------------------------------------------------------------------------
# Shared syntax helpers
# --------------------------------------------------------------------------


def print_signature(printer: Printer, op: Operation) -> None:
    printer.print_string(" : ")
    printer.print_function_type(op.operand_types, op.result_types)


def parse_operands(parser: Parser) -> list[Any]:
    return (
        parser.parse_optional_undelimited_comma_separated_list(
            parser.parse_optional_unresolved_operand, parser.parse_unresolved_operand
        )
        or []
    )


def parse_regions(parser: Parser) -> list[Region]:
    if parser.parse_optional_punctuation("(") is None:
        return []
    regions = [parser.parse_region()]
    while parser.parse_optional_punctuation(",") is not None:
        regions.append(parser.parse_region())
    parser.parse_punctuation(")")
    return regions


def parse_signature(
    parser: Parser, operands: Sequence[Any]
) -> tuple[list[SSAValue], list[Attribute]]:
    parser.parse_punctuation(":")
    pos = parser.pos
    fn_type = fast_types.parse_function_type(parser)
    inputs = list(fn_type.inputs.data)
    if len(inputs) != len(operands):
        parser.raise_error(
            f"expected {len(operands)} operand types, got {len(inputs)}", pos, parser.pos
        )
    return parser.resolve_operands(operands, inputs, parser.pos), list(fn_type.outputs.data)


# --------------------------------------------------------------------------
# Primitive ops
# --------------------------------------------------------------------------


class LaxOp(IRDLOperation):
    """Base of the primitive ops: operands, regions, params, one syntax."""

    SPEC: ClassVar[PrimitiveSpec]

    @classmethod
    def stored_params(cls) -> Mapping[str, Codec]:
        """The parameters kept as properties (all but dropped/None-only ones)."""
        return {k: c for k, c in cls.SPEC.params.items() if not isinstance(c, DroppedC | NoneOnlyC)}

    @property
    def primitive_name(self) -> str:
        return self.SPEC.name

    @property
    def kind(self) -> OpKind:
        return self.SPEC.kind

    def param(self, name: str) -> Any:
        """One parameter decoded to its JAX value."""
        codec = self.SPEC.params[name]
        return codec.decode(self.properties.get(name))

    @classmethod
    def dropped_params(cls) -> tuple[str, ...]:
        """The parameters JAX has that the op does not keep (bound as None)."""
        return tuple(k for k, c in cls.SPEC.params.items() if isinstance(c, DroppedC))

    def jax_params(self) -> dict[str, Any]:
        """All non-region parameters as the Python values JAX binds with."""
        return {
            name: codec.decode(self.properties.get(name))
            for name, codec in self.SPEC.params.items()
        }

    def print(self, printer: Printer) -> None:
        if self.operands:
            printer.print_string(" ")
            printer.print_list(self.operands, printer.print_operand)
        if self.regions:
            printer.print_string(" (")
            printer.print_list(self.regions, printer.print_region)
            printer.print_string(")")
        props = [(k, self.properties[k]) for k in self.stored_params() if k in self.properties]
        print_attr_dict(printer, [*props, *self.attributes.items()])
        print_signature(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> LaxOp:
        operands = parse_operands(parser)
        regions = parse_regions(parser)
        attrs = parser.parse_optional_attr_dict()
        args, result_types = parse_signature(parser, operands)
        stored = cls.stored_params()
        properties = {k: v for k, v in attrs.items() if k in stored}
        attributes = {k: v for k, v in attrs.items() if k not in stored}
        return cls.create(
            operands=args,
            result_types=result_types,
            properties=properties,
            attributes=attributes,
            regions=regions,
        )

    def verify_(self) -> None:
        spec = self.SPEC
        want_regions = len(spec.region_params)
        if spec.variadic_region_param is None and len(self.regions) != want_regions:
            raise VerifyException(
                f"{self.name} expects {want_regions} region(s), got {len(self.regions)}"
            )
        for ty in (*self.operand_types, *self.result_types):
            if not isinstance(ty, TensorType):
                raise VerifyException(
                    f"{self.name}: operands and results must be tensors, got {ty}"
                )
        for region in self.regions:
            if len(region.blocks) != 1:
                raise VerifyException(f"{self.name}: each region must have exactly one block")
        check = VERIFIERS.get(spec.name)
        if check is not None:
            check(self)


def _make_op_class(spec: PrimitiveSpec) -> type[LaxOp]:
    body: dict[str, Any] = {
        "__doc__": f"The JAX primitive ``{spec.name}`` ({spec.kind.value}).",
        "__module__": __name__,
        "name": spec.op_name,
        "SPEC": spec,
        "__annotations__": {"SPEC": ClassVar[PrimitiveSpec]},
        "args": var_operand_def(),
        "outs": var_result_def(),
        "regs": var_region_def(),
    }
    if spec.kind in (OpKind.ELEMENTWISE, OpKind.LAYOUT, OpKind.REDUCTION, OpKind.CONTRACTION):
        body["traits"] = traits_def(Pure())
    for name, codec in spec.params.items():
        if isinstance(codec, DroppedC | NoneOnlyC):
            continue
        define = prop_def if codec.required else opt_prop_def
        body["p_" + name.lstrip("_")] = define(codec.constraint(), prop_name=name)
    cls_name = "".join(p.capitalize() for p in spec.name.replace("-", "_").split("_")) + "Op"
    return irdl_op_definition(type(cls_name, (LaxOp,), body))


PRIMITIVE_OPS: Mapping[str, type[LaxOp]] = {
    name: _make_op_class(spec) for name, spec in PRIMITIVES.items()
}
"""Primitive name -> op class."""

# --------------------------------------------------------------------------
# constant, return, generic primitive
# --------------------------------------------------------------------------

_HEX_THRESHOLD = 64


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """A constant tensor: ``%c = lax.constant 1.5 : tensor<f32>``,
    ``lax.constant [1, 2, 3] : tensor<3xi32>``, or for larger data
    ``lax.constant hex"0x..." : tensor<...>`` (raw little-endian bytes)."""

    name = "lax.constant"
    data = prop_def(BytesAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    @staticmethod
    def from_array(value: np.ndarray, ty: TensorType) -> ConstantOp:
        array = np.ascontiguousarray(np.asarray(value, dtype=dtype_of(ty)).reshape(shape_of(ty)))
        return ConstantOp.create(properties={"data": BytesAttr(array.tobytes())}, result_types=[ty])

    def value(self) -> np.ndarray:
        ty = self.result.type
        return np.frombuffer(self.data.data, dtype=dtype_of(ty)).reshape(shape_of(ty))

    def print(self, printer: Printer) -> None:
        value = self.value()
        finite = value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
        if value.size > _HEX_THRESHOLD or not finite:
            printer.print_string(' hex"0x' + self.data.data.hex().upper() + '"')
        else:
            printer.print_string(" " + _format_nested(value))
        print_attr_dict(printer, self.attributes.items())
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        if parser.parse_optional_keyword("hex") is not None:
            text = parser.parse_str_literal()
            raw: bytes | list[Any] = bytes.fromhex(text.removeprefix("0x"))
        else:
            raw = _parse_nested(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ty = parser.parse_type()
        if not isinstance(ty, TensorType):
            parser.raise_error(f"lax.constant needs a tensor type, got {ty}")
        dtype, shape = dtype_of(ty), shape_of(ty)
        try:
            if isinstance(raw, bytes):
                array = np.frombuffer(raw, dtype=dtype).reshape(shape)
            else:
                array = np.asarray(raw, dtype=dtype).reshape(shape)
        except ValueError as exc:
            parser.raise_error(f"lax.constant value does not match {ty}: {exc}")
        op = ConstantOp.from_array(array, ty)
        op.attributes.update(attrs)
        return op


def _format_scalar(x: Any) -> str:
    """Shortest text that round-trips in the value's own precision."""
    if isinstance(x, np.bool_ | bool):
        return "true" if x else "false"
    if isinstance(x, np.integer | int):
        return str(int(x))
    mantissa, _, exponent = str(x).partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exponent if exponent else "")


def _format_nested(value: np.ndarray) -> str:
    if value.ndim == 0:
        return _format_scalar(value[()])
    return "[" + ", ".join(_format_nested(v) for v in value) + "]"


def _parse_scalar(parser: Parser) -> Any:
    for word, val in (("true", True), ("false", False)):
        if parser.parse_optional_keyword(word) is not None:
            return val
    return parser.parse_number()


def _parse_nested(parser: Parser) -> Any:
    if parser.parse_optional_punctuation("[") is None:
        return _parse_scalar(parser)
    items: list[Any] = []
    if parser.parse_optional_punctuation("]") is None:
        items.append(_parse_nested(parser))
        while parser.parse_optional_punctuation(",") is not None:
            items.append(_parse_nested(parser))
        parser.parse_punctuation("]")
    return items


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Terminator of the regions of control-flow ops: ``lax.return %a, %b : tensor<..>, ...``."""

    name = "lax.return"
    args = var_operand_def()
    traits = traits_def(IsTerminator(), Pure())

    def print(self, printer: Printer) -> None:
        if self.operands:
            printer.print_string(" ")
            printer.print_list(self.operands, printer.print_operand)
            printer.print_string(" : ")
            printer.print_list(self.operand_types, printer.print_attribute)

    @classmethod
    def parse(cls, parser: Parser) -> ReturnOp:
        operands = parse_operands(parser)
        types: list[Attribute] = []
        if operands:
            parser.parse_punctuation(":")
            types = [fast_types.parse_type(parser)]
            while parser.parse_optional_punctuation(",") is not None:
                types.append(fast_types.parse_type(parser))
        return ReturnOp.create(operands=parser.resolve_operands(operands, types, parser.pos))


@irdl_op_definition
class PrimitiveOp(IRDLOperation):
    """Any other JAX primitive, by name, with generically encoded parameters:
    ``%r = lax.primitive "name" %a {params = {...}} : (...) -> ...``.
    Parameters may be ints, floats, bools, strings, dtypes, None and tuples of these."""

    name = "lax.primitive"
    primitive = prop_def(StringAttr)
    params = prop_def(DictionaryAttr)
    args = var_operand_def()
    outs = var_result_def()

    @property
    def primitive_name(self) -> str:
        return self.primitive.data

    def jax_params(self) -> dict[str, Any]:
        from alpa_ir.dialects.lax_generic_params import decode_generic

        return {k: decode_generic(v) for k, v in self.params.data.items()}

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_string_literal(self.primitive.data)
        if self.operands:
            printer.print_string(" ")
            printer.print_list(self.operands, printer.print_operand)
        print_attr_dict(printer, [("params", self.params), *self.attributes.items()])
        print_signature(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> PrimitiveOp:
        prim = parser.parse_str_literal()
        operands = parse_operands(parser)
        attrs = parser.parse_optional_attr_dict()
        params = attrs.pop("params", DictionaryAttr({}))
        if not isinstance(params, DictionaryAttr):
            parser.raise_error("lax.primitive expects 'params' to be a dictionary")
        args, result_types = parse_signature(parser, operands)
        return PrimitiveOp.create(
            operands=args,
            result_types=result_types,
            properties={"primitive": StringAttr(prim), "params": params},
            attributes=attrs,
        )


Lax = Dialect(
    "lax",
    [*PRIMITIVE_OPS.values(), ConstantOp, ReturnOp, PrimitiveOp],
    list(LAX_ATTRIBUTES),
)


def is_lax_primitive(op: Operation) -> bool:
    """True for ops that bind a JAX primitive (a table op or ``lax.primitive``)."""
    return isinstance(op, LaxOp | PrimitiveOp)


__all__ = [
    "PRIMITIVE_OPS",
    "ConstantOp",
    "Lax",
    "LaxOp",
    "PrimitiveOp",
    "ReturnOp",
    "is_lax_primitive",
]

_ = (ArrayAttr, i1)  # re-exported types used by codecs elsewhere
