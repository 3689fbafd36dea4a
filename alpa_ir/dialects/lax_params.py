"""The codecs between JAX primitive parameters and the ``lax`` dialect's
attributes.

Each parameter of a JAX primitive has a :class:`Codec`: it names the xDSL
attribute type of the op property, encodes the Python value JAX uses
(``encode``; ``None`` means the property is omitted) and decodes it back
(``decode``; an absent property decodes to the parameter's default, usually
``None``). Structured parameters (dimension numbers) are the attributes of
:mod:`alpa_ir.dialects.lax_attrs`.
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from jax import lax
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute, TypeAttribute

from alpa_ir.dialects.key_type import KEY_SHAPES
from alpa_ir.dialects.lax_attrs import (
    ConvDimsAttr,
    DotDimsAttr,
    GatherDimsAttr,
    IntTuplesAttr,
    ScatterDimsAttr,
    ints_attr,
    ints_of,
)
from alpa_ir.dialects.types import element_type, numpy_dtype
from alpa_ir.errors import AlpaError

# --------------------------------------------------------------------------
# Codecs
# --------------------------------------------------------------------------


class Codec:
    """Encodes one primitive parameter as an op property and back."""

    attr_type: ClassVar[type[Attribute] | tuple[type[Attribute], ...]] = Attribute

    @property
    def required(self) -> bool:
        """Whether the property must be present (the value cannot be ``None``)."""
        return not getattr(self, "optional", False)

    def constraint(self) -> Any:
        """The IRDL constraint of the property (a class or a union of classes)."""
        if isinstance(self.attr_type, tuple):
            return functools.reduce(operator.or_, self.attr_type)
        return self.attr_type

    def encode(self, value: Any) -> Attribute | None:
        raise NotImplementedError

    def decode(self, attr: Attribute | None) -> Any:
        raise NotImplementedError


def _check(cond: bool, what: str, value: Any) -> None:
    if not cond:
        raise AlpaError(f"cannot encode {what} parameter value {value!r}")


@dataclass(frozen=True)
class IntC(Codec):
    attr_type = IntegerAttr

    def encode(self, value: Any) -> Attribute | None:
        _check(isinstance(value, int | np.integer) and not isinstance(value, bool), "int", value)
        return IntegerAttr(int(value), i64)

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, IntegerAttr)
        return int(attr.value.data)


@dataclass(frozen=True)
class BoolC(Codec):
    attr_type = IntegerAttr

    def encode(self, value: Any) -> Attribute | None:
        _check(isinstance(value, bool | np.bool_), "bool", value)
        return IntegerAttr(int(bool(value)), i1)

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, IntegerAttr)
        return bool(attr.value.data)


@dataclass(frozen=True)
class IntOrBoolC(Codec):
    """``scan``'s ``unroll`` (an int, or a bool meaning 'fully')."""

    attr_type = IntegerAttr

    def encode(self, value: Any) -> Attribute | None:
        if isinstance(value, bool | np.bool_):
            return IntegerAttr(int(bool(value)), i1)
        return IntC().encode(value)

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, IntegerAttr)
        if attr.type == i1:
            return bool(attr.value.data)
        return int(attr.value.data)


@dataclass(frozen=True)
class NumberC(Codec):
    """An optional int or float (e.g. ``gather``'s ``fill_value``)."""

    attr_type = (IntegerAttr, FloatAttr)
    optional: bool = True

    def encode(self, value: Any) -> Attribute | None:
        if value is None:
            return None
        if isinstance(value, int | np.integer) and not isinstance(value, bool):
            return IntegerAttr(int(value), i64)
        _check(isinstance(value, float | np.floating), "number", value)
        return FloatAttr(float(value), f64)

    def decode(self, attr: Attribute | None) -> Any:
        if attr is None:
            return None
        if isinstance(attr, IntegerAttr):
            return int(attr.value.data)
        assert isinstance(attr, FloatAttr)
        return float(attr.value.data)


@dataclass(frozen=True)
class StrC(Codec):
    attr_type = StringAttr

    def encode(self, value: Any) -> Attribute | None:
        _check(isinstance(value, str), "string", value)
        return StringAttr(value)

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, StringAttr)
        return attr.data


@dataclass(frozen=True)
class IntsC(Codec):
    """A tuple of ints; ``optional`` allows ``None`` (omitted)."""

    attr_type = DenseArrayBase
    optional: bool = False

    def encode(self, value: Any) -> Attribute | None:
        if value is None and self.optional:
            return None
        _check(isinstance(value, tuple | list), "int tuple", value)
        return ints_attr(value)

    def decode(self, attr: Attribute | None) -> Any:
        if attr is None:
            return None
        assert isinstance(attr, DenseArrayBase)
        return ints_of(attr)


