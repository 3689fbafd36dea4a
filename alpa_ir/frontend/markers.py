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

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
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
    """The tangents of differentiable values cross the mirrored boundary; those
    of integer and boolean values (``float0``, e.g. a causal mask passed from
    one layer to the next) carry nothing and stay symbolic zeros outside it."""
    out = pipeline_marker_p.bind(*primals, kind=kind)
    if not primals:  # an operand-free boundary: a position in the forward pass only
        return out, []
    live = [k for k, p in enumerate(primals) if jnp.issubdtype(jnp.result_type(p), jnp.inexact)]
    marked = pipeline_marker_p.bind(*(ad.instantiate_zeros(tangents[k]) for k in live), kind=kind)
    out_tangents: list[Any] = [ad.Zero(jax.typeof(p).to_tangent_aval()) for p in primals]
    for k, t in zip(live, marked, strict=True):
        out_tangents[k] = t
    return out, out_tangents


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

    ``x = mark_pipeline_boundary(x)`` for one value, or a tuple for several
    (pytrees are accepted and returned with the same structure): JAX mirrors
    the boundary into the backward pass. ``mark_pipeline_boundary()`` with no
    argument, as in Alpa, marks the boundary at its position in the traced
    program (returns None); the compiler mirrors it
    (:mod:`alpa_ir.pipeline.layer_mirroring`).
    """
    leaves, tree = jax.tree.flatten(xs)
    out = pipeline_marker_p.bind(*leaves, kind="layer")
    if not xs:
        return None
    result = jax.tree.unflatten(tree, list(out))
    return result[0] if len(xs) == 1 else result


def manual_layer_construction(
    fun: Callable[..., Any] | None = None,
    *,
    static_argnums: Sequence[int] = (),
    remat_layer: bool = False,
) -> Any:
    """Alpa's decorator of a function whose ``mark_pipeline_boundary()`` calls
    delimit its layers (``@manual_layer_construction`` or
    ``manual_layer_construction(fn)``). Here a boundary is a layer boundary
    wherever it is traced (:class:`~alpa_ir.api.pipeshard.ManualLayerOption`
    reads the markers; the backward pass mirrors them), so the function is
    returned as it is; ``static_argnums`` is accepted as Alpa's. Layers
    recomputed in the backward pass are the method's option
    (``ManualLayerOption(remat_layer=True)``), not the decorator's."""
    if remat_layer:
        from alpa_ir.errors import AlpaError

        raise AlpaError(
            "manual_layer_construction(remat_layer=True): recompute layers with the "
            "method's ManualLayerOption(remat_layer=True)"
        )
    del static_argnums
    if fun is None:
        return lambda f: f
    return fun


def _mark_grads(grads: Any) -> Any:
    leaves, tree = jax.tree.flatten(grads)
    return jax.tree.unflatten(tree, list(pipeline_marker_p.bind(*leaves, kind="grad")))


@dataclass(frozen=True)
class AutomaticLayers:
    """Slice differentiated functions into ``layers`` layers (``cluster-operators``)."""

    layers: int
    delta: float = 0.5
    fit_delta: bool = False
    """``cluster-operators``' ``fit-delta``: raise δ while that lowers the bytes
    layers receive."""


_AUTOMATIC_LAYERS: ContextVar[AutomaticLayers | None] = ContextVar(
    "alpa_ir_automatic_layers", default=None
)
"""Set only while a step is traced for ``AutoLayerOption`` (see
:func:`automatic_layers`); ``grad`` and ``value_and_grad`` read it to insert
layer markers into the function they differentiate, as Alpa's
``automatic_layer_construction`` does."""


@contextlib.contextmanager
def automatic_layers(option: AutomaticLayers) -> Iterator[None]:
    """Within this block, differentiated functions get layer markers from ``option``."""
    token = _AUTOMATIC_LAYERS.set(option)
    try:
        yield
    finally:
        _AUTOMATIC_LAYERS.reset(token)


def _layered(fun: Callable[..., Any]) -> Callable[..., Any]:
    """``fun`` with the layer markers ``cluster-operators`` chooses, when asked for."""
    option = _AUTOMATIC_LAYERS.get()
    if option is None:
        return fun

    def marked(*a: Any, **k: Any) -> Any:
        from alpa_ir.frontend.jax_export import eval_block
        from alpa_ir.frontend.jax_versions import eval_jaxpr, jaxpr_and_consts
        from alpa_ir.frontend.jaxpr_import import import_jax
        from alpa_ir.ir.module_utils import main_function
        from alpa_ir.passmanager.pass_manager import PassManager
        from alpa_ir.plugins.registry import default_registry

        # The function may close over values of the enclosing trace (the batch):
        # make them explicit arguments so that the forward computation imports.
        closed, out_shape = jax.make_jaxpr(lambda *args: fun(*args, **k), return_shape=True)(*a)

        open_jaxpr, closed_consts = jaxpr_and_consts(closed)

        def explicit(consts: list[Any], *args: Any) -> list[Any]:
            return eval_jaxpr(open_jaxpr, consts, *jax.tree.leaves(args))

        def shape_of(x: Any) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct(jax.numpy.shape(x), jax.numpy.result_type(x))

        consts = list(closed_consts)
        module = import_jax(explicit, [shape_of(c) for c in consts], *jax.tree.map(shape_of, a))
        fit = "true" if option.fit_delta else "false"
        options = f"layers={option.layers} delta={option.delta!r} fit-delta={fit}"
        # the one pass that plans at trace time (DESIGN.md): through the pass manager
        PassManager(default_registry(), f"builtin.module(cluster-operators{{{options}}})").run(
            module
        )
        outs = eval_block(main_function(module).body.block, [*consts, *jax.tree.leaves(a)])
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return marked


def value_and_grad(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """Like ``jax.value_and_grad``; marks the gradients as the forward/backward end."""
    vg = jax.value_and_grad(_layered(fun), *args, **kwargs)

    def wrapped(*a: Any, **k: Any) -> Any:
        value, grads = vg(*a, **k)
        return value, _mark_grads(grads)

    return wrapped


def grad(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """Like ``jax.grad``; marks the gradients as the forward/backward end."""
    g = jax.grad(_layered(fun), *args, **kwargs)

    def wrapped(*a: Any, **k: Any) -> Any:
        grads = g(*a, **k)
        if kwargs.get("has_aux"):
            grads, aux = grads
            return _mark_grads(grads), aux
        return _mark_grads(grads)

    return wrapped
