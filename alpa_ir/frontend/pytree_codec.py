"""Pytree structures as text, readable and safe to read back.

A step's inputs and outputs are any registered pytree (dicts, flax
``TrainState``, equinox modules, dataclasses, NamedTuples). The executable
keeps the real ``PyTreeDef`` in memory; the module's text records a
description of it, so that a module printed and parsed again can still
return results as the user's pytrees.

The text is a Python literal: ``'*'`` for a leaf and
``('module:QualName', aux, (children...))`` for a node whose auxiliary data
(e.g. a dict's keys) is itself a literal. A node whose auxiliary data is not
(a ``TrainState`` holds its ``apply_fn`` and optimizer, an equinox module its
sentinels) is written ``('module:QualName', None, (children...), 'opaque:
<short description>')``: readable, but not rebuildable from the text alone.

Reading the text back never imports a module and never runs code named in
it: a node type is resolved only among the types of trees the caller passes
(``known``, e.g. the arguments a module is called with), the types JAX has
registered as pytree nodes, and classes defined in modules already imported;
an opaque node takes its auxiliary data from a known node of the same type.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import jax
from jax import tree_util

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.output_paths import argument_paths, output_paths

_BUILTIN_NAMES = {dict: "dict", list: "list", tuple: "tuple", type(None): "None"}
_BUILTIN_TYPES = {name: cls for cls, name in _BUILTIN_NAMES.items()}
_OPAQUE_PREFIX = "opaque: "
_DESCRIPTION_CHARS = 60


def _type_name(cls: type) -> str:
    return _BUILTIN_NAMES.get(cls) or f"{cls.__module__}:{cls.__qualname__}"


def _literal(aux: Any) -> Any:
    """``aux`` as a Python literal that reads back equal, or raise ValueError."""
    value = list(aux) if isinstance(aux, list) else aux
    text = repr(value)
    if ast.literal_eval(text) != value:
        raise ValueError(text)
    return value


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(aux: Any) -> str:
    """A short description of ``aux``: its repr, cut to a few words, and when
    cut, a digest of the whole repr (addresses left out), so that two nodes
    whose data differ only past the cut (two layers of one class with other
    static fields) are told apart."""
    text = " ".join(repr(aux).split())
    if len(text) > _DESCRIPTION_CHARS:
        digest = hashlib.sha256(_ADDRESS.sub("", text).encode()).hexdigest()[:12]
        text = f"{text[: _DESCRIPTION_CHARS - 3]}... #{digest}"
    return _OPAQUE_PREFIX + text


_STATIC = "@"


def _to_literal(
    treedef: Any,
    describe: bool,
    statics: dict[int, Any] | None = None,
    count: list[int] | None = None,
) -> Any:
    """The literal of ``treedef``; leaves numbered in ``statics`` (flat index ->
    value) are written ``('@', description)``: values that are not arrays."""
    count = count if count is not None else [0]
    data = treedef.node_data()
    if data is None:
        k = count[0]
        count[0] += 1
        if statics and k in statics:
            return (_STATIC, _describe(statics[k]).removeprefix(_OPAQUE_PREFIX) if describe else "")
        return "*"
    cls, aux = data
    children = tuple(_to_literal(c, describe, statics, count) for c in treedef.children())
    try:
        return (_type_name(cls), _literal(aux), children)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return (_type_name(cls), None, children, _describe(aux) if describe else _OPAQUE_PREFIX)


def encode_treedef(treedef: Any, statics: dict[int, Any] | None = None) -> str:
    """The text of a ``PyTreeDef`` (any registered node types); the leaves
    ``statics`` numbers (flat index -> value) are marked as values that are
    not arrays."""
    return repr(_to_literal(treedef, True, statics))


def structure_key(treedef: Any, statics: dict[int, Any] | None = None) -> str:
    """The text of a ``PyTreeDef`` without the descriptions of opaque
    auxiliary data and static leaves (which may hold addresses): equal for
    equal structures."""
    return repr(_to_literal(treedef, False, statics))


def same_structure(text: str, treedef: Any, statics: dict[int, Any] | None = None) -> bool:
    """Whether ``treedef`` (with ``statics``) has the structure ``text`` describes."""
    try:
        literal = ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError):
        return False
    return repr(_without_descriptions(literal)) == structure_key(treedef, statics)


def static_leaves(text: str) -> dict[int, str]:
    """Flat index -> description of the leaves ``text`` marks as not arrays."""
    out: dict[int, str] = {}
    count = [0]

    def walk(node: Any) -> None:
        if node == "*":
            count[0] += 1
        elif isinstance(node, tuple) and len(node) == 2 and node[0] == _STATIC:
            out[count[0]] = node[1]
            count[0] += 1
        elif isinstance(node, tuple) and len(node) in (3, 4):
            for child in node[2]:
                walk(child)

    try:
        walk(ast.literal_eval(text))
    except (ValueError, SyntaxError, RecursionError):
        return {}
    return out


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, tuple) and len(node) == 2 and node[0] == _STATIC:
        return (_STATIC, "")
    if not isinstance(node, tuple) or len(node) not in (3, 4):
        return node
    children = tuple(_without_descriptions(c) for c in node[2])
    if len(node) == 4:
        return (node[0], None, children, _OPAQUE_PREFIX)
    return (node[0], node[1], children)


def _nodes(treedef: Any) -> Iterator[tuple[type, Any]]:
    data = treedef.node_data()
    if data is None:
        return
    yield data
    for child in treedef.children():
        yield from _nodes(child)


class _Resolver:
    """Finds node types (and opaque auxiliary data) without importing anything."""

    def __init__(self, known: Iterable[Any]) -> None:
        self.known: dict[str, list[tuple[type, Any]]] = {}
        for treedef in known:
            for cls, aux in _nodes(treedef):
                self.known.setdefault(_type_name(cls), []).append((cls, aux))

    def type_of(self, name: str) -> type:
        if name in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[name]
        if name in self.known:
            return self.known[name][0][0]
        for cls in _registered_types():
            if _type_name(cls) == name:
                return cls
        found = _loaded_class(name)
        if found is None:
            raise AlpaError(
                f"cannot rebuild pytree node type '{name}': it is not loaded in this process "
                "(reading a module never imports one); import it first"
            )
        return found

    def opaque_aux(self, name: str, description: str) -> Any:
        """The auxiliary data of a known node of type ``name`` described as
        ``description`` (digest included); without such a node, that of the
        only known node of the type. Never one of several that differ."""
        candidates = self.known.get(name, [])
        matching = [aux for _, aux in candidates if _describe(aux) == description]
        if matching:
            return matching[0]  # equal reprs: any of them
        distinct = {id(aux): aux for _, aux in candidates}
        if len(distinct) == 1:
            return next(iter(distinct.values()))
        raise AlpaError(
            f"cannot rebuild pytree node '{name}': its auxiliary data ({description}) is not "
            "written in the text; call the module with arguments holding such a node"
        )


def _registered_types() -> Iterable[type]:
    """Types registered as pytree nodes with ``jax.tree_util`` (already loaded)."""
    from jax._src import tree_util as internal

    registry = getattr(internal, "_registry", {})
    return list(registry) if isinstance(registry, dict) else []


def _loaded_class(name: str) -> type | None:
    """The class ``module:QualName`` if its module is already imported; looked
    up in the module's namespace (no ``getattr``, which a lazy module turns
    into an import)."""
    module_name, _, qualname = name.partition(":")
    module = sys.modules.get(module_name)
    if module is None or not qualname:
        return None
    obj: Any = module
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", None)
        if not isinstance(namespace, dict) and not hasattr(namespace, "get"):
            return None
        obj = namespace.get(part)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None


def _from_literal(node: Any, resolver: _Resolver) -> Any:
    if node == "*" or (isinstance(node, tuple) and len(node) == 2 and node[0] == _STATIC):
        return tree_util.tree_structure(0)
    if not isinstance(node, tuple) or len(node) not in (3, 4):
        raise AlpaError(f"malformed pytree node in text: {str(node)[:80]}")
    name, aux, children = node[0], node[1], node[2]
    cls = resolver.type_of(name)
    if len(node) == 4:
        aux = resolver.opaque_aux(name, node[3])
    elif isinstance(aux, list):
        aux = list(aux)
    built = [_from_literal(c, resolver) for c in children]
    try:
        return tree_util.PyTreeDef.from_node_data_and_children(
            tree_util.default_registry, (cls, aux), built
        )
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: not a pytree node type
        raise AlpaError(f"cannot rebuild pytree node '{name}': {exc}") from None


def decode_treedef(text: str, known: Iterable[Any] = ()) -> Any:
    """The ``PyTreeDef`` written by :func:`encode_treedef`. Node types and
    opaque auxiliary data come from the ``known`` treedefs, JAX's registry and
    already imported modules (see the module doc)."""
    try:
        literal = ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError):
        raise AlpaError(f"malformed pytree text: {text[:80]}") from None
    return _from_literal(literal, _Resolver(known))


def flat_names(example_args: tuple[Any, ...], arg_names: list[str]) -> list[str]:
    """A readable name per leaf of ``example_args`` from its key path, e.g.
    ``state.params.Dense_0.kernel``."""
    return [
        leaf_path_name(path, arg_names)
        for path, _ in jax.tree_util.tree_flatten_with_path(example_args)[0]
    ]


def leaf_path_name(path: Iterable[Any], arg_names: list[str]) -> str:
    """``state.params.Dense_0.kernel`` for a key path whose first key is the argument index."""
    parts: list[str] = []
    for k, key in enumerate(path):
        if k == 0 and isinstance(key, tree_util.SequenceKey) and key.idx < len(arg_names):
            parts.append(arg_names[key.idx])
        elif isinstance(key, tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, tree_util.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return ".".join(parts)


def is_array_leaf(x: Any) -> bool:
    """Whether a pytree leaf is (or describes) an array a step can take: an
    array, a ``jax.ShapeDtypeStruct``, a key array, or a Python ``int`` (a 0-d
    array: a step counter such as flax's ``TrainState.step``, which changes
    every step). Python ``bool`` and ``float`` leaves are settings that code
    branches on (equinox's ``Dropout.p`` and ``inference``); they, functions,
    strings and other objects are not arrays (as under ``equinox.filter_jit``)."""
    import numpy as np

    if isinstance(x, bool | float):
        return False
    if isinstance(x, jax.Array | np.ndarray | np.generic | jax.ShapeDtypeStruct):
        return True
    if isinstance(x, int | complex):
        return True
    return hasattr(x, "shape") and hasattr(x, "dtype")


class TreeTexts:
    """The input and output structures a module records as text, resolved
    against the arguments it is called with: the inputs must have the
    recorded structure; the output structure is rebuilt with the types (and
    opaque auxiliary data) of the arguments' nodes, and each output leaf that
    is not an array is the argument leaf at the same path (below the first
    key) or with the same description."""

    def __init__(self, in_text: str | None, out_text: str | None) -> None:
        self.in_text, self.out_text = in_text, out_text
        self._out: dict[str, Any] = {}

    def flatten(self, args: Any) -> tuple[list[Any], Any, dict[int, Any]]:
        """The array leaves of ``args``, their treedef and the other leaves (index -> value)."""
        leaves, treedef = jax.tree.flatten(args)
        statics = {k: x for k, x in enumerate(leaves) if not is_array_leaf(x)}
        if self.in_text is not None and not same_structure(self.in_text, treedef, statics):
            raise AlpaError(
                f"arguments have structure {_short(encode_treedef(treedef, statics))}, the "
                f"module was imported with {_short(self.in_text)}"
            )
        return [x for k, x in enumerate(leaves) if k not in statics], treedef, statics

    def outputs(self, args: Any, outs: list[Any]) -> Any:
        """The outputs as the module's pytree (a flat list when it records none)."""
        if self.out_text is None:
            return list(outs)
        treedef = jax.tree.structure(args)
        key = structure_key(treedef)
        if key not in self._out:
            self._out[key] = decode_treedef(self.out_text, known=[treedef])
        out_tree = self._out[key]
        wanted = static_leaves(self.out_text)
        if not wanted:
            return jax.tree.unflatten(out_tree, list(outs))
        values = _match_static(args, out_tree, wanted)
        it = iter(outs)
        merged = [values[k] if k in values else next(it) for k in range(out_tree.num_leaves)]
        return jax.tree.unflatten(out_tree, merged)


def _match_static(args: Any, out_tree: Any, wanted: dict[int, str]) -> dict[int, Any]:
    """Values for the output leaves that are not arrays, taken from the arguments
    (by path: :mod:`alpa_ir.frontend.output_paths`)."""
    by_path: dict[tuple[Any, ...], Any] = {}
    by_description: dict[str, list[Any]] = {}
    for path, x in argument_paths(args):
        if not is_array_leaf(x):
            by_path.setdefault(path, x)
            by_description.setdefault(_describe(x).removeprefix(_OPAQUE_PREFIX), []).append(x)
    template = jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
    out: dict[int, Any] = {}
    for k, (paths, _) in enumerate(output_paths(template)):
        if k not in wanted:
            continue
        found = [p for p in paths if p in by_path]
        if found:
            out[k] = by_path[found[0]]
        elif len(by_description.get(wanted[k], [])) == 1:
            out[k] = by_description[wanted[k]][0]
        else:
            raise AlpaError(
                f"cannot rebuild output leaf {jax.tree_util.keystr(paths[-1])} ({wanted[k]}): "
                "it is not an array and no argument leaf matches it"
            )
    return out


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
