"""A step whose random draws also depend on the session's seed and call number.

Alpa's ``set_seed(seed)`` seeds the stateful random generator of its devices:
after it, every call of a parallelized step draws new numbers, and the same
seed gives the same numbers again. JAX's draws are pure functions of their
keys, so here the state travels as one more argument of the step, a
``uint32[2]`` word ``(seed, call number)`` (:data:`WORD_NAME`), and
:func:`fold_session_keys` rewrites the step so that every ``random_bits`` draw
uses its key folded with both words (``fold_in(fold_in(key, seed), call)``).

Two draws with the same key and shape in one call still give the same
numbers, and so does a remat's recomputation of a draw: the rewrite keeps
JAX's rule that a key means one stream; it changes which stream. Nested
calls that hold a draw (``jit``, ``custom_jvp_call``, ``custom_vjp_call``,
``checkpoint``) are inlined, as the importer inlines them anyway; a draw
inside a loop or branch (``scan``, ``while``, ``cond``) is an
:class:`~alpa_ir.errors.AlpaError`, as its body would need the word as an
operand of the loop.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend.core as jcore
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import argument_names
from alpa_ir.frontend.jax_versions import is_jaxpr, jaxpr_and_consts

WORD_NAME = "session_random"
"""The name of the step's last argument, the ``uint32[2]`` word (seed, call number)."""

_INLINED_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
"""Where a nested call keeps the jaxpr it runs."""

_INLINED = frozenset(
    {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
     "custom_vjp_call_jaxpr", "checkpoint", "remat"}
)  # fmt: skip


def session_word(seed: int, call: int) -> np.ndarray:
    """The word a step is called with: its seed and call number, as ``uint32[2]``."""
    return np.array([seed % 2**32, call % 2**32], dtype=np.uint32)


def _subjaxprs(params: dict[str, Any]) -> list[Any]:
    found = []
    for value in params.values():
        values = value if isinstance(value, tuple | list) else (value,)
        found += [v for v in values if is_jaxpr(v)]
    return found


def draws(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (open or closed) draws random bits, nested jaxprs included."""
    open_jaxpr, _ = jaxpr_and_consts(jaxpr)
    for eqn in open_jaxpr.eqns:
        if eqn.primitive.name == "random_bits":
            return True
        if any(draws(sub) for sub in _subjaxprs(eqn.params)):
            return True
    return False


def _inner(eqn: Any) -> Any:
    for name in _INLINED_PARAMS:
        value = eqn.params.get(name)
        if value is not None and is_jaxpr(value):
            return value
    return None


def _eval(
    jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], fold: Callable[[Any], Any]
) -> list[Any]:
    """``jaxpr`` evaluated on ``args`` under the caller's trace, each draw's key folded."""
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        values = [read(v) for v in eqn.invars]
        if name == "random_bits":
            with _where(eqn):
                outs: Any = eqn.primitive.bind(fold(values[0]), *values[1:], **eqn.params)
        elif any(draws(sub) for sub in _subjaxprs(eqn.params)):
            inner = _inner(eqn) if name in _INLINED else None
            if inner is None:
                raise AlpaError(
                    f"set_seed: the step draws random numbers inside '{name}'; the session's "
                    "seed reaches draws outside loops and branches only"
                )
            open_inner, inner_consts = jaxpr_and_consts(inner)
            # a custom rule's call takes its constants first, as its jaxpr's inputs
            with _where(eqn):
                outs = _eval(
                    open_inner, inner_consts, values[len(values) - len(open_inner.invars) :], fold
                )
        else:
            outs = _bind(eqn, values)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for var, value in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, jcore.DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _bind(eqn: Any, values: Sequence[Any]) -> Any:
    """``eqn``'s primitive applied to ``values``, as JAX's ``eval_jaxpr`` binds it
    (``get_bind_params`` gives the parameters, or sub-functions and parameters)."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: Sequence[Any] = ()
    if isinstance(bind_params, tuple):
        subfuns, bind_params = bind_params
    with _where(eqn):
        return eqn.primitive.bind(*subfuns, *values, **bind_params)


@contextlib.contextmanager
def _where(eqn: Any) -> Iterator[None]:
    """Within ``eqn``'s name stack and context, as JAX's ``eval_jaxpr``: the
    importer tells the backward pass by its name stack (``transpose(jvp(...))``)."""
    from jax._src import source_info_util

    info = eqn.source_info
    stack = source_info_util.current_name_stack() + info.name_stack
    with contextlib.ExitStack() as scope:
        scope.enter_context(source_info_util.user_context(info.traceback, name_stack=stack))
        manager = getattr(getattr(eqn, "ctx", None), "manager", None)
        if manager is not None:
            scope.enter_context(manager)
        yield


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic)


def fold_session_keys(fn: Callable[..., Any], num_args: int) -> Callable[..., Any]:
    """``fn`` of ``num_args`` arguments as a step of ``num_args + 1``: the last is
    the session word (:func:`session_word`), folded into the key of every draw."""

    def step(*args_and_word: Any) -> Any:
        *args, word = args_and_word
        leaves, tree = jax.tree.flatten(tuple(args))
        dynamic = [k for k, x in enumerate(leaves) if _is_array(x)]

        def bound(*values: Any) -> Any:
            full = list(leaves)
            for k, value in zip(dynamic, values, strict=True):
                full[k] = value
            return fn(*jax.tree.unflatten(tree, full))

        inputs = [leaves[k] for k in dynamic]
        closed, out_shape = jax.make_jaxpr(bound, return_shape=True)(*inputs)
        open_jaxpr, consts = jaxpr_and_consts(closed)

        def fold(key: Any) -> Any:
            return jax.random.fold_in(jax.random.fold_in(key, word[0]), word[1])

        outs = _eval(open_jaxpr, consts, inputs, fold)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    names = [*argument_names(fn, num_args), WORD_NAME]
    step.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in _unique(names)]
    )
    step.__name__ = getattr(fn, "__name__", "step")
    step.__qualname__ = getattr(fn, "__qualname__", step.__name__)
    step.__doc__ = getattr(fn, "__doc__", None)
    return step


def _unique(names: Sequence[str]) -> list[str]:
    """Parameter names made distinct (a ``*args`` step repeats one name)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.append(name if count == 0 else f"{name}{count}")
    return out


__all__ = ["WORD_NAME", "draws", "fold_session_keys", "session_word"]
