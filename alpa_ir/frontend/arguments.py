"""The arguments of a training step as the compiler sees them.

- Static arguments are bound into the traced function and become part of
  the compilation's key: those given by ``static_argnums``, or with
  ``static_argnums="auto"`` Alpa's rule: a top-level argument that is a
  Python ``bool``, ``int``, ``float`` or ``str``, or a pytree with a leaf that
  is not an array (a string, a callable), is static.
- Every other leaf is an array: a JAX or numpy array, a
  ``jax.ShapeDtypeStruct``, a typed PRNG key array, or a Python scalar, which
  becomes a 0-d array (weakly typed, as under ``jax.jit``).
- A leaf that is none of these is an :class:`~alpa_ir.errors.AlpaError`
  naming it by its path (``state.step``, ``batch.x``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import leaf_path_name

StaticArgnums = Sequence[int] | Literal["auto"]

_SCALARS = (bool, int, float, complex)


def argument_names(fn: Callable[..., Any], count: int) -> list[str]:
    """The parameter names of ``fn`` for ``count`` positional arguments (``arg<k>`` past them)."""
    import inspect

    try:
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        params = []
    return [params[k] if k < len(params) else f"arg{k}" for k in range(count)]


def is_array_leaf(x: Any) -> bool:
    """Whether a pytree leaf is (or describes) an array the step can take."""
    if isinstance(x, jax.Array | np.ndarray | np.generic | jax.ShapeDtypeStruct):
        return True
    if isinstance(x, _SCALARS):
        return True
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _auto_static(arg: Any) -> bool:
    if isinstance(arg, bool | int | float | str):
        return True
    return any(not is_array_leaf(x) for x in jax.tree.leaves(arg))


def resolve_static_argnums(args: Sequence[Any], static_argnums: StaticArgnums) -> tuple[int, ...]:
    """The static argument positions: as given, or by Alpa's rule for ``"auto"``."""
    if isinstance(static_argnums, str):
        if static_argnums != "auto":
            raise AlpaError(
                f"static_argnums must be a sequence of ints or 'auto', got {static_argnums!r}"
            )
        return tuple(k for k, a in enumerate(args) if _auto_static(a))
    out = []
    for k in static_argnums:
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            raise AlpaError(f"static_argnums must hold ints, got {k!r}")
        k = int(k)
        if not -len(args) <= k < len(args):
            raise AlpaError(
                f"static_argnums names argument {k} but the step is called with {len(args)}"
            )
        out.append(k % len(args))
    return tuple(sorted(set(out)))


