"""``random_bits_rows``: the rows of a larger draw of random bits.

Under micro-batching a step traced at the micro-batch shape draws, per
micro-batch, ``random_bits(key, (b, ...))``; on one device the whole batch
draws ``random_bits(key, (B, ...))`` once. To draw exactly the one-device
numbers, each micro-batch must draw *its rows* of the whole batch's draw:
``random_bits_rows(key, start, bit_width, shape=(b, ...), global_shape=(B,
...))`` is rows ``start .. start + b`` of ``random_bits(key, global_shape)``
(JAX's partitionable threefry counts elements by their index in the whole
shape, see :mod:`alpa_ir.frontend.local_random`). ``start`` is an int32
scalar operand: the micro-batch's first row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

random_bits_rows_p = Primitive("random_bits_rows")


def _impl(
    key: Any, start: Any, *, bit_width: int, shape: Sequence[int], global_shape: Sequence[int]
) -> Any:
    from alpa_ir.frontend.local_random import local_random_bits

    offsets = [jnp.asarray(start).astype(np.uint32)] + [np.uint32(0)] * (len(shape) - 1)
    return local_random_bits(key, bit_width, tuple(global_shape), tuple(shape), offsets)


def _abstract_eval(
    key: Any, start: Any, *, bit_width: int, shape: Sequence[int], global_shape: Sequence[int]
) -> Any:
    from alpa_ir.frontend.jax_versions import shaped_array

    del key, start, global_shape
    dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}[bit_width]
    return shaped_array(tuple(shape), np.dtype(dtype))


random_bits_rows_p.def_impl(_impl)
random_bits_rows_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(random_bits_rows_p, mlir.lower_fun(_impl, multiple_results=False))


random_split_rows_p = Primitive("random_split_rows")
"""``random_split_rows(key, start, shape=(b, ...), global_shape=(B, ...))``:
rows ``start .. start + b`` of ``jax.random.split(key, global_shape)`` (the
partitionable split counts new keys by their index in the whole shape)."""


def _split_impl(key: Any, start: Any, *, shape: Sequence[int], global_shape: Sequence[int]) -> Any:
    import jax
    from jax.extend.random import threefry2x32_p

    from alpa_ir.frontend.local_random import global_counters

    offsets = [jnp.asarray(start).astype(np.uint32)] + [np.uint32(0)] * (len(shape) - 1)
    hi, lo = global_counters(tuple(global_shape), tuple(shape), offsets)
    words = jax.random.key_data(key)
    k1 = jnp.broadcast_to(words[0], tuple(shape))
    k2 = jnp.broadcast_to(words[1], tuple(shape))
    bits1, bits2 = threefry2x32_p.bind(k1, k2, hi, lo)
    return jax.random.wrap_key_data(jnp.stack([bits1, bits2], axis=-1), impl="threefry2x32")


def _split_abstract_eval(
    key: Any, start: Any, *, shape: Sequence[int], global_shape: Sequence[int]
) -> Any:
    from alpa_ir.frontend.jax_versions import shaped_array

    del start, global_shape
    return shaped_array(tuple(shape), key.dtype)


random_split_rows_p.def_impl(_split_impl)
random_split_rows_p.def_abstract_eval(_split_abstract_eval)
mlir.register_lowering(random_split_rows_p, mlir.lower_fun(_split_impl, multiple_results=False))