@dataclass(frozen=True)
class BoolsC(Codec):
    attr_type = DenseArrayBase

    def encode(self, value: Any) -> Attribute | None:
        _check(isinstance(value, tuple | list), "bool tuple", value)
        return DenseArrayBase.from_list(i1, [int(bool(v)) for v in value])

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, DenseArrayBase)
        return tuple(bool(v) for v in attr.get_values())


@dataclass(frozen=True)
class IntTableC(Codec):
    """A tuple of equal-length int tuples (padding pairs, pad configs), as a
    ``dense<[[lo, hi], ...]> : tensor<Nx2xi64>`` attribute."""

    attr_type = DenseIntOrFPElementsAttr
    width: int = 2

    def encode(self, value: Any) -> Attribute | None:
        rows = [tuple(int(x) for x in row) for row in value]
        _check(all(len(r) == self.width for r in rows), f"{self.width}-tuple table", value)
        flat = [x for r in rows for x in r]
        return DenseIntOrFPElementsAttr.from_list(TensorType(i64, [len(rows), self.width]), flat)

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, DenseIntOrFPElementsAttr)
        flat = [int(v) for v in attr.get_values()]
        return tuple(tuple(flat[k : k + self.width]) for k in range(0, len(flat), self.width))


@dataclass(frozen=True)
class DTypeC(Codec):
    """A numpy dtype as an element type (``f32``); ``optional`` allows ``None``."""

    attr_type = TypeAttribute
    optional: bool = False

    def encode(self, value: Any) -> Attribute | None:
        if value is None and self.optional:
            return None
        return element_type(np.dtype(value))

    def decode(self, attr: Attribute | None) -> Any:
        if attr is None:
            return None
        return numpy_dtype(attr)


@dataclass(frozen=True)
class EnumC(Codec):
    """A Python enum member by name; ``optional`` allows ``None``."""

    attr_type = StringAttr
    enum_type: type[enum.Enum] = enum.Enum
    optional: bool = False

    def encode(self, value: Any) -> Attribute | None:
        if value is None and self.optional:
            return None
        _check(isinstance(value, self.enum_type), self.enum_type.__name__, value)
        return StringAttr(value.name.lower())

    def decode(self, attr: Attribute | None) -> Any:
        if attr is None:
            return None
        assert isinstance(attr, StringAttr)
        try:
            return self.enum_type[attr.data.upper()]
        except KeyError:
            raise AlpaError(
                f"'{attr.data}' is not a {self.enum_type.__name__}; expected one of "
                + ", ".join(m.name.lower() for m in self.enum_type)
            ) from None


@dataclass(frozen=True)
class PrecisionC(Codec):
    """``None``, one ``lax.Precision``, or a pair (lhs, rhs)."""

    attr_type = (StringAttr, ArrayAttr)
    optional: bool = True

    def encode(self, value: Any) -> Attribute | None:
        if value is None:
            return None
        if isinstance(value, tuple):
            return ArrayAttr([self._one(v) for v in value])
        return self._one(value)

    @staticmethod
    def _one(value: Any) -> StringAttr:
        if isinstance(value, lax.Precision):
            return StringAttr(value.name.lower())
        if isinstance(value, lax.DotAlgorithmPreset):
            return StringAttr("algorithm:" + value.name.lower())
        raise AlpaError(f"cannot encode precision parameter value {value!r}")

    @staticmethod
    def _decode_one(attr: Attribute) -> Any:
        assert isinstance(attr, StringAttr)
        if attr.data.startswith("algorithm:"):
            return lax.DotAlgorithmPreset[attr.data.removeprefix("algorithm:").upper()]
        return lax.Precision[attr.data.upper()]

    def decode(self, attr: Attribute | None) -> Any:
        if attr is None:
            return None
        if isinstance(attr, ArrayAttr):
            return tuple(self._decode_one(a) for a in attr.data)
        return self._decode_one(attr)


@dataclass(frozen=True)
class StructC(Codec):
    """A record of int tuples (dimension numbers) as an :class:`IntTuplesAttr`."""

    attr_type = IntTuplesAttr
    attr_class: type[IntTuplesAttr] = DotDimsAttr
    to_python: Callable[[tuple[tuple[int, ...], ...]], Any] = tuple
    from_python: Callable[[Any], Sequence[Sequence[int]]] = tuple

    def constraint(self) -> Any:
        return self.attr_class

    def encode(self, value: Any) -> Attribute | None:
        fields = self.from_python(value)
        return self.attr_class(*[ints_attr(f) for f in fields])

    def decode(self, attr: Attribute | None) -> Any:
        assert isinstance(attr, self.attr_class)
        return self.to_python(attr.as_tuples())


