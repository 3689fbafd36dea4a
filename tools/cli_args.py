"""Shared command-line pieces of alpa-bench, alpa-p2 and alpa-demo.

Every bad input gives one line on stderr that names the option and the value
(``alpa-bench: error: --gpus must be a positive integer, got '0'``) and a
non-zero exit status, before any expensive work starts: :class:`OneLineParser`
reports argparse's usage errors that way (no usage block, no traceback) and
rejects an option given twice with different values, and the type functions
below check a value as it is parsed.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

_INT = re.compile(r"\s*[+-]?[0-9]+\s*")
_ARGUMENT = re.compile(r"argument (?P<option>[^:]+): (?P<rest>.*)", re.DOTALL)


def one_line(message: str, argv: Sequence[str] = ()) -> str:
    """An argparse error message as one line that starts with the option:
    ``argument --gpus: must be ...`` becomes ``--gpus must be ...``; a missing
    value names the token that argparse took for an option (``--axes -4,-16``)."""
    message = " ".join(message.split())
    match = _ARGUMENT.fullmatch(message)
    if not match:
        return message
    option = match["option"].split("/")[0]
    rest = match["rest"]
    if rest == "expected one argument":
        after = _token_after(option, argv)
        if after is None:
            return f"{option} expects a value"
        return (
            f"{option} expects a value, got option-like {after!r} "
            f"(write {option}={after} for a value that starts with '-')"
        )
    if rest.startswith(("must ", "expects ", "given twice")):
        return f"{option} {rest}"
    return f"{option}: {rest}"


def _token_after(option: str, argv: Sequence[str]) -> str | None:
    """The option-like token that follows ``option`` (or an abbreviation of it)."""
    for k, token in enumerate(argv[:-1]):
        named = token == option or (len(token) > 2 and option.startswith(token))
        if named and argv[k + 1].startswith("-"):
            return argv[k + 1]
    return None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every default in ``--help`` (a ``None`` default is explained in the help
    text instead of printed), description and epilog as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:
            return action.help or ""
        return super()._get_help_string(action) or ""


class _Given:
    """What each option was given in one parse (to reject conflicting repeats)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[str, Any]] = {}

    def check(self, parser: argparse.ArgumentParser, dest: str, option: str, value: Any) -> None:
        if dest in self.values and self.values[dest][1] != value:
            first, old = self.values[dest]
            if isinstance(value, bool):
                parser.error(f"{first} and {option} contradict each other")
            parser.error(
                f"argument {option}: given twice with different values "
                f"({first} {_show(old)}, then {option} {_show(value)})"
            )
        self.values[dest] = (option, value)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, str) else str(value)


def _given(parser: argparse.ArgumentParser) -> _Given:
    given = getattr(parser, "_given", None)
    return given if isinstance(given, _Given) else _Given()


class _Store(argparse._StoreAction):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        _given(parser).check(parser, self.dest, option_string or self.dest, values)
        super().__call__(parser, namespace, values, option_string)


class BooleanOption(argparse.BooleanOptionalAction):
    """``--flag/--no-flag`` that rejects ``--flag --no-flag`` on one command line."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string in self.option_strings:
            value = not (option_string or "").startswith("--no-")
            _given(parser).check(parser, self.dest, option_string or self.dest, value)
        super().__call__(parser, namespace, values, option_string)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``prog: error: message``, exit 2),
    :class:`HelpFormatter`, an epilog computed only when ``--help`` asks for it
    (``epilog_fn``), and no option given twice with different values."""

    def __init__(
        self, *args: Any, epilog_fn: Callable[[], str] | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "store", _Store)
        self.register("action", None, _Store)
        self.epilog_fn = epilog_fn
        self._argv: list[str] = []
        self._given = _Given()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._argv = list(sys.argv[1:] if args is None else args)
        self._given = _Given()
        return super().parse_known_args(self._argv, namespace)

    def format_help(self) -> str:
        if self.epilog_fn is not None and self.epilog is None:
            self.epilog = self.epilog_fn()
        return super().format_help()

    def one_line(self, message: str) -> str:
        return one_line(message, self._argv)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {self.one_line(message)}\n")


# -- type functions: each raises ArgumentTypeError with "must ..., got 'text'" ------------


def _int(text: str, what: str) -> int:
    try:
        if _INT.fullmatch(text):
            return int(text)
    except ValueError:  # more digits than int() converts
        pass
    _bad(what, text)


def _bad(what: str, text: str) -> NoReturn:
    raise argparse.ArgumentTypeError(f"must be {what}, got {_clip(text)}") from None


def _clip(text: str, limit: int = 40) -> str:
    """``repr(text)``, shortened in the middle past ``limit`` characters."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[: limit // 2]) + "..." + repr(text[-limit // 2 :])


def positive_int(text: str) -> int:
    value = _int(text, "a positive integer")
    if value < 1:
        _bad("a positive integer", text)
    return value


def nonnegative_int(text: str) -> int:
    value = _int(text, "an integer >= 0")
    if value < 0:
        _bad("an integer >= 0", text)
    return value


def _float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        _bad(what, text)


def positive_finite_float(text: str) -> float:
    what = "a positive finite number"
    value = _float(text, what)
    if not (math.isfinite(value) and value > 0):
        _bad(what, text)
    return value


def nonnegative_finite_float(text: str) -> float:
    what = "a finite number >= 0"
    value = _float(text, what)
    if not (math.isfinite(value) and value >= 0):
        _bad(what, text)
    return value


def positive_seconds(text: str) -> float:
    """A time limit: a positive number of seconds, ``inf`` for none."""
    what = "a positive number of seconds (inf: no limit)"
    value = _float(text, what)
    if not value > 0:  # also nan
        _bad(what, text)
    return value


def int_list(text: str, what: str = "comma-separated integers") -> tuple[int, ...]:
    """Comma-separated integers (each with :func:`_int`'s syntax)."""
    try:
        return tuple(_int(p, what) for p in text.split(","))
    except argparse.ArgumentTypeError:
        _bad(what, text)


def positive_int_list(text: str) -> tuple[int, ...]:
    what = "comma-separated positive integers"
    values = int_list(text, what)
    if any(v < 1 for v in values):
        _bad(what, text)
    return values


def nonnegative_int_list(text: str) -> tuple[int, ...]:
    what = "comma-separated integers >= 0"
    values = int_list(text, what)
    if any(v < 0 for v in values):
        _bad(what, text)
    return values


__all__ = [
    "BooleanOption",
    "HelpFormatter",
    "OneLineParser",
    "int_list",
    "nonnegative_finite_float",
    "nonnegative_int",
    "nonnegative_int_list",
    "one_line",
    "positive_finite_float",
    "positive_int",
    "positive_int_list",
    "positive_seconds",
]
