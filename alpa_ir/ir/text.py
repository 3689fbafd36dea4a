"""Parse and print IR text, with every failure as a one-line, located ``AlpaError``.

xDSL's own errors are multi-line (the offending line with a caret under it) and
a verifier failure does not say which op failed or where. Tools and tests want
MLIR's ``file:line:col: message`` instead, so this module maps:

- syntax errors and unknown ops, dialects, types or attributes to
  :class:`~alpa_ir.errors.IRParseError` (``file:line:col: message``);
- verifier failures to :class:`~alpa_ir.errors.IRVerifyError` naming the op
  and its location.

Parsed ops without an explicit ``loc(...)`` get their position in the text as a
``FileLineColLoc``, as MLIR's parser does, so that a verifier failure after a
pass still points at the source line the op came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO

from xdsl.context import Context
from xdsl.dialects.builtin import (
    FileLineColLoc,
    IntAttr,
    LocationAttr,
    ModuleOp,
    StringAttr,
    UnknownLoc,
)
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError
from xdsl.utils.lexer import Span

from alpa_ir.errors import AlpaError, IRParseError, IRVerifyError
from alpa_ir.ir.context import make_context
from alpa_ir.plugins.registry import PluginRegistry

SPLIT_MARKER = "// -----"
_SPLIT_LINE = re.compile(r"^\s*//\s*-----\s*$")
_UNREGISTERED_OP = re.compile(r"^Operation (\S+) is not registered$")
_UNREGISTERED_ATTR = re.compile(r"^'(\S+)' is not registered$")
_COMMENT_ONLY = re.compile(r"//[^\n]*")
_UNREGISTERED_DIALECT = re.compile(r"^dialect (\S+) is not registered$")


class _LocatingParser(Parser):
    """An xDSL parser that gives each parsed op without ``loc(...)`` its text position."""

    _after_location: int = -1
    """Where the token after the last parsed ``loc(...)`` starts: an op that ends there
    was given its location explicitly (possibly ``loc(unknown)``), which is kept."""

    def parse_optional_location(self) -> LocationAttr | None:
        location = super().parse_optional_location()
        if location is not None:
            self._after_location = self._current_token.span.start
        return location

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        try:
            op = super().parse_operation()
        except ParseError:
            raise
        except Exception as err:  # a constructor or verifier rejected the op's parameters
            msg = f"invalid IR: {_one_line(str(err)) or type(err).__name__}"
            raise ParseError(start, msg) from err
        explicit = self._after_location == self._current_token.span.start
        if isinstance(op.location, UnknownLoc) and not explicit:
            line, col = self._line_and_column(start)
            op.location = FileLineColLoc(StringAttr(start.input.name), IntAttr(line), IntAttr(col))
        return op

    _line_cursor: tuple[int, int] = (0, 1)
    """(offset, line number at that offset) of the last located op: ops are
    located in increasing text order, so counting newlines from the last one
    keeps locating linear in the module size (``Span.get_location`` counts from
    the start of the text each time, which is quadratic)."""

    def _line_and_column(self, span: Span) -> tuple[int, int]:
        content, newline = span.input.content, span.input.newline
        line_start = span.input.get_start_of_line(span.start)
        offset, line = self._line_cursor
        if line_start < offset:
            offset, line = 0, 1
        line += content.count(newline, offset, line_start)
        self._line_cursor = (line_start, line)
        return line + span.line_offset, span.start - line_start + 1


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fix_message(err: ParseError) -> str:
    """One line; fills in a placeholder that xDSL forgets to format."""
    msg = _one_line(err.msg)
    if "{first_char}" in msg:
        content, start = err.span.input.content, err.span.start
        msg = msg.replace("{first_char}", repr(content[start : start + 1] or "%"))
    return msg


def _loaded_dialects(ctx: Context) -> str:
    return ", ".join(sorted(ctx.registered_dialect_names))


def _describe_parse_error(msg: str, ctx: Context) -> tuple[str, str | None]:
    """A clearer message for xDSL's 'is not registered' errors, and the name to point at."""
    if m := _UNREGISTERED_OP.match(msg):
        name = m.group(1)
        dialect = name.split(".", 1)[0]
        if "." in name and dialect not in ctx.registered_dialect_names:
            return (
                f"unknown dialect '{dialect}' in operation '{name}' "
                f"(loaded dialects: {_loaded_dialects(ctx)})"
            ), name
        return f"unknown operation '{name}'", name
    if m := _UNREGISTERED_ATTR.match(msg):
        name = m.group(1)
        dialect = name.split(".", 1)[0]
        if dialect not in ctx.registered_dialect_names:
            return (
                f"unknown dialect '{dialect}' in type or attribute '{name}' "
                f"(loaded dialects: {_loaded_dialects(ctx)})"
            ), name
        return f"unknown type or attribute '{name}'", name
    if m := _UNREGISTERED_DIALECT.match(msg):
        return f"unknown dialect '{m.group(1)}' (loaded dialects: {_loaded_dialects(ctx)})", None
    return msg, None


