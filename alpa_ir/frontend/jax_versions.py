"""The JAX releases the frontend reads, and what differs between them: one table.

The importer and the binder read JAX internals (jaxprs, primitives and their parameters),
which move between releases. Every difference the frontend knows of is a row of
:data:`DIFFERENCES`, with the place that handles it; the helpers below are those places
where a row needs code. ``tests/frontend/test_jax_versions.py`` checks each row against the
installed JAX (0.10 on this project's CI; 0.11 where a machine has it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True)
class VersionDifference:
    """One difference: what changed, in which release, and what handles it."""

    what: str
    since: str
    handled_by: str


DIFFERENCES: tuple[VersionDifference, ...] = (
    VersionDifference(
        "ClosedJaxpr merged into Jaxpr (the constants live on the jaxpr)",
        "0.11",
        "jax_versions.jaxpr_and_consts, jax_versions.is_jaxpr",
    ),
    VersionDifference(
        "jaxpr types importable from jax.extend.core only (jax.core names removed)",
        "0.11",
        "jax_versions.ShapedArray, jax_versions.eval_jaxpr",
    ),
    VersionDifference(
        "out_sharding parameter on every reduction (0.10: reduce_sum only)",
        "0.11",
        "lax_primitives: DROPPED codec; primitives.bind_primitive leaves it out when unknown",
    ),
    VersionDifference(
        "an `empty` primitive (jnp.empty) in traced steps",
        "0.11",
        "not in the lax table: imported as the generic lax.primitive op, bound again by "
        "name; no sharding rule (the planner keeps it replicated, with a warning)",
    ),
    VersionDifference(
        "pjit.AUTO removed",
        "0.11",
        "not used by the frontend",
    ),
    VersionDifference(
        "sharding_constraint / reshard carry a NamedSharding over an AbstractMesh",
        "0.10",
        "dialects.sharding_hint.ShardingHint.of (mesh axis names and sizes only)",
    ),
)


def version() -> tuple[int, int]:
    """The installed JAX's (major, minor)."""
    major, minor = jax.__version__.split(".")[:2]
    return int(major), int(minor)


def _closed_type() -> type | None:
    import jax.extend.core as core

    return getattr(core, "ClosedJaxpr", None)


def is_jaxpr(value: Any) -> bool:
    """Whether ``value`` is a jaxpr, closed or not, in either release."""
    import jax.extend.core as core

    closed = _closed_type()
    return isinstance(value, core.Jaxpr) or (closed is not None and isinstance(value, closed))


def jaxpr_and_consts(value: Any) -> tuple[Any, tuple[Any, ...]]:
    """The open jaxpr and its constants of a (closed) jaxpr: a ``ClosedJaxpr``'s
    parts on 0.10, a ``Jaxpr`` with its constants on 0.11, a bare jaxpr and ()."""
    closed = _closed_type()
    if closed is not None and isinstance(value, closed):
        return value.jaxpr, tuple(value.consts)
    return value, tuple(getattr(value, "consts", ()) or ())


def shaped_array(shape: tuple[int, ...], dtype: Any) -> Any:
    """``ShapedArray(shape, dtype)`` from where the installed JAX keeps it."""
    import jax.extend.core as ext

    make = getattr(ext, "ShapedArray", None)
    if make is None:
        from jax.core import ShapedArray as make  # 0.10
    return make(shape, dtype)


def eval_jaxpr(jaxpr: Any, consts: Any, *args: Any) -> Any:
    """``eval_jaxpr`` from where the installed JAX keeps it."""
    import jax.extend.core as ext

    run = getattr(ext, "eval_jaxpr", None) or jax.core.eval_jaxpr
    return run(jaxpr, consts, *args)
