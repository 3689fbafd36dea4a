"""Conversions between JAX/numpy dtypes and shapes and builtin xDSL types."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    ComplexType,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    Signedness,
    StringAttr,
    TensorType,
    bf16,
    f16,
    f32,
    f64,
    i1,
)
from xdsl.ir import Attribute

from alpa_ir.dialects.key_type import KeyType
from alpa_ir.errors import AlpaError


@cache
def _dtype_table() -> dict[np.dtype, Attribute]:
    table: dict[np.dtype, Attribute] = {
        np.dtype(np.float32): f32,
        np.dtype(np.float64): f64,
        np.dtype(np.float16): f16,
        np.dtype(ml_dtypes.bfloat16): bf16,
        np.dtype(np.bool_): i1,
    }
    table[np.dtype(np.complex64)] = ComplexType(f32)
    table[np.dtype(np.complex128)] = ComplexType(f64)
    for bits in (8, 16, 32, 64):
        table[np.dtype(f"int{bits}")] = IntegerType(bits)
        table[np.dtype(f"uint{bits}")] = IntegerType(bits, Signedness.UNSIGNED)
    return table


@cache
def _type_table() -> dict[Attribute, np.dtype]:
    return {attr: dtype for dtype, attr in _dtype_table().items()}


def _key_tag(dtype: object) -> str | None:
    """The implementation tag of a JAX PRNG key dtype (``key<fry>`` -> ``fry``), else None."""
    impl = getattr(dtype, "_impl", None)
    tag = getattr(impl, "tag", None)
    return tag if isinstance(tag, str) and str(dtype) == f"key<{tag}>" else None


@cache
def _key_dtype(tag: str) -> object:
    """JAX's key dtype for an implementation tag (imports JAX on first use)."""
    import jax.extend.random as jr

    for impl in (jr.threefry_prng_impl, jr.rbg_prng_impl, jr.unsafe_rbg_prng_impl):
        if impl.tag == tag:
            import jax

            return jax.random.key(0, impl=impl.name).dtype
    raise AlpaError(f"unsupported PRNG key implementation '{tag}'")


def element_type(dtype: np.dtype | type | object) -> Attribute:
    """The xDSL element type of a numpy/JAX dtype (``float32`` -> ``f32``,
    JAX's ``key<fry>`` -> ``!lax.key<fry>``)."""
    tag = _key_tag(dtype)
    if tag is not None:
        return KeyType(StringAttr(tag))
    try:
        return _dtype_table()[np.dtype(dtype)]  # type: ignore[arg-type]
    except (KeyError, TypeError):
        raise AlpaError(f"unsupported element type {dtype}") from None


def numpy_dtype(elem: Attribute) -> Any:
    """The numpy dtype of an xDSL element type (``f32`` -> ``float32``); JAX's
    key dtype for ``!lax.key<...>``."""
    if isinstance(elem, KeyType):
        return _key_dtype(elem.tag)
    try:
        return _type_table()[elem]
    except KeyError:
        raise AlpaError(f"unsupported element type {elem}") from None


def is_key_type(ty: Attribute) -> bool:
    """Whether ``ty`` is a tensor of PRNG keys."""
    return isinstance(ty, TensorType) and isinstance(ty.element_type, KeyType)


def tensor_type(shape: Sequence[int], dtype: np.dtype | type) -> TensorType:
    return TensorType(element_type(dtype), [int(d) for d in shape])


def shape_of(ty: Attribute) -> tuple[int, ...]:
    # types are immutable: decode each one's shape once (the planner asks
    # hundreds of thousands of times, for a few thousand types)
    kept = getattr(ty, "__dict__", None)
    shape = kept.get("_alpa_shape") if kept is not None else None
    if shape is not None:
        return shape  # type: ignore[no-any-return]
    if not isinstance(ty, TensorType):
        raise AlpaError(f"expected a tensor type, got {ty}")
    shape = tuple(int(d) for d in ty.get_shape())
    object.__setattr__(ty, "_alpa_shape", shape)
    return shape


def dtype_of(ty: Attribute) -> Any:
    if not isinstance(ty, TensorType):
        raise AlpaError(f"expected a tensor type, got {ty}")
    return numpy_dtype(ty.element_type)


def nbytes_of(ty: Attribute) -> int:
    """Bytes of a whole tensor of type ``ty``."""
    if not isinstance(ty, TensorType):
        raise AlpaError(f"expected a tensor type, got {ty}")
    elem = ty.element_type
    itemsize = elem.itemsize if isinstance(elem, KeyType) else numpy_dtype(elem).itemsize
    return int(np.prod(shape_of(ty), dtype=np.int64)) * itemsize


FLOAT_TYPES = (Float16Type, BFloat16Type, Float32Type, Float64Type)
