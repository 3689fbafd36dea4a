"""Markers a user puts in a training step: layer boundaries and the gradient boundary.

``mark_pipeline_boundary(*xs)`` returns ``xs`` unchanged and records, in the
jaxpr, the boundary between two layers (Alpa's manual layer option). Its JVP
marks the tangents and its transpose marks the cotangents, so the backward pass
carries the mirrored boundary and each backward layer can be colocated with its
forward layer (Alpa §5.1).

``grad`` / ``value_and_grad`` wrap JAX's and pass the gradients through a
``grad`` marker: everything before it is forward and backward computation,
everything after it is the apply-grad (optimizer) computation.

Both are one identity primitive, ``pipeline_marker``, with a ``kind`` parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

MARKER_KINDS = ("layer", "grad")

pipeline_marker_p = Primitive("pipeline_marker")
pipeline_marker_p.multiple_results = True


def _impl(*xs: Any, kind: str) -> Sequence[Any]:
    del kind
    return xs


def _abstract_eval(*avals: Any, kind: str) -> Sequence[Any]:
    del kind
    return avals


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], *, kind: str) -> tuple[Any, Any]:
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return (
        pipeline_marker_p.bind(*primals, kind=kind),
        pipeline_marker_p.bind(*tangents, kind=kind),
    )


def _transpose(cts: Sequence[Any], *primals: Any, kind: str) -> Sequence[Any]:
    cts = [ad.instantiate_zeros(ct) if type(ct) is ad.Zero else ct for ct in cts]
    del primals
    return pipeline_marker_p.bind(*cts, kind=kind)


def _batch(args: Sequence[Any], dims: Sequence[Any], *, kind: str) -> tuple[Any, Any]:
    return pipeline_marker_p.bind(*args, kind=kind), dims


pipeline_marker_p.def_impl(_impl)
pipeline_marker_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[pipeline_marker_p] = _jvp
ad.primitive_transposes[pipeline_marker_p] = _transpose
batching.primitive_batchers[pipeline_marker_p] = _batch
mlir.register_lowering(pipeline_marker_p, mlir.lower_fun(_impl, multiple_results=True))


def mark_pipeline_boundary(*xs: Any) -> Any:
    """Mark a boundary between two layers; returns its arguments unchanged.

    ``x = mark_pipeline_boundary(x)`` for one value, or a tuple for several.
    Pytrees are accepted and returned with the same structure.
    """
    leaves, tree = jax.tree.flatten(xs)
    out = pipeline_marker_p.bind(*leaves, kind="layer") if leaves else []
    result = jax.tree.unflatten(tree, list(out))
    return result[0] if len(xs) == 1 else result


def _mark_grads(grads: Any) -> Any:
    leaves, tree = jax.tree.flatten(grads)
    return jax.tree.unflatten(tree, list(pipeline_marker_p.bind(*leaves, kind="grad")))


def value_and_grad(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """Like ``jax.value_and_grad``; marks the gradients as the forward/backward end."""
    vg = jax.value_and_grad(fun, *args, **kwargs)

    def wrapped(*a: Any, **k: Any) -> Any:
        value, grads = vg(*a, **k)
        return value, _mark_grads(grads)

    return wrapped


def grad(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """Like ``jax.grad``; marks the gradients as the forward/backward end."""
    g = jax.grad(fun, *args, **kwargs)

    def wrapped(*a: Any, **k: Any) -> Any:
        grads = g(*a, **k)
        if kwargs.get("has_aux"):
            grads, aux = grads
            return _mark_grads(grads), aux
        return _mark_grads(grads)

    return wrapped
