"""The arguments of a training step as the compiler sees them.

- Static arguments are bound into the traced function and become part of
  the compilation's key: those given by ``static_argnums``, or with
  ``static_argnums="auto"`` Alpa's rule: a top-level argument that is a
  Python ``bool``, ``int``, ``float`` or ``str`` is static.
- Within the other arguments, every leaf that is an array is traced: a JAX
  or numpy array (in the dtype JAX computes in: numpy's int64 is int32), a
  ``jax.ShapeDtypeStruct``, a typed PRNG key array, or a Python ``int``, which
  becomes a 0-d array (weakly typed, as under ``jax.jit``: flax's
  ``TrainState.step`` starts as the Python int 0 and counts). A leaf that is
  not an array (a function or a sentinel inside an equinox module, a string,
  a Python ``bool`` or ``float`` setting such as a dropout rate) is bound at
  compile time, as under ``equinox.filter_jit``, and part of the
  compilation's key; leaves the step returns that are not arrays come back
  as they were returned while tracing.
- Errors name the argument by its path (``state.step``, ``batch.x``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.pytree_codec import is_array_leaf, leaf_path_name

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


def _auto_static(arg: Any) -> bool:
    """Alpa's rule: a top-level Python ``bool``, ``int``, ``float`` or ``str``
    argument is static (a pytree's non-array leaves are bound one by one)."""
    return isinstance(arg, bool | int | float | str)


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
        return jax.ShapeDtypeStruct(tuple(np.shape(x)), _canonical(x.dtype))
    except TypeError as exc:
        raise AlpaError(f"{where}: {exc}") from None


def _canonical(dtype: Any) -> Any:
    """The dtype JAX computes in (numpy's int64 is int32 without ``jax_enable_x64``)."""
    try:
        return jax.dtypes.canonicalize_dtype(dtype)
    except (TypeError, ValueError):
        return dtype


def _hashable(value: Any) -> Hashable:
    """``value`` itself as a cache key when it is hashable, else its identity."""
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value), value)


@dataclass
class OutputStatics:
    """Filled while tracing: the step's full output structure and its leaves
    that are not arrays (an equinox module's functions), which the
    executables put back around the arrays the program returns."""

    tree: Any = None
    statics: dict[int, Any] | None = None

    def split(self, out: Any) -> Any:
        leaves, self.tree = jax.tree.flatten(out)
        self.statics = {k: x for k, x in enumerate(leaves) if not is_array_leaf(x)}
        return _arrays_only(out)

    def merge(self, arrays: Sequence[Any]) -> Any:
        assert self.tree is not None and self.statics is not None
        it = iter(arrays)
        leaves = [
            self.statics[k] if k in self.statics else next(it) for k in range(self.tree.num_leaves)
        ]
        return jax.tree.unflatten(self.tree, leaves)


def _arrays_only(tree: Any) -> Any:
    """``tree`` with every leaf that is not an array replaced by None (no leaf)."""
    return jax.tree.map(lambda x: x if is_array_leaf(x) else None, tree)


