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


def auto_donated(args: tuple[Any, ...], out: Any) -> tuple[int, ...]:
    """Positions of ``args`` that ``donate_argnums="auto"`` donates: every
    ``flax.training.train_state.TrainState`` (Alpa's rule), and every other
    container whose array leaves all come back as outputs at their paths
    (the step returns the state it updates: a dict or tuple of parameters and
    optimizer state). A bare array is never donated by ``"auto"`` (Alpa's
    users keep reading ``a`` after ``b = step(a)``)."""
    from flax.training.train_state import TrainState

    returned: set[tuple[Any, ...]] = set()
    for paths, leaf in output_paths(out):
        for path in paths:
            returned.add((path, tuple(leaf.shape), str(leaf.dtype)))
    donated = []
    for k, arg in enumerate(args):
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        arrays = [(tuple(p), x) for p, x in leaves if hasattr(x, "shape") and hasattr(x, "dtype")]
        container = bool(arrays) and not (len(leaves) == 1 and leaves[0][0] == ())
        if isinstance(arg, TrainState) or (
            container and all((p, tuple(x.shape), str(x.dtype)) in returned for p, x in arrays)
        ):
            donated.append(k)
    return tuple(donated)