def _locate(span: Span[str], name: str | None) -> str:
    """``file:line:col`` of ``span``, moved back to the last ``name`` before it if given.

    xDSL reports an unregistered name at the token after it; the user wants the name.
    """
    if name is not None:
        content = span.input.content
        pos = content.rfind(name, 0, span.start + len(name))
        if pos >= 0:
            span = Span(pos, pos + len(name), span.input)
    return str(span.get_location())


def parse_module(
    text: str,
    *,
    registry: PluginRegistry | None = None,
    filename: str = "<string>",
    ctx: Context | None = None,
    first_line: int = 1,
    verify: bool = True,
) -> ModuleOp:
    """Parse IR text into a verified module.

    ``ctx`` defaults to a context built from ``registry``; ``first_line`` is the
    line of ``text`` in ``filename`` (for chunks of a split input file), so that
    every reported location is a location in the file.
    """
    ctx = ctx if ctx is not None else make_context(registry)
    if not _COMMENT_ONLY.sub("", text).strip():
        return ModuleOp([])  # an empty input is an empty module, as in mlir-opt
    source = "\n" * (first_line - 1) + text
    parser = _LocatingParser(ctx, source, filename)
    try:
        module = parser.parse_module()
    except ParseError as err:
        msg, name = _describe_parse_error(_fix_message(err), ctx)
        raise IRParseError(f"{_locate(err.span, name)}: {msg}") from None
    except AlpaError:
        raise
    except Exception as err:  # an attribute outside any op rejected its parameters
        where = _locate(parser._current_token.span, None)
        msg = _one_line(str(err)) or type(err).__name__
        raise IRParseError(f"{where}: invalid IR: {msg}") from err
    if verify:
        verify_module(module)
    return module


def location_text(op: Operation) -> str | None:
    loc = op.location
    if isinstance(loc, FileLineColLoc):
        return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
    return None


def _op_label(op: Operation) -> str:
    sym = op.attributes.get("sym_name") or op.properties.get("sym_name")
    if isinstance(sym, StringAttr):
        return f"'{op.name}' @{sym.data}"
    return f"'{op.name}'"


def _enclosing_location(op: Operation) -> str | None:
    current: Operation | None = op
    while current is not None:
        if (where := location_text(current)) is not None:
            return where
        current = current.parent_op()
    return None


def _first_failing_op(module: ModuleOp) -> tuple[Operation, Exception] | None:
    """The innermost op that does not verify: the first failure in post-order."""
    for op in module.walk(region_first=True):
        try:
            op.verify()
        except Exception as err:
            return op, err
    return None


def verify_module(module: ModuleOp) -> None:
    """Verify ``module`` (every op's verifier, then the sharding annotations
    against their meshes and tensors, :mod:`alpa_ir.ir.sharding_checks`); raise
    :class:`IRVerifyError` naming the failing op and where it is."""
    from alpa_ir.ir.sharding_checks import ShardingCheckError, check_shardings

    try:
        module.verify()
    except Exception as err:
        failing = _first_failing_op(module)
        op, cause = failing if failing is not None else (module, err)
        raise _verify_error(op, cause) from err
    try:
        check_shardings(module)
    except ShardingCheckError as err:
        raise _verify_error(err.op, err) from None


def _verify_error(op: Operation, cause: Exception) -> IRVerifyError:
    where = _enclosing_location(op)
    prefix = f"{where}: " if where else ""
    detail = _one_line(str(cause)) or type(cause).__name__
    return IRVerifyError(f"{prefix}operation {_op_label(op)} does not verify: {detail}")


def print_module(module: Operation, *, debuginfo: bool = False) -> str:
    """The text of ``module`` (custom syntax), ending in a newline; with ``debuginfo``
    every op carries its ``loc(...)``."""
    stream = StringIO()
    Printer(stream=stream, print_debuginfo=debuginfo).print_op(module)
    stream.write("\n")
    return stream.getvalue()


@dataclass(frozen=True)
class InputChunk:
    """A piece of a split input file and the line (1-based) it starts on."""

    text: str
    first_line: int


def split_input(text: str) -> list[InputChunk]:
    """Split ``text`` at ``// -----`` lines, like ``mlir-opt --split-input-file``."""
    return list(_split_lines(text.splitlines(keepends=True)))


def _split_lines(lines: list[str]) -> Iterator[InputChunk]:
    start = 0
    for index, line in enumerate(lines):
        if _SPLIT_LINE.match(line):
            yield InputChunk("".join(lines[start:index]), start + 1)
            start = index + 1
    yield InputChunk("".join(lines[start:]), start + 1)