@dataclass(frozen=True)
class StepArguments:
    """A call's arguments split into what is bound at compile time and what is
    traced: static arguments (``static_argnums``), and within the others the
    leaves that are not arrays (functions and other objects inside an equinox
    module, strings), which stay Python values as under ``equinox.filter_jit``.
    Every other leaf is traced (a Python scalar as a 0-d array)."""

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

    @property
    def arrays(self) -> tuple[Any, ...]:
        """The dynamic arguments without their non-array leaves: what is traced."""
        return tuple(_arrays_only(a) for a in self.dynamic)

    def static_leaves(self) -> tuple[tuple[int, Any], ...]:
        """(flat index among the dynamic arguments' leaves, value) of every non-array leaf."""
        return tuple(
            (k, x) for k, x in enumerate(jax.tree.leaves(self.dynamic)) if not is_array_leaf(x)
        )

    def bind(
        self, fn: Callable[..., Any], outputs: OutputStatics | None = None
    ) -> Callable[..., Any]:
        """``fn`` as a function of the traced arrays (the structure of
        :attr:`arrays`): static arguments and non-array leaves are bound; with
        ``outputs``, the non-array leaves of the result are recorded there and
        left out of what the function returns."""
        static = {k: self.args[k] for k in self.static_argnums}
        total = len(self.args)
        full_tree = jax.tree.structure(self.dynamic)
        statics = dict(self.static_leaves())

        def bound(*arrays: Any) -> Any:
            it = iter(jax.tree.leaves(arrays))
            leaves = [statics[k] if k in statics else next(it) for k in range(full_tree.num_leaves)]
            dynamic = iter(jax.tree.unflatten(full_tree, leaves))
            out = fn(*(static[k] if k in static else next(dynamic) for k in range(total)))
            return out if outputs is None else outputs.split(out)

        return bound

    def leaf_names(self) -> list[str]:
        """A readable path per traced leaf (``state.params.w``)."""
        names = self.dynamic_names
        return [
            leaf_path_name(path, names)
            for path, x in jax.tree_util.tree_flatten_with_path(self.dynamic)[0]
            if is_array_leaf(x)
        ]

    def abstract(self) -> tuple[Any, ...]:
        """:attr:`arrays` with every leaf a ``jax.ShapeDtypeStruct``."""
        arrays = self.arrays
        leaves, tree = jax.tree.flatten(arrays)
        avals = [abstract_leaf(x, n) for x, n in zip(leaves, self.leaf_names(), strict=True)]
        return tuple(jax.tree.unflatten(tree, avals))

    def abstracted(self) -> tuple[Any, ...]:
        """All arguments with every traced leaf a ``jax.ShapeDtypeStruct`` (static
        arguments and non-array leaves as they are)."""
        out = list(self.args)
        names = iter(self.leaf_names())
        for k in self.dynamic_argnums:
            out[k] = jax.tree.map(
                lambda x: abstract_leaf(x, next(names)) if is_array_leaf(x) else x, self.args[k]
            )
        return tuple(out)

    def static_key(self) -> Hashable:
        """The static arguments and non-array leaves as part of a cache key."""
        key: list[Hashable] = []
        for k in self.static_argnums:
            value = self.args[k]
            try:
                hash(value)
            except TypeError:
                raise AlpaError(
                    f"static argument {self.names[k]} ({type(value).__name__}) is not hashable"
                ) from None
            key.append((k, type(value), value))
        key += [(k, _hashable(x)) for k, x in self.static_leaves()]
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
    structure, the shape and dtype of every traced leaf, and the static values."""
    tree = jax.tree.structure(args.dynamic)
    try:
        hash(tree)
    except TypeError:
        tree = (str(tree), tuple(id(a) for a in args.dynamic))
    avals = []
    for x, name in zip(jax.tree.leaves(args.arrays), args.leaf_names(), strict=True):
        a = abstract_leaf(x, name)
        avals.append((tuple(a.shape), str(a.dtype)))
    return (tree, tuple(avals), args.static_key())


@dataclass(frozen=True)
class CompiledSignature:
    """What an executable was compiled for: the arguments' structure (static
    ones excluded), each traced leaf's path, shape and dtype, the non-array
    leaves bound at compile time, and the outputs' structure. Executables take
    the step's full argument list and flatten it here."""

    num_args: int
    static_argnums: tuple[int, ...]
    in_tree: Any
    """Structure of the traced arrays (non-array leaves removed)."""
    out_tree: Any
    """Structure of the returned arrays."""
    leaf_names: tuple[str, ...]
    avals: tuple[tuple[tuple[int, ...], Any], ...]
    """(shape, dtype) of every traced leaf, whole batch."""
    full_tree: Any = None
    """Structure of the dynamic arguments, non-array leaves included."""
    static_leaves: tuple[tuple[int, Any], ...] = ()
    outputs: OutputStatics | None = None
    micro_batch_rows: int = 0
    """When the program draws random numbers by batch rows (see
    :mod:`alpa_ir.pipeline.micro_batch_random`): the batch size; ``arange`` of it is
    passed as one more input."""

    def dynamic(self, args: Sequence[Any]) -> tuple[Any, ...]:
        if len(args) != self.num_args:
            raise AlpaError(f"the step was compiled for {self.num_args} arguments, got {len(args)}")
        return tuple(a for k, a in enumerate(args) if k not in self.static_argnums)

    def flatten(self, args: Sequence[Any]) -> list[Any]:
        """The traced leaves of ``args``, checked against the compiled signature."""
        leaves, tree = jax.tree.flatten(self.dynamic(args))
        if tree != self.full_tree:
            raise AlpaError(
                f"arguments have structure {_short(tree)}, the step was compiled for "
                f"{_short(self.full_tree)}"
            )
        for k, value in self.static_leaves:
            if leaves[k] is not value and _hashable(leaves[k]) != _hashable(value):
                raise AlpaError(
                    f"leaf {k} of the arguments (not an array, so bound at compile time) "
                    "differs from the one the step was compiled with; call the parallelized "
                    "function, which compiles again"
                )
        static = {k for k, _ in self.static_leaves}
        flat = [x for k, x in enumerate(leaves) if k not in static]
        for x, name, (shape, dtype) in zip(flat, self.leaf_names, self.avals, strict=True):
            got = abstract_leaf(x, name)
            if tuple(got.shape) != shape or str(got.dtype) != str(dtype):
                raise AlpaError(
                    f"compiled for {_aval_text(shape, str(dtype))} at {name}, called with "
                    f"{_aval_text(tuple(got.shape), str(got.dtype))}"
                )
        if self.micro_batch_rows:
            flat.append(np.arange(self.micro_batch_rows, dtype=np.int32))
        return flat

    def unflatten_outputs(self, outs: Sequence[Any]) -> Any:
        if self.outputs is not None and self.outputs.statics:
            return self.outputs.merge(list(outs))
        return jax.tree.unflatten(self.out_tree, list(outs))


