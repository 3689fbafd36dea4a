"""Pass pipeline strings: parse MLIR's and xDSL's syntax, build passes, format back.

Two spellings are accepted, as ``mlir-opt --pass-pipeline`` and ``xdsl-opt -p``
write them::

    builtin.module(merge-trivial-ops,auto-sharding{solver=mip time-limit=60})
    merge-trivial-ops,auto-sharding{solver=mip time-limit=60}

Options are space-separated ``key=value`` pairs in braces; a value is a bare
word, a quoted string (``"a b"``), or a list ``1,2,3`` (also ``{1,2,3}``, and
``{}`` for the empty list). A key without ``=`` means ``true`` for a boolean
option and ``none`` for an optional one. Whitespace between passes is ignored.
Nested anchors such as ``func.func(...)`` are rejected: every alpa_ir pass
runs on the whole module.

Parsing is two steps: :func:`parse_pipeline_spec` gives the pass names and raw
option values (no registry needed), :func:`build_passes` turns them into pass
instances with typed options (:mod:`alpa_ir.passmanager.pass_options`).
:func:`format_pipeline` writes the canonical MLIR form with every option, which
parses back to equal passes (used by reproducers and ``--print-pipeline``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xdsl.passes import ModulePass

from alpa_ir.errors import PipelineError
from alpa_ir.passmanager.pass_options import (
    BARE_STOP,
    RawValue,
    ValueItem,
    build_pass,
    format_pass_options,
)
from alpa_ir.plugins.registry import PluginRegistry

ROOT_ANCHOR = "builtin.module"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


@dataclass(frozen=True)
class PassSpec:
    """One pass of a pipeline string: its name and raw options, before typing."""

    name: str
    options: Mapping[str, RawValue]
    column: int = 0
    """1-based column of the name in the pipeline string (0 when not parsed)."""


class _Reader:
    """A cursor over the pipeline string that raises errors with the column."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, expected: str, pos: int | None = None) -> PipelineError:
        pos = self.pos if pos is None else pos
        found = (
            f"found '{self.text[pos]}'" if pos < len(self.text) else "found the end of the pipeline"
        )
        return PipelineError(
            f"malformed pipeline at column {pos + 1}: expected {expected}, {found}"
        )

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_space(self) -> bool:
        start = self.pos
        while self.peek().isspace():
            self.pos += 1
        return self.pos > start

    def accept(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def expect(self, char: str) -> None:
        if not self.accept(char):
            raise self.error(f"'{char}'")

    def name(self, what: str) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _NAME_CHARS:
            self.pos += 1
        if self.pos == start:
            raise self.error(what)
        return self.text[start : self.pos]

    def quoted(self) -> str:
        start = self.pos
        self.expect('"')
        out: list[str] = []
        escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}
        while not self.at_end():
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                return "".join(out)
            if char == "\\":
                code = self.peek()
                if code not in escapes:
                    raise self.error('an escape \\n, \\t, \\" or \\\\ after \\')
                out.append(escapes[code])
                self.pos += 1
            else:
                out.append(char)
        raise self.error(f"'\"' closing the string opened at column {start + 1}")

    def bare(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in BARE_STOP:
            self.pos += 1
        if self.pos == start:
            raise self.error("an option value")
        return self.text[start : self.pos]


def parse_pipeline_spec(text: str) -> list[PassSpec]:
    """Parse a pipeline string (MLIR or flat form) into pass names and raw options."""
    reader = _Reader(text)
    reader.skip_space()
    specs: list[PassSpec] = []
    if reader.at_end():
        return specs
    start = reader.pos
    first = reader.name("a pass name")
    reader.skip_space()
    if first == ROOT_ANCHOR and reader.peek() == "(":
        reader.pos += 1
        reader.skip_space()
        if not reader.accept(")"):
            specs = _parse_pass_list(reader, nested=True)
            reader.expect(")")
    else:
        reader.pos = start
        specs = _parse_pass_list(reader, nested=False)
    reader.skip_space()
    if not reader.at_end():
        raise reader.error("',' between passes" if specs else "a pass name")
    return specs


def _parse_pass_list(reader: _Reader, *, nested: bool) -> list[PassSpec]:
    specs = [_parse_pass(reader, nested=nested)]
    while True:
        reader.skip_space()
        if not reader.accept(","):
            return specs
        reader.skip_space()
        specs.append(_parse_pass(reader, nested=nested))


def _parse_pass(reader: _Reader, *, nested: bool) -> PassSpec:
    column = reader.pos + 1
    name = reader.name("a pass name")
    reader.skip_space()
    if reader.peek() == "(":
        where = "inside builtin.module(...)" if nested else "here"
        raise PipelineError(
            f"malformed pipeline at column {column}: nested pipeline '{name}(...)' is not "
            f"supported {where}; alpa_ir passes run on the whole module, write "
            f"'{ROOT_ANCHOR}(pass1,pass2{{option=value}})' or 'pass1,pass2'"
        )
    options: dict[str, RawValue] = {}
    if reader.accept("{"):
        _parse_options(reader, name, options)
    return PassSpec(name, options, column)


def _parse_options(reader: _Reader, pass_name: str, options: dict[str, RawValue]) -> None:
    reader.skip_space()
    while not reader.accept("}"):
        key_pos = reader.pos
        key = reader.name("an option name or '}'")
        if key in options:
            raise PipelineError(
                f"malformed pipeline at column {key_pos + 1}: option '{key}' of pass "
                f"'{pass_name}' is given twice"
            )
        has_value = reader.accept("=")
        options[key] = _parse_value(reader) if has_value else RawValue(None)
        if reader.skip_space():
            continue
        if reader.peek() != "}":
            if has_value:
                raise reader.error(f"a space or '}}' after the value of option '{key}'")
            raise reader.error(f"'=', a space or '}}' after option '{key}'")


def _parse_value(reader: _Reader) -> RawValue:
    start = reader.pos
    if reader.accept("{"):
        items: list[ValueItem] = []
        reader.skip_space()
        if not reader.accept("}"):
            items.append(_parse_item(reader))
            reader.skip_space()
            while reader.accept(","):
                reader.skip_space()
                items.append(_parse_item(reader))
                reader.skip_space()
            reader.expect("}")
        return RawValue(tuple(items), braced=True, text=reader.text[start : reader.pos])
    items = [_parse_item(reader)]
    while reader.accept(","):
        items.append(_parse_item(reader))
    return RawValue(tuple(items), text=reader.text[start : reader.pos])


def _parse_item(reader: _Reader) -> ValueItem:
    if reader.peek() == '"':
        return ValueItem(reader.quoted(), quoted=True)
    return ValueItem(reader.bare(), quoted=False)


def _unknown_pass(name: str, registry: PluginRegistry) -> PipelineError:
    known = sorted(registry.passes)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    listing = ", ".join(known) if known else "none"
    return PipelineError(
        f"unknown pass '{name}'{hint}; known passes: {listing}{registry.load_error_hint()}"
    )


def build_passes(
    specs: Sequence[PassSpec], registry: PluginRegistry, _expanding: tuple[str, ...] = ()
) -> list[ModulePass]:
    """Instantiate each pass of ``specs`` from ``registry`` with typed options;
    a named pipeline's passes stand where it is named."""
    passes: list[ModulePass] = []
    for spec in specs:
        if spec.name not in registry.passes and spec.name in registry.pipelines:
            passes += _expand(spec, registry, _expanding)
            continue
        if spec.name not in registry.passes:
            raise _unknown_pass(spec.name, registry)
        pass_cls = registry.get_pass(spec.name)
        if not (isinstance(pass_cls, type) and issubclass(pass_cls, ModulePass)):
            owner = registry.owners.get(("passes", spec.name), "?")
            raise PipelineError(
                f"pass '{spec.name}' of plugin '{owner}' is not a subclass of "
                "xdsl.passes.ModulePass"
            )
        passes.append(build_pass(pass_cls, spec.name, spec.options))
    return passes


def _expand(
    spec: PassSpec, registry: PluginRegistry, expanding: tuple[str, ...]
) -> list[ModulePass]:
    if spec.options:
        raise PipelineError(f"named pipeline '{spec.name}' takes no options")
    if spec.name in expanding:
        raise PipelineError(
            f"named pipeline '{spec.name}' names itself: {' -> '.join((*expanding, spec.name))}"
        )
    named = registry.pipelines[spec.name]
    return build_passes(parse_pipeline_spec(named.text), registry, (*expanding, spec.name))


def parse_pipeline(text: str, registry: PluginRegistry) -> list[ModulePass]:
    """Parse ``text`` (MLIR or flat form) into pass instances from ``registry``."""
    return build_passes(parse_pipeline_spec(text), registry)


def format_pass(pass_: ModulePass) -> str:
    """``name{opt=value ...}`` with every option, or ``name`` for a pass without options."""
    options = format_pass_options(pass_)
    return f"{pass_.name}{{{options}}}" if options else pass_.name


def format_pipeline(passes: Sequence[ModulePass]) -> str:
    """The canonical MLIR form ``builtin.module(a,b{k=v})`` with all options spelled out."""
    return f"{ROOT_ANCHOR}({','.join(format_pass(p) for p in passes)})"
