"""Find a JAX primitive object by its name, and bind it again (IR -> JAX)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from jax.extend.core import Primitive

from alpa_ir.errors import AlpaError

# Modules of jax that define the primitives a training step can contain. This
# is jax-internal API (there is no public name -> primitive table); the list is
# checked by tests against every primitive of the lax dialect.
_PRIMITIVE_MODULES = (
    "jax._src.lax.lax",
    "jax._src.lax.slicing",
    "jax._src.lax.convolution",
    "jax._src.lax.windowed_reductions",
    "jax._src.lax.control_flow.loops",
    "jax._src.lax.control_flow.conditionals",
    "jax._src.lax.special",
    "jax._src.lax.ann",
    "jax._src.lax.parallel",
    "jax._src.pjit",
    "jax._src.lax.fft",
    "jax._src.lax.linalg",
    "jax._src.ad_util",
    "jax._src.random",
    "jax._src.prng",
    "jax._src.random.prng",
    "jax._src.random.threefry2x32",
    "alpa_ir.frontend.markers",
    "alpa_ir.frontend.random_rows",
)


@cache
def primitive_table() -> Mapping[str, Primitive]:
    """Name -> primitive for every primitive defined in the modules above."""
    table: dict[str, Primitive] = {}
    for module_name in _PRIMITIVE_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for value in vars(module).values():
            if isinstance(value, Primitive):
                table.setdefault(value.name, value)
    return table


def bind_primitive(
    primitive: Primitive, args: Sequence[Any], params: Mapping[str, Any], dropped: Iterable[str]
) -> Any:
    """``primitive.bind(*args, **params)``; a ``dropped`` parameter (a sharding
    hint the IR does not keep, bound as None) that the running JAX's primitive
    does not take is left out: JAX adds these release by release
    (``out_sharding`` of ``reduce_max`` since 0.11), so one table binds on both."""
    try:
        return primitive.bind(*args, **params)
    except TypeError as exc:
        extra = [k for k in dropped if params.get(k, 0) is None and f"'{k}'" in str(exc)]
        if not extra:
            raise
    return primitive.bind(*args, **{k: v for k, v in params.items() if k not in extra})


def lookup_primitive(name: str) -> Primitive:
    try:
        return primitive_table()[name]
    except KeyError:
        raise AlpaError(f"unknown JAX primitive '{name}'") from None
