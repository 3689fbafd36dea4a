"""The text of ``alpa-opt --list-passes``: each pass, its summary and its options."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

from alpa_ir.errors import AlpaError
from alpa_ir.passmanager.pass_options import OptionInfo, format_value, pass_options, type_text
from alpa_ir.passmanager.pass_source import read_pass_source
from alpa_ir.plugins.contributions import Lazy
from alpa_ir.plugins.registry import PluginRegistry

_WIDTH = 100


def pass_summary(cls: type) -> str:
    """The first line of the pass's docstring (dataclass-generated ones do not count)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        doc = ""
    lines = inspect.cleandoc(doc).splitlines()
    return lines[0].strip() if lines else "(no description)"


def _pass_text(entry: Any) -> tuple[str, tuple[OptionInfo, ...] | str]:
    """A registry entry's summary and options (or why they are unreadable): a
    lazy pass from its module's source, imported nothing; a class from itself."""
    try:
        if isinstance(entry, Lazy):
            source = read_pass_source(entry.module, entry.attribute)
            return source.summary, source.options
        return pass_summary(entry), pass_options(entry)
    except (AlpaError, OSError, SyntaxError) as err:
        return "(no description)", str(err)


def _option_lines(infos: tuple[OptionInfo, ...] | str) -> list[str]:
    if isinstance(infos, str):
        return [f"      (options unreadable: {infos})"]
    lines: list[str] = []
    for info in infos:
        if info.required:
            spec = f"{info.name}: {type_text(info.type)} (required)"
        else:
            try:
                default = format_value(info.default, info.type)
            except TypeError:
                default = repr(info.default)
            spec = f"{info.name}: {type_text(info.type)} = {default}"
        inline = f"      {spec}  -- {info.help}"
        if not info.help or len(inline) <= _WIDTH:
            lines.append(inline if info.help else f"      {spec}")
        else:  # a long help goes under the option, wrapped
            lines.append(f"      {spec}")
            lines.extend(
                textwrap.wrap(
                    info.help, _WIDTH, initial_indent=" " * 10, subsequent_indent=" " * 10
                )
            )
    return lines


def _heading(registry: PluginRegistry, table: str, name: str) -> str:
    """``  name``, with ``[plugin P]`` when a plugin, not the built-in one, gave it."""
    owner = registry.owners.get((table, name), "builtin")
    return f"  {name}" + ("" if owner == "builtin" else f"  [plugin {owner}]")


def format_pass_list(registry: PluginRegistry) -> str:
    """Every pass of ``registry`` by name: summary, owning plugin if not built in, options."""
    lines = [f"Available passes ({len(registry.passes)}):"]
    for name in sorted(registry.passes):
        summary, infos = _pass_text(registry.passes[name])
        lines.append(_heading(registry, "passes", name))
        lines.append(f"      {summary}")
        lines.extend(_option_lines(infos))
    if registry.pipelines:
        lines.append(f"Named pipelines ({len(registry.pipelines)}):")
        for name in sorted(registry.pipelines):
            named = registry.pipelines[name]
            lines.append(_heading(registry, "pipelines", name))
            lines.append(f"      {named.description}")
            lines.extend(textwrap.wrap(named.text, _WIDTH, initial_indent=" " * 6 + "= ",
                                       subsequent_indent=" " * 8))  # fmt: skip
    if registry.load_errors:
        lines.append("Plugins that failed to load: " + "; ".join(registry.load_errors))
    return "\n".join(lines) + "\n"
