"""Generic encoding of the parameters of primitives without a dedicated op
(``lax.primitive``): ints, floats, bools, strings, dtypes, ``None`` and
(nested) tuples of these."""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    UnitAttr,
    f64,
    i1,
    i64,
)
from xdsl.ir import Attribute, TypeAttribute

from alpa_ir.dialects.types import element_type, numpy_dtype
from alpa_ir.errors import AlpaError


def encode_generic(value: Any, *, where: str = "") -> Attribute:
    """Encode a parameter value; raises AlpaError for anything else."""
    if value is None:
        return UnitAttr()
    if isinstance(value, bool | np.bool_):
        return IntegerAttr(int(bool(value)), i1)
    if isinstance(value, int | np.integer):
        return IntegerAttr(int(value), i64)
    if isinstance(value, float | np.floating):
        return FloatAttr(float(value), f64)
    if isinstance(value, str):
        return StringAttr(value)
    if isinstance(value, tuple | list):
        return ArrayAttr([encode_generic(v, where=where) for v in value])
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return element_type(np.dtype(value))
    raise AlpaError(f"cannot encode parameter {where}of type {type(value).__name__}: {value!r}")


def decode_generic(attr: Attribute) -> Any:
    if isinstance(attr, UnitAttr):
        return None
    if isinstance(attr, IntegerAttr):
        return bool(attr.value.data) if attr.type == i1 else int(attr.value.data)
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, ArrayAttr):
        return tuple(decode_generic(a) for a in attr.data)
    if isinstance(attr, TypeAttribute):
        return numpy_dtype(attr)
    raise AlpaError(f"cannot decode generic parameter {attr}")