def compiled_signature(
    arguments: StepArguments,
    in_tree: Any,
    out_tree: Any,
    outputs: OutputStatics | None = None,
) -> CompiledSignature:
    names = arguments.leaf_names()
    avals = []
    for x, name in zip(jax.tree.leaves(arguments.arrays), names, strict=True):
        a = abstract_leaf(x, name)
        avals.append((tuple(int(d) for d in a.shape), a.dtype))
    return CompiledSignature(
        len(arguments.args),
        arguments.static_argnums,
        in_tree,
        out_tree,
        tuple(names),
        tuple(avals),
        jax.tree.structure(arguments.dynamic),
        arguments.static_leaves(),
        outputs,
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


def micro_batch_args(
    args: tuple[Any, ...], batch_argnums: Sequence[int], b: int, names: Sequence[str] = ()
) -> tuple[Any, ...]:
    """``args`` with every leaf of the batch arguments shrunk to one micro-batch."""

    def shrink(name: str, x: Any) -> jax.ShapeDtypeStruct:
        shape = tuple(np.shape(x))
        if not shape or shape[0] % b:
            where = f"{name}: " if name else ""
            raise AlpaError(
                f"{where}a batch array of shape {list(shape)} cannot be split into "
                f"{b} micro-batches"
            )
        return jax.ShapeDtypeStruct((shape[0] // b, *shape[1:]), x.dtype)

    out = []
    for k, a in enumerate(args):
        if k not in batch_argnums:
            out.append(a)
            continue
        arg_name = names[k] if k < len(names) else f"arg{k}"
        out.append(
            jax.tree_util.tree_map_with_path(
                lambda path, x, n=arg_name: shrink(
                    leaf_path_name((jax.tree_util.SequenceKey(0), *path), [n]), x
                ),
                a,
            )
        )
    return tuple(out)


def check_micro_batches(value: object) -> int:
    """``num_micro_batches`` as an int >= 1 (None means 1)."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise AlpaError(f"num_micro_batches must be an int >= 1, got {value!r}")
    return int(value)


def trace_arguments(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    static_argnums: StaticArgnums,
    batch_argnums: Sequence[int],
    num_micro_batches: int,
) -> tuple[StepArguments, tuple[Any, ...]]:
    """The call's arguments, and the arguments to trace the step with (every
    dynamic leaf abstract, batch leaves at the micro-batch shape)."""
    arguments = step_arguments(fn, args, static_argnums)
    traced = list(arguments.abstracted())
    if num_micro_batches > 1:
        batch = [k for k in batch_argnums if k not in arguments.static_argnums]
        traced = list(micro_batch_args(tuple(traced), batch, num_micro_batches, arguments.names))
    return arguments, tuple(traced)
