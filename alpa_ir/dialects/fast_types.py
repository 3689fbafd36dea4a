"""Fast parsing of the builtin types that fill every line of a large module.

xDSL's generic type parser costs about 0.2 ms per ``tensor<...>``; a GPT-3
train step has tens of thousands of them, almost all repeated. These helpers
cut the type's text out of the input, parse each distinct text once (a memo
of a pure function), and move the parser past it. Anything unusual falls back
to xDSL's parser, which also produces the error messages.
"""

from __future__ import annotations

from functools import cache, lru_cache

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, FunctionType
from xdsl.ir import Attribute
from xdsl.parser import Parser

_STOP = set(" \t\r\n,{}()=:")


def _scan_type(text: str, pos: int) -> int:
    """End of the type starting at ``pos`` (angle brackets balanced), or -1."""
    depth = 0
    n = len(text)
    start = pos
    while pos < n:
        c = text[pos]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
            if depth < 0:
                return -1
        elif depth == 0 and c in _STOP:
            break
        elif c in '"()[]':
            return -1
        pos += 1
    return pos if depth == 0 and pos > start else -1


def _skip_spaces(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _scan_type_list(text: str, pos: int) -> int:
    """End of ``(t1, t2, ...)`` starting at ``pos``, or -1."""
    if pos >= len(text) or text[pos] != "(":
        return -1
    pos = _skip_spaces(text, pos + 1)
    if pos < len(text) and text[pos] == ")":
        return pos + 1
    while True:
        pos = _scan_type(text, pos)
        if pos < 0:
            return -1
        pos = _skip_spaces(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_spaces(text, pos + 1)
            continue
        if pos < len(text) and text[pos] == ")":
            return pos + 1
        return -1


def _scan_function_type(text: str, pos: int) -> int:
    pos = _scan_type_list(text, pos)
    if pos < 0:
        return -1
    pos = _skip_spaces(text, pos)
    if not text.startswith("->", pos):
        return -1
    pos = _skip_spaces(text, pos + 2)
    if pos < len(text) and text[pos] == "(":
        return _scan_type_list(text, pos)
    return _scan_type(text, pos)


@cache
def _builtin_context() -> Context:
    ctx = Context()
    ctx.load_dialect(Builtin)
    return ctx


@lru_cache(maxsize=8192)
def _function_type_of(text: str) -> FunctionType | None:
    try:
        return Parser(_builtin_context(), text).parse_function_type()
    except Exception:
        return None


@lru_cache(maxsize=8192)
def _type_of(text: str) -> Attribute | None:
    try:
        parser = Parser(_builtin_context(), text)
        ty = parser.parse_type()
        return ty if parser.pos == len(text) else None
    except Exception:
        return None


def _input(parser: Parser) -> tuple[str, int]:
    return parser.lexer.input.content, parser.pos  # type: ignore[return-value]


def parse_function_type(parser: Parser) -> FunctionType:
    """``(t1, t2) -> t3`` at the parser's position."""
    text, start = _input(parser)
    end = _scan_function_type(text, start)
    if end > 0 and (ft := _function_type_of(text[start:end])) is not None:
        parser._resume_from(end)
        return ft
    return parser.parse_function_type()


def parse_type(parser: Parser) -> Attribute:
    """One type at the parser's position."""
    text, start = _input(parser)
    end = _scan_type(text, start)
    if end > 0 and (ty := _type_of(text[start:end])) is not None:
        parser._resume_from(end)
        return ty
    return parser.parse_type()