def _dot_from_python(v: Any) -> Sequence[Sequence[int]]:
    (lc, rc), (lb, rb) = v
    return (lc, rc, lb, rb)


def _dot_to_python(t: tuple[tuple[int, ...], ...]) -> Any:
    return ((t[0], t[1]), (t[2], t[3]))


DOT_DIMS = StructC(DotDimsAttr, _dot_to_python, _dot_from_python)
CONV_DIMS = StructC(ConvDimsAttr, lambda t: lax.ConvDimensionNumbers(*t), lambda v: tuple(v))
GATHER_DIMS = StructC(
    GatherDimsAttr,
    lambda t: lax.GatherDimensionNumbers(*t),
    lambda v: tuple(getattr(v, n) for n in GatherDimsAttr.field_names()),
)
SCATTER_DIMS = StructC(
    ScatterDimsAttr,
    lambda t: lax.ScatterDimensionNumbers(*t),
    lambda v: tuple(getattr(v, n) for n in ScatterDimsAttr.field_names()),
)


@dataclass(frozen=True)
class DroppedC(Codec):
    """A parameter that carries no semantics here and is not kept (sharding
    hints of JAX's explicit-sharding mode): encoded as nothing, decoded as
    ``None``."""

    attr_type = Attribute

    def encode(self, value: Any) -> Attribute | None:
        return None

    def decode(self, attr: Attribute | None) -> Any:
        return None


@dataclass(frozen=True)
class NoneOnlyC(Codec):
    """A parameter that must be ``None`` to be imported (e.g. ``accuracy``)."""

    attr_type = Attribute

    def encode(self, value: Any) -> Attribute | None:
        _check(value is None, "(only None supported)", value)
        return None

    def decode(self, attr: Attribute | None) -> Any:
        return None


@dataclass(frozen=True)
class PrimitiveNameC(Codec):
    """A primitive passed as a parameter (``select_and_scatter_add``'s
    ``select_prim``), by name."""

    attr_type = StringAttr

    def encode(self, value: Any) -> Attribute | None:
        return StringAttr(value.name)

    def decode(self, attr: Attribute | None) -> Any:
        from alpa_ir.dialects.jax_primitives import lookup_primitive

        assert isinstance(attr, StringAttr)
        return lookup_primitive(attr.data)


@dataclass(frozen=True)
class PrngImplC(Codec):
    """A PRNG implementation (``random_seed``'s and ``random_wrap``'s ``impl``)
    by its tag (``fry``); only the implementations JAX ships are known."""

    attr_type = StringAttr

    def encode(self, value: Any) -> Attribute | None:
        tag = getattr(value, "tag", None)
        _check(tag in KEY_SHAPES, "PRNG implementation shipped with JAX", value)
        return StringAttr(tag)

    def decode(self, attr: Attribute | None) -> Any:
        import jax.extend.random as jr

        assert isinstance(attr, StringAttr)
        for impl in (jr.threefry_prng_impl, jr.rbg_prng_impl, jr.unsafe_rbg_prng_impl):
            if impl.tag == attr.data:
                return impl
        raise AlpaError(f"unknown PRNG implementation '{attr.data}'")


@dataclass(frozen=True)
class MemorySpaceC(Codec):
    """JAX's memory space of a value (``empty2``'s ``memory_space``), by name."""

    attr_type = StringAttr

    def encode(self, value: Any) -> Attribute | None:
        _check(isinstance(value, enum.Enum), "memory space", value)
        return StringAttr(value.name.lower())

    def decode(self, attr: Attribute | None) -> Any:
        from jax._src.core import MemorySpace

        assert isinstance(attr, StringAttr)
        for member in MemorySpace:
            if member.name.lower() == attr.data:
                return member
        raise AlpaError(f"unknown memory space '{attr.data}'")


# Shared codec instances used by the primitive table.
INT = IntC()
BOOL = BoolC()
INTS = IntsC()
OPT_INTS = IntsC(optional=True)
DTYPE = DTypeC()
OPT_DTYPE = DTypeC(optional=True)
PAIRS = IntTableC(2)
TRIPLES = IntTableC(3)
DROPPED = DroppedC()
NONE_ONLY = NoneOnlyC()
GATHER_MODE = EnumC(lax.GatherScatterMode)
ROUNDING = EnumC(lax.RoundingMethod)
PRNG_IMPL = PrngImplC()
MEMORY_SPACE = MemorySpaceC()
