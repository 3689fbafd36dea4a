"""Pytree structures as text, so that a module printed and parsed again still
returns results as the user's pytrees.

A treedef is written as a Python literal: ``'*'`` for a leaf, and
``('module:QualName', aux, (children...))`` for a node, where ``aux`` is the
node's auxiliary data (e.g. a dict's keys) as a literal. Built-in containers
use short names (``dict``, ``list``, ``tuple``, ``None``).
"""

from __future__ import annotations

import ast
import importlib
from typing import Any

import jax
from jax import tree_util

from alpa_ir.errors import AlpaError

_BUILTIN_NAMES = {dict: "dict", list: "list", tuple: "tuple", type(None): "None"}
_BUILTIN_TYPES = {name: cls for cls, name in _BUILTIN_NAMES.items()}


def _type_name(cls: type) -> str:
    return _BUILTIN_NAMES.get(cls) or f"{cls.__module__}:{cls.__qualname__}"


def _resolve_type(name: str) -> type:
    if name in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[name]
    module_name, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise AlpaError(f"cannot rebuild pytree node type '{name}': not importable") from None
    return obj


def _to_literal(treedef: Any) -> Any:
    data = treedef.node_data()
    if data is None:
        return "*"
    cls, aux = data
    aux_literal = list(aux) if isinstance(aux, list) else aux
    try:
        ast.literal_eval(repr(aux_literal))
    except (ValueError, SyntaxError):
        raise AlpaError(
            f"pytree node {_type_name(cls)} has auxiliary data that cannot be written as text: {aux!r}"
        ) from None
    return (_type_name(cls), aux_literal, tuple(_to_literal(c) for c in treedef.children()))


def encode_treedef(treedef: Any) -> str:
    """The text of a ``PyTreeDef``."""
    return repr(_to_literal(treedef))


def _from_literal(node: Any) -> Any:
    if node == "*":
        return tree_util.tree_structure(0)
    name, aux, children = node
    cls = _resolve_type(name)
    if cls is dict:
        aux = list(aux)
    elif isinstance(aux, list):
        aux = list(aux)
    return tree_util.PyTreeDef.from_node_data_and_children(
        tree_util.default_registry, (cls, aux), [_from_literal(c) for c in children]
    )


def decode_treedef(text: str) -> Any:
    """The ``PyTreeDef`` written by :func:`encode_treedef`."""
    try:
        literal = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise AlpaError(f"malformed pytree text: {text[:80]}") from None
    return _from_literal(literal)


def flat_names(example_args: tuple[Any, ...], arg_names: list[str]) -> list[str]:
    """A readable name per leaf of ``example_args`` from its key path, e.g.
    ``state.params.Dense_0.kernel``."""
    names = []
    for path, _ in jax.tree_util.tree_flatten_with_path(example_args)[0]:
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
            else:
                parts.append(str(key))
        names.append(".".join(parts))
    return names