def abstract_leaf(x: Any, where: str) -> jax.ShapeDtypeStruct:
    """The shape and dtype of one leaf; a Python scalar is a 0-d (weakly typed) array."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, _SCALARS) or not is_array_leaf(x):
        if not isinstance(x, _SCALARS):
            raise AlpaError(
                f"{where} is a {type(x).__name__}, not an array; pass it as a static "
                "argument (static_argnums) or make it an array"
            )
        aval = jax.typeof(x)
        return jax.ShapeDtypeStruct((), aval.dtype, weak_type=True)
    try:
        return jax.ShapeDtypeStruct(tuple(np.shape(x)), x.dtype)
    except TypeError as exc:
        raise AlpaError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class StepArguments:
    """A call's arguments split into the static ones and the traced ones."""

    names: tuple[str, ...]
    """Parameter name of every argument."""
    static_argnums: tuple[int, ...]
    args: tuple[Any, ...]

    @property
    def dynamic_argnums(self) -> tuple[int, ...]:
        return tuple(k for k in range(len(self.args)) if k not in self.static_argnums)

    @property
    def dynamic(self) -> tuple[Any, ...]:
        return tuple(self.args[k] for k in self.dynamic_argnums)

    @property
    def dynamic_names(self) -> list[str]:
        return [self.names[k] for k in self.dynamic_argnums]

    def dynamic_positions(self, argnums: Sequence[int]) -> tuple[int, ...]:
        """Positions among the dynamic arguments of the arguments ``argnums``
        (static ones drop out)."""
        dynamic = self.dynamic_argnums
        return tuple(dynamic.index(k) for k in argnums if k in dynamic)

    def bind(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a function of the dynamic arguments, the static ones bound."""
        static = {k: self.args[k] for k in self.static_argnums}
        total = len(self.args)

        def bound(*dynamic: Any) -> Any:
            it = iter(dynamic)
            return fn(*(static[k] if k in static else next(it) for k in range(total)))

        return bound

    def leaf_names(self) -> list[str]:
        """A readable path per leaf of the dynamic arguments (``state.params.w``)."""
        names = self.dynamic_names
        return [
            leaf_path_name(path, names)
            for path, _ in jax.tree_util.tree_flatten_with_path(self.dynamic)[0]
        ]

    def abstract(self) -> tuple[Any, ...]:
        """The dynamic arguments with every leaf a ``jax.ShapeDtypeStruct``."""
        leaves, tree = jax.tree.flatten(self.dynamic)
        avals = [abstract_leaf(x, n) for x, n in zip(leaves, self.leaf_names(), strict=True)]
        return tuple(jax.tree.unflatten(tree, avals))

    def static_key(self) -> Hashable:
        """The static arguments as part of a cache key."""
        key = []
        for k in self.static_argnums:
            value = self.args[k]
            try:
                hash(value)
            except TypeError:
                raise AlpaError(
                    f"static argument {self.names[k]} ({type(value).__name__}) is not hashable"
                ) from None
            key.append((k, type(value), value))
        return tuple(key)


def step_arguments(
    fn: Callable[..., Any], args: Sequence[Any], static_argnums: StaticArgnums = ()
) -> StepArguments:
    args = tuple(args)
    return StepArguments(
        tuple(argument_names(fn, len(args))), resolve_static_argnums(args, static_argnums), args
    )


def signature_key(args: StepArguments) -> Hashable:
    """A key that tells calls needing different compilations apart: the
    structure, the shape and dtype of every dynamic leaf, and the static values."""
    leaves, tree = jax.tree.flatten(args.dynamic)
    names = args.leaf_names()
    avals = []
    for x, name in zip(leaves, names, strict=True):
        a = abstract_leaf(x, name)
        avals.append((tuple(a.shape), str(a.dtype)))
    return (tree, tuple(avals), args.static_key())


@dataclass(frozen=True)
class CompiledSignature:
    """What an executable was compiled for: the arguments' structure (static
    ones excluded), each leaf's path, shape and dtype, and the outputs' structure.
    Executables take the step's full argument list and flatten it here."""

    num_args: int
    static_argnums: tuple[int, ...]
    in_tree: Any
    out_tree: Any
    leaf_names: tuple[str, ...]
    avals: tuple[tuple[tuple[int, ...], Any], ...]
    """(shape, dtype) of every dynamic leaf, whole batch."""

    def dynamic(self, args: Sequence[Any]) -> tuple[Any, ...]:
        if len(args) != self.num_args:
            raise AlpaError(f"the step was compiled for {self.num_args} arguments, got {len(args)}")
        return tuple(a for k, a in enumerate(args) if k not in self.static_argnums)

    def flatten(self, args: Sequence[Any]) -> list[Any]:
        """The dynamic leaves of ``args``, checked against the compiled signature."""
        flat, tree = jax.tree.flatten(self.dynamic(args))
        if tree != self.in_tree:
            raise AlpaError(
                f"arguments have structure {_short(tree)}, the step was compiled for "
                f"{_short(self.in_tree)}"
            )
        for x, name, (shape, dtype) in zip(flat, self.leaf_names, self.avals, strict=True):
            got = abstract_leaf(x, name)
            if tuple(got.shape) != shape or str(got.dtype) != str(dtype):
                raise AlpaError(
                    f"compiled for {_aval_text(shape, str(dtype))} at {name}, called with "
                    f"{_aval_text(tuple(got.shape), str(got.dtype))}"
                )
        return flat

    def unflatten_outputs(self, outs: Sequence[Any]) -> Any:
        return jax.tree.unflatten(self.out_tree, list(outs))


def compiled_signature(arguments: StepArguments, in_tree: Any, out_tree: Any) -> CompiledSignature:
    leaves = jax.tree.leaves(arguments.dynamic)
    names = arguments.leaf_names()
    avals = []
    for x, name in zip(leaves, names, strict=True):
        a = abstract_leaf(x, name)
        avals.append((tuple(int(d) for d in a.shape), a.dtype))
    return CompiledSignature(
        len(arguments.args),
        arguments.static_argnums,
        in_tree,
        out_tree,
        tuple(names),
        tuple(avals),
    )


_DTYPE_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int32": "i32",
    "int64": "i64",
    "uint32": "u32",
    "bool": "bool",
    "int8": "i8",
    "uint8": "u8",
}


def _aval_text(shape: tuple[int, ...], dtype: str) -> str:
    return f"{_DTYPE_SHORT.get(dtype, dtype)}{list(shape)}"


def _short(tree: Any, limit: int = 160) -> str:
    text = str(tree)
    return text if len(text) <= limit else text[: limit - 3] + "..."
