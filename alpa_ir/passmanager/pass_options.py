"""Typed pass options: the fields of a pass dataclass, read from and written to text.

A pass is a frozen dataclass subclassing ``xdsl.passes.ModulePass``; each init
field is an option, spelled in kebab case in pipelines (``time_limit`` is
``time-limit``). Supported field types: ``int``, ``float``, ``bool``, ``str``,
``Literal[...]`` choices, ``Enum`` subclasses (by member name or value),
``tuple[T, ...]`` / ``tuple[T1, T2]`` / ``list[T]`` of those, ``X | None`` and
unions of the above. A field's ``metadata["help"]`` is its one-line description.

Values arrive as :class:`RawValue` (what the pipeline string said) and are
converted by the field's type; a mismatch is a :class:`PipelineError` naming the
pass, the option, the expected type and the value as written.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from xdsl.passes import ModulePass

from alpa_ir.errors import AlpaError, PipelineError


@dataclass(frozen=True)
class ValueItem:
    """One element of an option value: its text, and whether it was a quoted string."""

    text: str
    quoted: bool = False


@dataclass(frozen=True)
class RawValue:
    """An option value as written: its elements, or None when no ``=value`` was given."""

    items: tuple[ValueItem, ...] | None
    braced: bool = False
    text: str = ""


@dataclass(frozen=True)
class OptionInfo:
    """One option of a pass, for building passes and for ``--list-passes``."""

    name: str
    field: str
    type: Any
    required: bool
    default: Any
    help: str


BARE_STOP = frozenset(' \t\r\n,{}()="')
"""Characters that end a bare (unquoted) option value."""


class _Mismatch(Exception):
    """The raw value does not fit the type (turned into a PipelineError by the caller)."""


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _union_order(tp: Any) -> int:
    """Try None first and str last, so that ``none`` and ``3`` are not read as strings."""
    ranks = {type(None): 0, bool: 1, int: 2, float: 3, str: 9}
    return ranks.get(tp, 5)


def type_text(tp: Any) -> str:
    """A short, readable name of an option type (``float``, ``tuple[int, ...]``, ...)."""
    if tp is type(None):
        return "none"
    if _is_union(tp):
        return " | ".join(type_text(m) for m in get_args(tp))
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.name) for m in tp)
    if origin in (tuple, list):
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            inner = f"{type_text(args[0])}, ..."
        else:
            inner = ", ".join(type_text(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    return getattr(tp, "__name__", str(tp))


def _convert_item(item: ValueItem, tp: Any) -> Any:
    text = item.text
    if _is_union(tp):
        for member in sorted(get_args(tp), key=_union_order):
            try:
                return _convert_item(item, member)
            except _Mismatch:
                continue
        raise _Mismatch
    if tp is type(None):
        if not item.quoted and text == "none":
            return None
        raise _Mismatch
    if tp is bool:
        lowered = text.lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise _Mismatch
    if tp is int:
        for base in (10, 0):
            try:
                return int(text, base)
            except ValueError:
                continue
        raise _Mismatch
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise _Mismatch from None
    if tp is str:
        return text
    if get_origin(tp) is Literal:
        for choice in get_args(tp):
            try:
                if _convert_item(item, type(choice)) == choice:
                    return choice
            except _Mismatch:
                continue
        raise _Mismatch
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if text in (member.name, str(member.value)) or text.lower() == member.name.lower():
                return member
        raise _Mismatch
    raise TypeError(f"unsupported option type {type_text(tp)}")


def _convert(raw: RawValue, tp: Any) -> Any:
    """Convert a raw option value to ``tp``; raise ``_Mismatch`` when it does not fit."""
    if _is_union(tp):
        for member in sorted(get_args(tp), key=_union_order):
            try:
                return _convert(raw, member)
            except _Mismatch:
                continue
        raise _Mismatch
    origin = get_origin(tp)
    if raw.items is None:  # `key` alone: a flag, a none, or an empty list
        if tp is bool:
            return True
        if tp is type(None):
            return None
        if origin in (tuple, list):
            return origin()
        raise _Mismatch
    if origin in (tuple, list):
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            values = [_convert_item(item, args[0]) for item in raw.items]
        elif not args:
            values = [item.text for item in raw.items]
        elif len(args) == len(raw.items):
            values = [_convert_item(item, a) for item, a in zip(raw.items, args, strict=True)]
        else:
            raise _Mismatch
        return origin(values)
    if raw.braced or len(raw.items) != 1:
        raise _Mismatch
    return _convert_item(raw.items[0], tp)


def _field_types(cls: type, pass_name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:
        raise PipelineError(
            f"the option types of pass '{pass_name}' cannot be resolved: {exc}"
        ) from exc


def pass_options(cls: type) -> tuple[OptionInfo, ...]:
    """The options of a pass class, in field order."""
    name = getattr(cls, "name", cls.__name__)
    if not dataclasses.is_dataclass(cls):
        raise PipelineError(f"pass '{name}' is not a dataclass; its options cannot be read")
    hints = _field_types(cls, name)
    docs = option_docs(cls)
    infos: list[OptionInfo] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            required, default = False, f.default
        elif f.default_factory is not dataclasses.MISSING:
            required, default = False, f.default_factory()
        else:
            required, default = True, None
        infos.append(
            OptionInfo(
                name=f.name.replace("_", "-"),
                field=f.name,
                type=hints.get(f.name, Any),
                required=required,
                default=default,
                help=str(f.metadata.get("help", "")) or docs.get(f.name, ""),
            )
        )
    return tuple(infos)


def option_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under the field
    in the class body (the one way options are documented), for ``cls`` and its
    bases; empty where the source is not available."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        if tree.body and isinstance(tree.body[0], ast.ClassDef):
            docs.update(field_docs(tree.body[0]))
    return docs


def field_docs(class_def: ast.ClassDef) -> dict[str, str]:
    """Field name -> the docstring written under the annotated field, on one line."""
    docs: dict[str, str] = {}
    for stmt, after in itertools.pairwise(class_def.body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _option_list(infos: tuple[OptionInfo, ...]) -> str:
    if not infos:
        return "it has no options"
    return "its options: " + ", ".join(i.name for i in infos)


def build_pass(cls: type[ModulePass], name: str, options: Mapping[str, RawValue]) -> ModulePass:
    """An instance of ``cls`` with ``options`` converted to its field types."""
    infos = pass_options(cls)
    by_name = {i.name: i for i in infos}
    kwargs: dict[str, Any] = {}
    for key, raw in options.items():
        info = by_name.get(key.replace("_", "-"))
        if info is None:
            raise PipelineError(f"unknown option '{key}' of pass '{name}'; {_option_list(infos)}")
        try:
            kwargs[info.field] = _convert(raw, info.type)
        except _Mismatch:
            got = "no value" if raw.items is None else repr(raw.text)
            raise PipelineError(
                f"option '{info.name}' of pass '{name}' expects {type_text(info.type)}, got {got}"
            ) from None
        except TypeError as exc:
            raise PipelineError(f"option '{info.name}' of pass '{name}': {exc}") from None
    missing = [i for i in infos if i.required and i.field not in kwargs]
    if missing:
        needed = ", ".join(f"'{i.name}' ({type_text(i.type)})" for i in missing)
        raise PipelineError(f"pass '{name}' requires option {needed}")
    try:
        return cls(**kwargs)
    except AlpaError:
        raise
    except Exception as exc:  # the pass's own validation of its options
        raise PipelineError(f"invalid options for pass '{name}': {exc}") from exc


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped.replace("\t", "\\t") + '"'


def format_value(value: Any, tp: Any = None) -> str:
    """An option value in pipeline syntax that parses back to ``value`` for type ``tp``.

    Strings are written bare (``solver=cbc``) where that reads back the same for
    ``tp``, quoted otherwise (always when ``tp`` is not given).
    """
    if tp is not None and (bare := _bare_form(value)) is not None:
        try:
            if _convert(bare, tp) == value:
                return bare.text
        except (_Mismatch, TypeError):
            pass
    return _format_quoted(value)


def _bare_form(value: Any) -> RawValue | None:
    """``value`` written with bare strings, or None if a string needs quotes."""
    elements = list(value) if isinstance(value, tuple | list) else [value]
    if not elements or not any(isinstance(v, str) for v in elements):
        return None
    items: list[ValueItem] = []
    for element in elements:
        if isinstance(element, str):
            if not element or any(c in BARE_STOP or c.isspace() for c in element):
                return None
            items.append(ValueItem(element))
        elif isinstance(element, tuple | list):
            return None
        else:
            items.append(ValueItem(_format_quoted(element)))
    return RawValue(tuple(items), text=",".join(i.text for i in items))


def _format_quoted(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, tuple | list):
        if any(isinstance(v, tuple | list) for v in value):
            raise TypeError("nested lists cannot be written as pass options")
        return ",".join(_format_quoted(v) for v in value) if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as a pass option")


def format_pass_options(pass_: ModulePass) -> str:
    """``key=value`` for every option of ``pass_``, space-separated, in field order."""
    return " ".join(
        f"{info.name}={format_value(getattr(pass_, info.field), info.type)}"
        for info in pass_options(type(pass_))
    )
