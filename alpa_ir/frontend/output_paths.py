"""Where an output leaf sits relative to what a step returns, for matching it
with the argument leaf it is the new value of (donation aliases, static leaves).

An argument leaf's path is taken below its argument (``state.params[...]``
in argument 0 is ``.params[...]``). A step returns either a tuple of values
(``return state, loss``: an output leaf's path is taken below its element,
``(state, loss)[0].params[...]`` is ``.params[...]``) or one bare pytree
(``return state.apply_gradients(...)``: the whole path, ``.params[...]``).
A tuple or list return is tried both ways, element first: a step whose state
is itself a tuple may return that tuple bare.
"""

from __future__ import annotations

from typing import Any

import jax

PathKey = tuple[Any, ...]


def argument_paths(args: tuple[Any, ...]) -> list[tuple[PathKey, Any]]:
    """(path below its argument, leaf) for every leaf of the arguments."""
    return [(tuple(p[1:]), x) for p, x in jax.tree_util.tree_flatten_with_path(args)[0]]


def output_paths(out: Any) -> list[tuple[list[PathKey], Any]]:
    """(candidate paths, best first, leaf) for every leaf of a step's output."""
    sequence = isinstance(out, tuple | list) and not hasattr(out, "_fields")
    rows = []
    for p, x in jax.tree_util.tree_flatten_with_path(out)[0]:
        rows.append(([tuple(p[1:]), tuple(p)] if sequence else [tuple(p)], x))
    return rows
